"""The one step every patch takes: bind a target's parameters, then wrap its method (or refuse it)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from npu_runtime.observer import targets
from npu_runtime.observer.hooks import wrap_method
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.targets import BindError, Binding, Target

MakeWrapper = Callable[[Callable[..., Any], Binding], Callable[..., Any]]


def patch_target(observer: Observer, cls: type, target: Target, make: MakeWrapper) -> bool:
    """Wrap `cls.<target.method>` if `cls` defines it; False when it does not (nothing to hook here).

    The parameters the hook reads are bound by name first: when one is missing or moved the hook
    refuses (unavailable with the reason, one instrumentation error) and the method stays as it is.
    """
    what = f"{cls.__module__}.{cls.__qualname__}.{target.method}"
    original = cls.__dict__.get(target.method)
    if original is None or not inspect.isfunction(original):
        return False
    try:
        binding = targets.bind(original, target.params)
    except BindError as exc:
        observer.refuse(target.hook, what, str(exc))
        return True
    if wrap_method(cls, target.method, lambda function: make(function, binding)):
        observer.installed(what)
    return True
