"""One wrapper around ``paddle.static.Executor.run`` for fetch-time checks.

A rewrite that merges variables must stop a later fetch of a merged one from
silently returning another variable's data.  Adapters register a hook
``hook(program, fetch_list) -> fetch_list`` (raise to refuse the fetch,
return the list -- possibly translated -- to let it through);
:func:`add_hook` wraps ``Executor.run`` once per process, and the wrapper
passes every run's program (a ``CompiledProgram``'s inner program) and fetch
list through the hooks in registration order.  Programs no rewrite touched
pass through unchanged.
"""
from __future__ import annotations

import functools
from typing import Callable, List

Hook = Callable[[object, object], object]

_HOOKS: List[Hook] = []


def add_hook(hook: Hook) -> None:
    """Register ``hook`` (once; registering it again does nothing) and make
    sure ``Executor.run`` is wrapped."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    _wrap()


def _wrap() -> None:
    from paddle.base.executor import Executor

    if getattr(Executor.run, "__memopt_hooks__", False):
        return
    original = Executor.run

    @functools.wraps(original)
    def run(self, program=None, feed=None, fetch_list=None, *args, **kwargs):
        target = program
        if target is None:
            import paddle

            target = paddle.static.default_main_program()
        inner = getattr(target, "_program", None)  # a CompiledProgram wraps one
        target = inner if inner is not None else target
        for hook in list(_HOOKS):
            fetch_list = hook(target, fetch_list)
        return original(self, program, feed, fetch_list, *args, **kwargs)

    run.__memopt_hooks__ = True
    run.__memopt_original__ = original
    Executor.run = run
