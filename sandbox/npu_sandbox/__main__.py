"""`python -m npu_sandbox`: the same as `npu-sandbox`."""

import sys

from npu_sandbox.cli import main

sys.exit(main())
