"""One wrapper around ``paddle.static.Executor.run`` for fetch-time checks.

A rewrite that merges variables must stop a later fetch of a merged one from
silently returning another variable's data.  Adapters register a hook
``hook(program, fetch_list) -> fetch_list`` (raise to refuse the fetch,
return the list -- possibly translated -- to let it through);
:func:`add_hook` wraps ``Executor.run`` once per process, and the wrapper
passes every run's program (a ``CompiledProgram``'s inner program) and fetch
list through the hooks in registration order.  Programs no rewrite touched
pass through unchanged.

Normalize hooks ``hook(program, fetch_vars)`` (raise to refuse) run before
``paddle.static.normalize_program`` prunes a program to its fetch targets,
as every legacy ``save_inference_model`` / ``serialize_program`` does first:
a target the program no longer declares would otherwise be pruned to
nothing and Paddle's error would name a feed.

Feed hooks ``hook(program, feed)`` (raise to refuse) see every run's
program and feed (:mod:`memopt.paddle.guards.feed`: a feed of a renamed
variable).

Compiled hooks ``hook(compiled, program)`` (raise to refuse) see a
``CompiledProgram`` run: its ``BuildStrategy`` says which graph passes
Paddle will apply to the program.

Save hooks ``hook(fetch_vars)`` (raise to refuse) run before Paddle's PIR
``save_inference_model`` writes a model: a check that must happen while the
program still carries what a saved file cannot.  Serialize hooks
``hook(program)`` run, during that save, on the pruned program Paddle is
about to write (``paddle.core.serialize_pir_program``), to put back in it
what the pruning dropped.
"""
from __future__ import annotations

import functools
from typing import Callable, List

Hook = Callable[[object, object], object]

_HOOKS: List[Hook] = []
_SAVE_HOOKS: List[Callable[[object], None]] = []
_SERIALIZE_HOOKS: List[Callable[[object], None]] = []
_NORMALIZE_HOOKS: List[Hook] = []
_COMPILED_HOOKS: List[Callable[[object, object], None]] = []
_FEED_HOOKS: List[Callable[[object, object], None]] = []


def clear_hooks() -> None:
    """Forget every registered hook (:func:`memopt.paddle.guards.uninstall`,
    which also gives Paddle its functions back)."""
    for hooks in (_HOOKS, _SAVE_HOOKS, _SERIALIZE_HOOKS, _NORMALIZE_HOOKS, _COMPILED_HOOKS,
                  _FEED_HOOKS):
        hooks.clear()


def add_feed_hook(hook: Callable[[object, object], None]) -> None:
    """Register ``hook(program, feed)`` (once; raise to refuse) to run
    before every ``Executor.run`` with the program run and its feed."""
    if hook not in _FEED_HOOKS:
        _FEED_HOOKS.append(hook)
    _wrap()


def add_compiled_hook(hook: Callable[[object, object], None]) -> None:
    """Register ``hook(compiled, program)`` (once; raise to refuse) to run
    before ``Executor.run`` of a ``CompiledProgram`` (its build strategy
    decides which of Paddle's graph passes rewrite ``program``)."""
    if hook not in _COMPILED_HOOKS:
        _COMPILED_HOOKS.append(hook)
    _wrap()


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
        if inner is not None:
            for check in list(_COMPILED_HOOKS):
                check(target, inner)
        target = inner if inner is not None else target
        for check in list(_FEED_HOOKS):
            check(target, feed)
        for hook in list(_HOOKS):
            fetch_list = hook(target, fetch_list)
        return original(self, program, feed, fetch_list, *args, **kwargs)

    run.__memopt_hooks__ = True
    run.__memopt_original__ = original
    Executor.run = run


def add_serialize_hook(hook: Callable[[object], None]) -> None:
    """Register ``hook(program)`` (once) to run on the program PIR
    ``save_inference_model`` writes, right before it is written."""
    if hook not in _SERIALIZE_HOOKS:
        _SERIALIZE_HOOKS.append(hook)


def add_save_hook(hook: Callable[[object], None]) -> None:
    """Register ``hook(fetch_vars)`` (once) to run before every PIR
    ``save_inference_model`` (``paddle.static.io.save_inference_model_pir``,
    which ``paddle.static.save_inference_model`` calls for PIR programs)."""
    if hook not in _SAVE_HOOKS:
        _SAVE_HOOKS.append(hook)
    import paddle.static.io as io

    original = getattr(io, "save_inference_model_pir", None)
    if original is None or getattr(original, "__memopt_hooks__", False):
        return

    @functools.wraps(original)
    def save(path_prefix, feed_vars, fetch_vars, executor, **kwargs):
        for check in list(_SAVE_HOOKS):
            check(fetch_vars)
        import paddle

        core = paddle.core
        serialize = core.serialize_pir_program

        def serialize_with_hooks(program, *args, **kw):
            for hook in list(_SERIALIZE_HOOKS):
                hook(program)
            return serialize(program, *args, **kw)

        core.serialize_pir_program = serialize_with_hooks
        try:
            return original(path_prefix, feed_vars, fetch_vars, executor, **kwargs)
        finally:
            core.serialize_pir_program = serialize

    save.__memopt_hooks__ = True
    save.__memopt_original__ = original
    io.save_inference_model_pir = save


def add_normalize_hook(hook: Hook) -> None:
    """Register ``hook(program, fetch_vars)`` (once) to run before every
    ``paddle.static.normalize_program`` (``paddle.static.io``'s, which the
    legacy ``save_inference_model`` and ``serialize_program`` call, and
    ``paddle.static``'s own name for it)."""
    if hook not in _NORMALIZE_HOOKS:
        _NORMALIZE_HOOKS.append(hook)
    import paddle.static
    import paddle.static.io as io

    original = io.normalize_program
    if getattr(original, "__memopt_hooks__", False):
        return

    @functools.wraps(original)
    def normalize(program, feed_vars, fetch_vars, **kwargs):
        for check in list(_NORMALIZE_HOOKS):
            check(program, fetch_vars)
        return original(program, feed_vars, fetch_vars, **kwargs)

    normalize.__memopt_hooks__ = True
    normalize.__memopt_original__ = original
    io.normalize_program = normalize
    if paddle.static.normalize_program is original:
        paddle.static.normalize_program = normalize
