"""`python -m npu_runtime.serving.headless ARGS`: a headless vLLM engine for a multi-node replica's worker.

vLLM runs the engines of a data-parallel worker node with `vllm serve --headless` (no API
server; vllm/entrypoints/cli/serve.py `run_headless`). `python -m vllm.entrypoints.openai.api_server`
accepts --headless but ignores it and starts an API server whose engine the leader then refuses
("Remote engine 1 must use --headless"), and the `vllm` command itself is not usable on every
build (the CPU distribution's metadata is not named vllm). This entry point parses the arguments
with the API server's own parser and calls vLLM's `run_headless`, on the builds we target
(vLLM 0.23 and 0.31 layouts). vLLM is imported only when run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

# Where make_arg_parser lives: vLLM 0.31 (launchers) first, then the older openai package.
_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")


def _make_arg_parser() -> Any:
    for name in _PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "make_arg_parser"):
            return module.make_arg_parser
    raise ImportError(f"vLLM's make_arg_parser is in none of {', '.join(_PARSER_MODULES)}")


def main(argv: Sequence[str] | None = None) -> int:
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.utils import argparse_utils

    parser_class: Any = argparse_utils.FlexibleArgumentParser  # untyped in vLLM
    parser = _make_arg_parser()(parser_class(description="vLLM headless data-parallel engines"))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.headless:
        print("npu_runtime.serving.headless: --headless is required", file=sys.stderr)
        return 2
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    args.api_server_count = 0  # vllm serve's default in headless mode
    run_headless(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
