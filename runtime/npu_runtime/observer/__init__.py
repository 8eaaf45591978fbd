"""The graph observer: a vLLM general plugin (entry point `vllm.general_plugins: npu_graph_observer`).

vLLM calls `register()` in every process that loads plugins: the API server, the engine core and
each worker. In each it first asks Linux for the AMX permission that vLLM's CPU kernels need and
do not ask for (`cpu_amx`; nothing off x86-64 or without AMX). Beyond that it does nothing unless
`npu-runtime serve` started the engine (it sets NPU_GRAPH_OBSERVER_DIR), so installing this package
in an engine image changes nothing else for a plain `vllm serve`. Otherwise it arranges hooks on
the classes that exist in this engine (`vllm_hooks`), each patched when its module is imported,
and never raises.

No device work and no torch/vllm imports here: those happen inside hooks, at first use.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from npu_runtime import cpu_amx, reports
from npu_runtime.observer.batches import HALF_LIFE_SECONDS
from npu_runtime.observer.recorder import Recorder

log = logging.getLogger("npu_runtime.observer")

_lock = threading.Lock()
_registered = False
_recorder: Recorder | None = None


def enabled(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(reports.ENV_DIR)) and env.get(reports.ENV_ENABLED, "1").lower() not in ("0", "false", "off")


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def register() -> None:
    """vLLM's plugin entry point: idempotent, cheap, never raises."""
    global _registered, _recorder
    with _lock:
        if _registered:
            return
        _registered = True
        _request_amx_permission()
        if not enabled():
            return
        try:
            from npu_runtime.observer import vllm_hooks
            from npu_runtime.observer.process_observer import Observer

            vllm = sys.modules.get("vllm")
            recorder = Recorder(
                os.environ[reports.ENV_DIR],
                vllm_version=getattr(vllm, "__version__", None),
                flush_seconds=max(0.05, _float_env(reports.ENV_FLUSH_SECONDS, 1.0)),
                batch_half_life_seconds=_float_env(reports.ENV_BATCH_HALF_LIFE_SECONDS, HALF_LIFE_SECONDS),
            )
            observer = Observer(recorder, sample_every=int(_float_env(reports.ENV_SAMPLE_EVERY, 1)))
            _recorder = recorder
            os.register_at_fork(after_in_child=recorder.after_fork_in_child)
            vllm_hooks.install(observer)
            recorder.flush()
        except Exception:
            log.warning("npu graph observer: not installed; the engine runs without it", exc_info=True)


def _request_amx_permission() -> None:
    try:
        refusal = cpu_amx.request_permission()
    except Exception:
        log.warning("AMX permission: not asked for", exc_info=True)
        return
    if refusal:
        log.warning("AMX permission %s", refusal)


def recorder() -> Recorder | None:
    """This process's recorder, once `register()` has installed the observer."""
    return _recorder
