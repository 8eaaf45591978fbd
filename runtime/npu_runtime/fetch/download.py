"""`npu-runtime fetch`: a model repository from Hugging Face or ModelScope into the shared cache, once.

Runs as the pod's init container (the runtime image), before `npu-runtime serve`:

    npu-runtime fetch --hub huggingface --repo Qwen/Qwen2.5-7B-Instruct [--revision REV] \
        --cache /models [--allow PATTERN]... [--ignore PATTERN]... [--endpoint URL] --link /run/npu-model/model \
        [--adapters FILE]
    npu-runtime fetch --adapters FILE      (only the LoRA adapters of the list: a model from a claim)

After the model, `--adapters` fetches the hub adapters of a LoRA adapter list (`npu_runtime.adapters`)
into the list's cache, each as the model is (`fetch.adapters`); one that fails is reported on
/status (`adapters`) and in the termination line, and does not fail the init container.

The download itself is the hub's own client library (`huggingface_hub.snapshot_download`,
`modelscope.snapshot_download`): their cache layout, their resume with HTTP Range (both within a
process; modelscope also across processes, huggingface_hub 1.x never reuses a killed process's
partial file, which the next holder of the lock removes), their retries. The fetch adds what a
shared cache volume needs around them:

- **A hub is untrusted input** (`listing`): the revision is resolved to a commit (40 hex digits,
  both hubs), every listed path must be relative and inside the snapshot, and this is checked
  before anything is written, linked or deleted. Files are handed to the library as names, not
  patterns. A Hugging Face body longer than its listed size is cut off while it streams (the
  modelscope library stops at the listed size itself).
- **Cache keyed by endpoint** (`layout`): each endpoint has its own folder under `<cache>/<hub>/`,
  so one endpoint's answers never reach the files another endpoint's resources serve.
- **One download per repository at a time.** A file lock on the cache volume
  (`<cache>/.npu/locks/<hub>/<endpoint key>/<owner>--<name>.lock`) covers the repository's blobs.
  The first replica downloads; the others wait on the lock (showing the holder's progress,
  which it writes beside the lock) and find the revision complete. A lock, not a Job per
  revision: no extra controller, objects or RBAC, and it works for every resource and replica
  that mounts the same volume, across namespaces' PVCs that bind one volume. The kernel drops
  the lock when its holder dies, so a killed pod never blocks the next one, which takes the
  download over; a waiter gives up after `--lock-timeout` seconds in which the holder's
  progress did not move.
- **Complete means checked**, and checked while the bytes arrive (`verify`). Every file's size and
  hash must match the hub's listing (sha256 for LFS files and every ModelScope file, the git blob
  sha1 for the rest): a Hugging Face body is hashed as the library reads it (the check on its
  HTTP client) and a wrong one raises before the library keeps it; modelscope_hub hashes what it
  streams against the sha256 and size this fetch's listing hands it. Only what neither covered
  (a file already in the cache, a body compressed or resumed elsewhere than where its hash was, a
  client version without the seams) is hashed from disk after the download. A file that does not
  match is fetched again once; twice wrong is `ModelHashMismatch`. Files in the snapshot that
  the listing does not name are removed. Only then is the marker
  `<repo folder>/.npu-complete/<commit>.json` written; later pods trust it when the hub's
  listing still matches it and every file is still there with its size.
- **A snapshot is never rewritten for a commit it already holds.** A hub that lists other sizes
  or hashes under a commit the marker records (a commit names its bytes) is ModelHashMismatch:
  nothing is downloaded, removed or re-linked, and the replicas that link the snapshot keep it.
- **A branch is a commit.** Both hubs' branches and tags are resolved to the commit they point
  at, and the snapshot is that commit's: a branch that moves makes a new snapshot, never a
  rewritten one under a running replica. The operator resolves a branch once per rollout: the
  rollout's first pods fetch with `--hold` (fetch, report the commit on /status, never exit),
  and every pod after them gets the commit they reported as `--revision`.
- **config.json first**, so the model can be planned (`--plan` runs `npu-runtime plan` with
  the given flags) before gigabytes of weights arrive: a model that cannot fit fails in seconds.
- **Progress** (`--status-port`, on `--status-host`, all addresses by default): `/status` answers
  `{"model": {...}}` with the phase, bytes done/total and files, which the operator folds into
  `status.model`. The bytes done are the verified ones: files whose hash matched, and the hashed
  part of the files in flight.
- **The end** is one line in the termination message: `ModelReady: {...}` (the final progress,
  resolved revision included), or `<Reason>: <message>` naming the repository, also on stderr:
  ModelAccessDenied (401/403), ModelNotFound (repository, revision or file), ModelCacheFull (no
  space on the cache volume), ModelHashMismatch, ModelDownloadFailed.

The token comes from the environment variable `NPU_MODEL_TOKEN` (a Secret, set by the operator
with `valueFrom`), is handed to the library only, and is never printed.

This module is the command line; the fetch itself is `driver`, each hub one module behind the
`Hub` interface (`hub`): `huggingface` (with the check on its HTTP client and the `bodies` it
expects) and `modelscope`; `disk` hashes and prunes a snapshot's files, `progress` reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Final

from npu_runtime.adapters import AdapterListError, read_adapter_list
from npu_runtime.fetch import adapters as fetch_adapters
from npu_runtime.fetch.driver import OnConfig, fetch
from npu_runtime.fetch.hub import (
    ACCESS_DENIED,
    CONFIG_FILE,
    DEFAULT_LOCK_TIMEOUT,
    HUBS,
    NOT_FOUND,
    FetchError,
    FetchOptions,
)
from npu_runtime.fetch.hubs import TOKEN_ENV, hub_for
from npu_runtime.fetch.progress import Progress, StatusServer
from npu_runtime.serving import failures
from npu_runtime.serving.failures import Failure, write_termination_message

__all__ = ["TOKEN_ENV", "fetch_command", "hub_for", "link_snapshot"]
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
READY: Final = "ModelReady"  # the success line: `ModelReady: {progress as JSON}`
ADAPTERS_READY: Final = "AdaptersReady"  # `fetch --adapters FILE` alone: `AdaptersReady: {"adapters": [...]}`

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INVALID: Final = 2  # access denied, not found: retrying does not help
EXIT_DOES_NOT_FIT: Final = 3  # as `npu-runtime plan`
# Besides its own reasons, a fetch that plans ends with the planner's (they are the runtime's failures).
PLAN_REASONS: Final = (failures.MODEL_DOES_NOT_FIT, failures.INVALID_CONFIGURATION, failures.MODEL_INVALID)
EXIT_CODES: Final = {
    ACCESS_DENIED: EXIT_INVALID,
    NOT_FOUND: EXIT_INVALID,
    failures.INVALID_CONFIGURATION: EXIT_INVALID,
    failures.MODEL_INVALID: EXIT_INVALID,
    failures.MODEL_DOES_NOT_FIT: EXIT_DOES_NOT_FIT,
}


def fetch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime fetch",
        description="Download a model repository into the shared cache (once per revision) and link it.",
    )
    parser.add_argument("--hub", choices=HUBS, help="the model's hub (required with --repo)")
    parser.add_argument("--repo", help="repository id, e.g. Qwen/Qwen2.5-7B-Instruct")
    parser.add_argument("--revision", help="branch, tag or commit (default: the hub's main branch)")
    parser.add_argument("--cache", type=Path, help="the cache volume's mount path (required with --repo)")
    parser.add_argument(
        "--adapters",
        metavar="FILE",
        help="then fetch the hub adapters of this LoRA adapter list into its cache; alone: only them",
    )
    parser.add_argument("--allow", action="append", default=[], metavar="PATTERN", help="only matching files")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATTERN", help="skip matching files")
    parser.add_argument("--endpoint", help="the hub's URL (a mirror); default: the library's")
    parser.add_argument(
        "--send-token-over-http",
        action="store_true",
        help="hand the token to a plain http:// endpoint too (by default only https:// endpoints get it)",
    )
    parser.add_argument("--link", type=Path, help="make this path a symlink to the snapshot directory")
    parser.add_argument("--status-port", type=int, help="serve /status with the progress on this port")
    parser.add_argument("--status-host", default="0.0.0.0", help="the address the status port listens on")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=DEFAULT_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="give up waiting for another download of the repository after this long without its progress moving",
    )
    parser.add_argument(
        "--hold",
        action="store_true",
        help="after the fetch, keep serving /status and never exit: a pod that only resolves the branch of a "
        "rollout (the operator pins the commit it reports, then replaces the pod)",
    )
    parser.add_argument("--termination-message-path", default=DEFAULT_TERMINATION_LOG)
    parser.add_argument(
        "--plan",
        nargs=argparse.REMAINDER,
        help="after config.json arrives, run `npu-runtime plan` with these flags; stop if the model cannot fit",
    )
    return parser


def fetch_command(argv: list[str]) -> int:
    parser = fetch_parser()
    args = parser.parse_args(argv)
    if args.repo is None and args.hub is None and args.adapters is None:
        parser.error("--hub and --repo (a model), --adapters (a LoRA adapter list), or both are required")
    if (args.repo is None) != (args.hub is None) or (args.repo is not None and args.cache is None):
        parser.error("--hub, --repo and --cache go together (the model's fetch)")
    try:
        adapters = read_adapter_list(args.adapters) if args.adapters is not None else None
    except AdapterListError as exc:
        return _invalid(args, f"--adapters: {exc}")
    listed = [fetch_adapters.adapter_progress(a) for a in fetch_adapters.hub_adapters(adapters)] if adapters else []
    progress = Progress(source=args.hub, repository=args.repo, revision=args.revision) if args.repo else None
    server = StatusServer(progress, args.status_port, args.status_host, listed) if args.status_port else None
    try:
        if progress is not None:
            code = _fetch_model(args, progress)
            if code != EXIT_OK:
                return code
        if adapters is not None:
            fetch_adapters.fetch_listed(adapters, listed)
    finally:
        if server is not None and not args.hold:
            server.close()
    # The kubelet keeps a finished container's termination message too: the operator learns the
    # resolved revision and the figures from it even when the download took less than a poll.
    _write_result(args.termination_message_path, progress, listed)
    if args.hold:
        # The serving container must not start on a commit only this pod resolved: /status says which
        # commit it is, the operator pins it into the pod template, and the pod is replaced (SIGTERM).
        revision = progress.revision if progress is not None else None
        print(f"npu-runtime fetch: holding until the pod is replaced (the rollout pins {revision})", flush=True)
        while True:
            time.sleep(3600)
    return EXIT_OK


def _invalid(args: argparse.Namespace, message: str) -> int:
    write_termination_message(
        Failure(failures.INVALID_CONFIGURATION, message),
        args.termination_message_path,
        default_path=DEFAULT_TERMINATION_LOG,
    )
    return EXIT_INVALID


def _fetch_model(args: argparse.Namespace, progress: Progress) -> int:
    """The model's fetch (and link, and plan); its exit status."""
    options = FetchOptions(
        hub=args.hub,
        repo=args.repo,
        revision=args.revision,
        cache=args.cache,
        allow=tuple(args.allow),
        ignore=tuple(args.ignore),
        endpoint=args.endpoint,
        token=os.environ.get(TOKEN_ENV) or None,
        link=args.link,
        lock_timeout=args.lock_timeout,
    )
    plain = options.endpoint is not None and not options.endpoint.startswith("https://")
    if options.token and plain and not args.send_token_over_http:
        return _invalid(args, f"--endpoint {options.endpoint} is not https://; the token is not sent in clear text")
    started = time.monotonic()
    try:
        hub = hub_for(options.hub)
        on_config = _planner(args.plan) if args.plan is not None else None
        snapshot = fetch(options, hub, progress, on_config=on_config)
        if options.link is not None:
            link_snapshot(options.link, snapshot)
    except FetchError as exc:
        progress.phase, progress.reason, progress.message = "Failed", exc.reason, exc.message
        write_termination_message(
            Failure(exc.reason, exc.message), args.termination_message_path, default_path=DEFAULT_TERMINATION_LOG
        )
        return EXIT_CODES.get(exc.reason, EXIT_FAILED)
    seconds = time.monotonic() - started
    print(
        f"npu-runtime fetch: {options.repo}@{progress.revision}: {progress.files_total} files, "
        f"{progress.bytes_total} bytes ready in {seconds:.1f}s at {snapshot}",
        flush=True,
    )
    return EXIT_OK


