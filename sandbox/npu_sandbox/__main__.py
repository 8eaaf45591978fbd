"""`python -m npu_sandbox`: the same as `npu-sandbox`."""

import sys

from npu_sandbox.demo.cli import main

sys.exit(main())
