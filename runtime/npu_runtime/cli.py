"""`npu-runtime`: the pod runtime's command line.

    npu-runtime probe [--json]
    npu-runtime plan --model PATH [planner options] [--json]
    npu-runtime fetch --hub H --repo ID --cache DIR [...] [--plan planner options]   (npu_runtime.fetch.download)
    npu-runtime serve --model PATH [serve and planner options] [-- engine args]   (npu_runtime.serving.serve)
    npu-runtime doctor [--json] [--no-device]   (npu_runtime.doctor; exit 4: the observer would be blind)
    npu-runtime route --prefill URL --decode URL [...]   (npu_runtime.routing.serve: prefill/decode pairs)

Exit status: 0 on success, 2 on invalid input (the message on stderr names the field), 3 when
the model cannot fit the device. Subcommands are looked up in `COMMANDS` (name -> "module:function",
imported only when run, so `plan` stays fast); each function takes the arguments after the
subcommand's name and returns the exit status. Adding `serve` is one line in that table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

from npu_runtime.contract import add_plan_arguments, format_gib, option_name, plan_options_from_args

EXIT_OK: Final = 0
EXIT_INVALID: Final = 2
EXIT_DOES_NOT_FIT: Final = 3

# name -> ("module:function", one-line help). The function gets argv after the name, returns the exit code.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "probe": ("npu_runtime.cli:probe_command", "show the accelerator this pod sees"),
    "plan": ("npu_runtime.cli:plan_command", "plan graph mode, capture sizes and memory for a model"),
    "fetch": ("npu_runtime.fetch.download:fetch_command", "download a model repository into the shared cache, once"),
    "serve": ("npu_runtime.fetch.adapters:serve_command", "plan, start vLLM with the plan, report what the engine did"),
    "doctor": ("npu_runtime.doctor:doctor_command", "engine versions, CANN, observer hooks, plugin, device"),
    "route": ("npu_runtime.routing.serve:route_command", "send each completion to a prefill, then a decode engine"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        _usage(sys.stdout if args else sys.stderr)
        return EXIT_OK if args else EXIT_INVALID
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(
            f"npu-runtime: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})",
            file=sys.stderr,
        )
        return EXIT_INVALID
    module_name, _, function_name = COMMANDS[name][0].partition(":")
    command: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function_name)
    try:
        return command(rest)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID


def _usage(stream: Any) -> None:
    print("usage: npu-runtime {" + ",".join(COMMANDS) + "} ...\n", file=stream)
    for name, (_, help_text) in COMMANDS.items():
        print(f"  {name:<8}{help_text}", file=stream)


def probe_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="npu-runtime probe", description="Show the accelerator this pod sees.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from npu_runtime.planner.probe import probe_device

    device = probe_device()
    if args.json:
        print(json.dumps(dataclasses.asdict(device)))
    else:
        free = "unknown" if device.free_bytes is None else format_gib(device.free_bytes)
        print(f"{device.count} x {device.name} ({device.kind}), {format_gib(device.total_bytes)} each, {free} free")
        print(f"found by: {device.source}")
    return EXIT_OK


def plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime plan",
        description="Plan vLLM's graph mode, capture sizes and memory for a model on this (or a described) device.",
    )
    parser.add_argument("--model", required=True, help="model directory or its config.json")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    add_plan_arguments(parser)
    return parser


def plan_command(argv: list[str]) -> int:
    args = plan_parser().parse_args(argv)
    from npu_runtime.planner.config_fields import ModelError
    from npu_runtime.planner.plan import DoesNotFitError, PlanError, plan_for

    try:
        plan = plan_for(plan_options_from_args(args), args.model)
    except ModelError as exc:
        return _fail(EXIT_INVALID, f"model: {exc}")
    except PlanError as exc:
        return _fail(EXIT_INVALID, f"{option_name(exc.field)}: {exc.message}")
    except DoesNotFitError as exc:
        return _fail(EXIT_DOES_NOT_FIT, f"does not fit: {exc}")
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print(render_plan(plan.to_dict()))
    return EXIT_OK


def _fail(code: int, message: str) -> int:
    print(f"npu-runtime plan: error: {message}", file=sys.stderr)
    return code


def render_plan(plan: dict[str, Any]) -> str:
    """The readable form of a plan: mode, sizes, memory breakdown, streams, downgrades, warnings."""
    memory, streams, device, model = plan["memory"], plan["streams"], plan["device"], plan["model"]
    lines = [
        f"model     {model['architecture']} ({model['path']}), {model['num_layers']} layers, {plan['dtype']}",
        f"device    {device['count']} x {device['name']} ({device['kind']}, {device['source']}), "
        f"tensor parallel {plan['tensor_parallel']}",
        *_layout_lines(plan["layout"]),
        f"mode      {plan['requested_mode']} -> {plan['effective_mode']} (resolved by {plan['mode_resolved_by']})",
        f"sizes     {len(plan['capture_sizes'])}: {_short_list(plan['capture_sizes'])} (what vllm-ascend "
        f"{plan['engine_release']} captures of them{', flashcomm1' if plan['flashcomm1'] else ''}; "
        f"its own default: {_short_list(plan['engine_default_sizes'])})",
        f"decode    max_num_seqs {plan['max_num_seqs']} x {plan['decode_query_len']} tokens, "
        f"max_model_len {plan['max_model_len']}",
        "",
        "memory per device",
    ]
    for label, key in (
        ("weights", "weights_bytes"),
        ("activation", "activation_bytes"),
        ("graphs", "graph_bytes"),
        ("kv cache", "kv_cache_bytes"),
        ("margin", "margin_bytes"),
        ("budget", "budget_bytes"),
        ("total", "total_bytes"),
    ):
        lines.append(f"  {label:<11}{format_gib(memory[key]):>12}")
    lines.append(
        f"  weights from {memory['weights_source']}; kv cache {memory['kv_cache_tokens']} tokens; "
        f"--gpu-memory-utilization {memory['engine_gpu_memory_utilization']:g} (graphs reserved by "
        f"{memory['graph_reserved_by']})"
    )
    if streams["applies"]:
        lines.append(
            f"streams   {streams['estimate']} of {streams['budget']} ({streams['formula']}; HCCL "
            f"{streams['hccl_op_expansion_mode']}; budget set by {streams['enforced_by']})"
        )
    for downgrade in plan["downgrades"]:
        lines.append(f"downgrade {downgrade['reason']}: {downgrade['message']}")
    for warning in plan["warnings"]:
        lines.append(f"warning   {warning}")
    lines += ["", "vllm args " + " ".join(plan["vllm_args"])]
    return "\n".join(lines)


def _layout_lines(layout: dict[str, Any]) -> list[str]:
    """The per-rank layout: DP x TP x PP, the MoE split, and what each node runs."""
    line = (
        f"layout    DP {layout['data_parallel']} x TP {layout['tensor_parallel']} x PP {layout['pipeline_parallel']}"
        f" over {layout['nodes']} node(s) of {layout['devices_per_node']} devices"
    )
    if layout["moe_ranks"] > 1:
        split = f"EP {layout['ep_size']}" if layout["expert_parallel"] else f"TP {layout['moe_tensor_parallel']}"
        line += f"; experts over {layout['moe_ranks']} ranks ({split}, {layout['experts_per_rank']} per device)"
    lines = [line]
    if layout["nodes"] > 1:
        for share in layout["per_node"]:
            ranks = share["data_parallel_ranks"]
            lines.append(
                f"  node {share['node']}  {share['role']:<6} DP ranks {ranks[0]}..{ranks[-1]} on {share['devices']} "
                f"devices" + (" + API server" if share["role"] == "leader" else " (--headless)")
            )
    return lines


def _short_list(values: list[int]) -> str:
    if len(values) <= 12:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[:6])) + ", ..., " + ", ".join(map(str, values[-3:]))


if __name__ == "__main__":
    sys.exit(main())