def _write_result(path: str, progress: Progress | None, adapters: list[Progress]) -> None:
    """`ModelReady: {the model's progress}`, with "adapters" (each one's progress) after --adapters;
    `AdaptersReady: {"adapters": [...]}` when only adapters were fetched."""
    target = Path(path)
    if path == DEFAULT_TERMINATION_LOG and not target.exists():
        return
    document = progress.to_dict() if progress is not None else {}
    if adapters:
        document["adapters"] = [item.to_dict() for item in adapters]
    line = f"{READY if progress is not None else ADAPTERS_READY}: {json.dumps(document, sort_keys=True)}\n"
    with contextlib.suppress(OSError):
        target.write_text(line, encoding="utf-8")


def link_snapshot(link: Path, snapshot: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(snapshot.resolve() if not snapshot.is_absolute() else snapshot, target_is_directory=True)
    os.replace(tmp, link)


def _planner(flags: list[str]) -> OnConfig:
    """Called with the snapshot once config.json is there: plans it, and stops the fetch when it cannot fit."""
    flags = flags[1:] if flags and flags[0] == "--" else flags

    def check(snapshot: Path) -> None:
        from npu_runtime.cli import plan_parser, render_plan
        from npu_runtime.contract import option_name, plan_options_from_args
        from npu_runtime.planner.config_fields import ModelError
        from npu_runtime.planner.plan import DoesNotFitError, PlanError, plan_for

        args = plan_parser().parse_args(["--model", str(snapshot / CONFIG_FILE), *flags])
        try:
            plan = plan_for(plan_options_from_args(args), args.model)
        except DoesNotFitError as exc:
            raise FetchError(failures.MODEL_DOES_NOT_FIT, f"planned from config.json: {exc}") from exc
        except PlanError as exc:
            raise FetchError(failures.INVALID_CONFIGURATION, f"{option_name(exc.field)}: {exc.message}") from exc
        except ModelError as exc:
            raise FetchError(failures.MODEL_INVALID, f"config.json: {exc}") from exc
        print(render_plan(plan.to_dict()), flush=True)

    return check
