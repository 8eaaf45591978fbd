"""Hook machinery: wrap a method so that our code can fail without the engine noticing.

- `Hook`: one named instrumentation point. Its first failure disables it for the rest of the
  process, counts `npu_graph_instrumentation_errors_total{hook}`, and logs once; so does a
  refusal (`refuse`: what the hook reads is not there), which also lists it as unavailable.
- `wrap_method`: replace `cls.attr` (a plain function defined on that class) by a wrapper,
  idempotently; the wrapper keeps the original in `__wrapped__`.
- `around`: the usual wrapper: `before` and `after` run in try blocks, the original outside
  them, so the engine's own exceptions pass through untouched and ours never escape.
- `when_imported`: run a callback on a module as soon as it is imported (or now, if it is
  already), so that worker-only modules are patched in workers and never imported elsewhere.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final, cast

log = logging.getLogger("npu_runtime.observer")

MARK: Final = "__npu_graph_observer__"


class Hook:
    """A named hook that disables itself on its first failure."""

    def __init__(
        self,
        name: str,
        on_error: Callable[[str], None] | None = None,
        on_unavailable: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.disabled = False
        self.on_error = on_error
        self.on_unavailable = on_unavailable

    def refuse(self, reason: str) -> None:
        """What the hook reads is missing: disable, count, report it unavailable with `reason`. Never raises."""
        try:
            if self.disabled:
                return
            self.disabled = True
            log.warning("npu graph observer: hook %r cannot bind (%s); the engine is unaffected", self.name, reason)
            if self.on_error is not None:
                self.on_error(self.name)
            if self.on_unavailable is not None:
                self.on_unavailable(f"{self.name}: {reason}")
        except Exception:
            pass

    def fail(self) -> None:
        """Call from an `except` block: disable, count, log once. Never raises.

        An AttributeError (an engine object without an attribute the hook reads, found at its
        first use) also lists the hook as unavailable, with the attribute's name.
        """
        try:
            if self.disabled:
                return
            self.disabled = True
            log.warning(
                "npu graph observer: hook %r failed and is now disabled; the engine is unaffected",
                self.name,
                exc_info=True,
            )
            if self.on_error is not None:
                self.on_error(self.name)
            error = sys.exc_info()[1]
            if isinstance(error, AttributeError) and self.on_unavailable is not None:
                self.on_unavailable(f"{self.name}: {error}")
        except Exception:
            pass


def wrap_method(cls: type, attr: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Wrap the function `attr` defined on `cls` itself; False when there is none to wrap."""
    original = cls.__dict__.get(attr)
    if original is None or not inspect.isfunction(original):
        return False
    if getattr(original, MARK, False):
        return True
    wrapper = make_wrapper(original)
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, MARK, True)
    setattr(cls, attr, wrapper)
    return True


class _Reentry(threading.local):
    def __init__(self) -> None:
        self.active: set[str] = set()


_reentry = _Reentry()


def around(
    hook: Hook,
    original: Callable[..., Any],
    before: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None = None,
    after: Callable[[Any, tuple[Any, ...], dict[str, Any], Any, Any], None] | None = None,
    *,
    outermost_only: bool = False,
    require: Sequence[str] = (),
) -> Callable[..., Any]:
    """A method wrapper calling `before(self, args, kwargs) -> ctx` and `after(self, args, kwargs, ctx, result)`.

    With `outermost_only`, a call nested in another call of the same hook (a subclass override
    calling `super()`, both wrapped) runs the original alone, so nothing is counted twice.
    `require`: attributes the hook reads on `self`, checked at the first call; one missing makes
    the hook refuse (it never reads).
    """
    name = hook.name
    unchecked = [bool(require)]

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.disabled:
            return original(self, *args, **kwargs)
        if unchecked[0]:
            unchecked[0] = False
            missing = [attr for attr in require if not hasattr(self, attr)]
            if missing:
                hook.refuse(f"{type(self).__name__} has no attribute {missing[0]}")
                return original(self, *args, **kwargs)
        if outermost_only:
            active = _reentry.active
            if name in active:
                return original(self, *args, **kwargs)
        ctx = None
        if before is not None:
            try:
                ctx = before(self, args, kwargs)
            except Exception:
                hook.fail()
                return original(self, *args, **kwargs)
        if outermost_only:
            active.add(name)
            try:
                result = original(self, *args, **kwargs)
            finally:
                active.discard(name)
        else:
            result = original(self, *args, **kwargs)
        if after is not None and not hook.disabled:
            try:
                after(self, args, kwargs, ctx, result)
            except Exception:
                hook.fail()
        return result

    return wrapper


# ----- run code when a module is imported -----

ModuleCallback = Callable[[ModuleType], None]


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then chains our callbacks after exec_module."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[ModuleCallback]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callbacks = self.callbacks.pop(fullname, None)
        if not callbacks:
            return None
        spec: importlib.machinery.ModuleSpec | None = None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = cast("importlib.machinery.ModuleSpec | None", find_spec(fullname, path, target))
            if spec is not None:
                break
        loader: Any = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec

        def exec_then_callbacks(module: ModuleType) -> None:
            exec_module(module)
            _run_callbacks(module, callbacks)

        try:
            loader.exec_module = exec_then_callbacks
        except Exception:
            return spec
        return spec


_finder: _PostImportFinder | None = None
_finder_lock = threading.Lock()


def _run_callbacks(module: ModuleType, callbacks: list[ModuleCallback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception:
            log.warning("npu graph observer: patching %s failed", module.__name__, exc_info=True)


def when_imported(module_name: str, callback: ModuleCallback) -> None:
    """Call `callback(module)` now if `module_name` is imported, else right after its import."""
    module = sys.modules.get(module_name)
    if module is not None:
        _run_callbacks(module, [callback])
        return
    global _finder
    with _finder_lock:
        if _finder is None or _finder not in sys.meta_path:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)
        _finder.callbacks.setdefault(module_name, []).append(callback)
