"""``memory_optimize`` on a ``paddle.jit.to_static`` step: every training program it builds, rewritten.

A *step* here is what ``paddle.jit.to_static`` returned: a ``StaticFunction``
(of a function or of a Layer's ``forward``; ``full_graph=True`` or SOT, the
default) or a Layer converted in place (its ``forward`` is one).
:func:`optimize_step` installs memopt on it and returns a
:class:`StepOptimization`; from then on every training program Paddle builds
for the step -- one per input signature, one per SOT subgraph, and again
after ``.train()`` -- is rewritten by the PIR path of ``memory_optimize``
before its first run (:mod:`memopt.paddle.dygraph.hook`).  Inference
programs (``.eval()``) are not touched.

How programs are found: ``ProgramCache._build_once`` (where Paddle registers
its own hookers) is wrapped once per process while some step is optimized;
a program built by a registered full-graph step's cache, or by any cache
during a call of a registered SOT step (SOT compiles each subgraph with a
``full_graph`` to_static of its own, inside the step's call), gets memopt's
hooker.  A program built but not yet run (``get_concrete_program``) gets it
too.  Removal (:meth:`StepOptimization.remove`) unregisters the step and
drops the rewritten programs from Paddle's partial programs, so the next
call builds them again unchanged.

Budget (bytes, the allocator peak of one steady training step
``loss = step(*inputs); loss.backward(); opt.step(); opt.clear_grad()``):
each program gets ``budget`` minus what lives outside it during its run --
the optimizer state (:func:`memopt.paddle.dygraph.estimate.optimizer_state`),
the gradients ``clear_grad()`` keeps (zero-filled, its default
``set_to_zero=True``; ``set_to_zero=False`` here leaves them out) and, for
an SOT subgraph, what the subgraphs built before it in the same call leave
allocated for their backward (:func:`memopt.paddle.dygraph.hook.held_bytes`).
The eager ``opt.step()`` holds parameters, gradients, state and its own
temporaries (:func:`memopt.paddle.dygraph.estimate.step_extras`): if that
alone is over the budget, :class:`memopt.errors.BudgetError` before anything
changes.  The parameters and the inputs are in the program.
"""
from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Callable, List, Optional

from ...errors import BudgetError, StepAlreadyRunError, UnsupportedProgramError

log = logging.getLogger(__name__)

__all__ = ["is_static_step", "static_function_of", "optimize_step", "StepOptimization",
           "ProgramRecord"]

_lock = threading.RLock()
_local = threading.local()
#: ProgramCache of a registered full-graph step -> its StepOptimization
_by_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: the original ProgramCache._build_once while memopt's wrapper is installed
_original_build = None
_live: "weakref.WeakSet" = weakref.WeakSet()


def _paddle_loaded() -> bool:
    return "paddle" in sys.modules


def static_function_of(step):
    """The ``StaticFunction`` of ``step`` (itself, or a converted Layer's
    ``forward``), or None."""
    if not _paddle_loaded():
        return None
    from paddle.jit.dy2static.program_translator import StaticFunction

    if isinstance(step, StaticFunction):
        return step
    forward = getattr(step, "__dict__", {}).get("forward")
    if isinstance(forward, StaticFunction):
        return forward
    import paddle

    if isinstance(step, paddle.nn.Layer):
        forward = getattr(step, "forward", None)
        if isinstance(forward, StaticFunction):
            return forward
    return None


def is_static_step(obj) -> bool:
    """Whether ``obj`` is what ``paddle.jit.to_static`` returned (a
    StaticFunction, or a Layer whose ``forward`` is one).  False without
    importing Paddle when Paddle is not loaded."""
    return static_function_of(obj) is not None


class ProgramRecord:
    """One training program memopt rewrote for a step.

    Attributes
    ----------
    index : 1, 2, ... in the order Paddle built them.
    kind : ``"full graph"`` or ``"SOT subgraph"``.
    budget : bytes the program was planned for (None: no budget).
    held : bytes its forward program leaves allocated for its backward
        and outputs (counted against the budgets of SOT subgraphs built
        after it in the same call).
    report : the :class:`memopt.report.Report` of the rewrite.
    """

    def __init__(self, index: int, kind: str, budget: Optional[int], held: int,
                 report, call: int) -> None:
        self.index, self.kind, self.budget, self.held = index, kind, budget, held
        self.report, self.call = report, call

    def __str__(self) -> str:
        from ...report import format_bytes

        head = f"to_static program {self.index} ({self.kind})"
        if self.budget is not None:
            head += f", planned for {format_bytes(self.budget)} of the step's budget"
        return f"{head}:\n{self.report}"


class StepOptimization:
    """memopt installed on a ``paddle.jit.to_static`` step (what
    ``memory_optimize(static_step, ...)`` returns).

    Attributes
    ----------
    step : the step given.
    level, budget, batch_size : as given (``budget`` in bytes, None: none).
    outside : ``[(what, bytes)]`` counted against the budget outside the
        programs (optimizer state, kept gradients).
    records : one :class:`ProgramRecord` per training program rewritten so
        far, in build order; ``reports`` their Reports.
    removed : whether :meth:`remove` was called.
    """

    def __init__(self, step, function, rewrite: Callable, *, level: int, budget: Optional[int],
                 batch_size: int, outside: List[tuple], print_log: bool, sot: bool) -> None:
        self.step, self._function, self._rewrite = step, function, rewrite
        self.level, self.budget, self.batch_size = level, budget, batch_size
        self.outside, self.print_log, self._sot = outside, print_log, sot
        self.records: List[ProgramRecord] = []
        self.removed = False
        self._partials: list = []   # (weakref to partial program, hooker)
        self._call = 0
        self._error: Optional[BaseException] = None  # raised in a hook during this call

    @property
    def reports(self) -> list:
        return [r.report for r in self.records]

    @property
    def outside_bytes(self) -> int:
        return sum(b for _, b in self.outside)

    def __str__(self) -> str:
        from ...report import format_bytes

        lines = [f"memopt on a to_static step ({'SOT' if self._sot else 'full graph'}), "
                 f"level {self.level}"
                 + (f", budget {format_bytes(self.budget)} at batch {self.batch_size}"
                    if self.budget is not None else "")
                 + (" [removed]" if self.removed else "")]
        for what, b in self.outside:
            lines.append(f"  outside the programs: {what}: {format_bytes(b)}")
        if not self.records:
            lines.append("  no training program built yet (they are rewritten as Paddle "
                         "builds them, at the step's first call)")
        lines += [str(r) for r in self.records]
        return "\n".join(lines)

    # -- wiring -------------------------------------------------------------------

    def _attach(self, partial_program) -> None:
        from .hook import make_hooker

        holder = {}

        def rewrite(whole, outputs):
            try:
                budget = self._program_budget()
                holder["budget"] = budget
                try:
                    return self._rewrite(whole, fetch_list=outputs, budget=budget,
                                         batch_size=self.batch_size, level=self.level)
                except BudgetError as exc:
                    raise self._step_budget_error(exc, budget) from None
            except Exception as exc:
                self._error = exc
                raise

        def on_report(report, held):
            record = ProgramRecord(len(self.records) + 1,
                                   "SOT subgraph" if self._sot else "full graph",
                                   holder.get("budget"), held, report, self._call)
            self.records.append(record)
            if self.print_log:
                print(record)

        hooker = make_hooker(rewrite, on_report, self.batch_size)
        partial_program.add_hooker(hooker)
        self._partials.append((weakref.ref(partial_program), hooker))

    def _step_budget_error(self, exc: BudgetError, program_budget: int) -> BudgetError:
        """``exc`` (a program's BudgetError) in the step's terms: its
        smallest budget plus what lives outside the program."""
        from ...report import format_bytes

        around = self.budget - program_budget
        smallest = exc.smallest_budget + around if exc.smallest_budget else 0
        return BudgetError(
            f"to_static program {len(self.records) + 1} of the step: no plan fits the step's "
            f"budget {format_bytes(self.budget)} at batch size {self.batch_size}: the smallest "
            f"step budget memopt can fit is {format_bytes(smallest)} (the program's "
            f"{format_bytes(exc.smallest_budget)} with Paddle's garbage collector up to 4 ops "
            f"behind, and {format_bytes(around)} outside it: optimizer state, kept gradients, "
            "earlier subgraphs). Raise the budget or lower the batch; the program is "
            "unchanged and the step raised before running it.",
            self.budget, self.batch_size, smallest, 0)

    def _program_budget(self) -> Optional[int]:
        """The budget of the next program: the step's, less what lives
        outside it (see the module docstring)."""
        if self.budget is None:
            return None
        held = sum(r.held for r in self.records if self._sot and r.call == self._call)
        left = self.budget - self.outside_bytes - held
        if left <= 0:
            from ...report import format_bytes

            raise BudgetError(
                f"the budget {format_bytes(self.budget)} leaves nothing for this to_static "
                f"program: {format_bytes(self.outside_bytes)} live outside the programs "
                f"(optimizer state, kept gradients) and {format_bytes(held)} are held by the "
                "subgraphs before it. The program is unchanged.",
                self.budget, self.batch_size)
        return left

    def remove(self) -> None:
        """Take memopt off the step: no program built from now on is
        rewritten, and the programs rewritten so far are dropped from
        Paddle's partial programs (their hooker removed, their cached
        training program forgotten), so the next call builds and runs them
        as Paddle makes them.  Calling it again does nothing."""
        if self.removed:
            return
        with _lock:
            self.removed = True
            for cache, handle in list(_by_cache.items()):
                if handle is self:
                    del _by_cache[cache]
            function = self._function
            if "_perform_call" in function.__dict__:
                del function.__dict__["_perform_call"]
            for ref, hooker in self._partials:
                partial = ref()
                if partial is None:
                    continue
                if hooker in partial._hookers:
                    partial._hookers.remove(hooker)
                for cached in ("train_program", "_train_program_id"):
                    partial.__dict__.pop(cached, None)
            self._partials.clear()
            _live.discard(self)
            _uninstall_if_unused()


# -- the wrapper of ProgramCache._build_once -----------------------------------------

def _active():
    return getattr(_local, "sot", None)


def _install() -> None:
    global _original_build
    from paddle.jit.dy2static.program_translator import ProgramCache

    if _original_build is not None:
        return
    original = ProgramCache._build_once

    def _build_once(self, cache_key):
        concrete_program, partial_program = original(self, cache_key)
        handle = _by_cache.get(self) or _active()
        if handle is not None and not handle.removed:
            handle._attach(partial_program)
        return concrete_program, partial_program

    _build_once.__wrapped__ = original
    _build_once.__memopt__ = True
    ProgramCache._build_once = _build_once
    _original_build = original


def _uninstall_if_unused() -> None:
    global _original_build
    if _original_build is None or len(_live):
        return
    from paddle.jit.dy2static.program_translator import ProgramCache

    if getattr(ProgramCache._build_once, "__memopt__", False):
        ProgramCache._build_once = _original_build
        _original_build = None


def installed() -> bool:
    """Whether memopt's wrapper of ``ProgramCache._build_once`` is installed."""
    return _original_build is not None


def _has_run(function, sot: bool) -> bool:
    """Whether Paddle already built and ran a training program for ``function``."""
    if sot:
        return function.last_call_input_spec is not None
    for _, (_, partial) in list(function._program_cache._caches.items()):
        if "train_program" in partial.__dict__:
            return True
    return False


def _outside(optimizer, params, set_to_zero: bool) -> List[tuple]:
    """``[(what, bytes)]`` live outside the programs during a step."""
    from .estimate import optimizer_state, tensor_bytes

    out = []
    if optimizer is not None:
        state = sum(item.bytes for item in optimizer_state(optimizer, params))
        if state:
            out.append((f"optimizer state ({type(optimizer).__name__})", state))
    if set_to_zero:
        grads = sum(tensor_bytes(p.shape, p.dtype) for p in params if not p.stop_gradient)
        if grads:
            out.append(("gradients kept by clear_grad() (set_to_zero=True)", grads))
    return out


def _parameters(step, function, optimizer) -> list:
    """The trainable parameters of the step: the optimizer's, else the Layer's."""
    if optimizer is not None:
        params = []
        for p in optimizer._parameter_list:
            params += p["params"] if isinstance(p, dict) else [p]
        return [p for p in params if not p.stop_gradient]
    layer = function.class_instance if function.class_instance is not None else None
    if layer is None and hasattr(step, "parameters"):
        layer = step
    return [p for p in layer.parameters() if not p.stop_gradient] if layer is not None else []


def _check_update_fits(budget: int, params, state: int, optimizer, batch: int) -> None:
    """BudgetError if the eager ``opt.step()`` alone (parameters, gradients,
    ``state`` bytes of optimizer state, its temporaries) is over ``budget``."""
    from ...report import format_bytes
    from .estimate import step_extras, tensor_bytes

    sizes = [(p, tensor_bytes(p.shape, p.dtype)) for p in params]
    weights = sum(b for _, b in sizes)
    extras = sum(b for _, b in step_extras(optimizer, sizes)) if optimizer is not None else 0
    need = 2 * weights + state + extras
    if need > budget:
        raise BudgetError(
            f"no plan fits the budget {format_bytes(budget)}: the eager optimizer step alone "
            f"holds {format_bytes(need)} (parameters and their gradients "
            f"{format_bytes(2 * weights)}, optimizer state {format_bytes(state)}, the "
            f"update's temporaries {format_bytes(extras)}), which no rewrite of the to_static "
            "programs lowers. Nothing was changed.", budget, batch, need, 0)


def optimize_step(step, rewrite: Callable, *, level: int = 2, budget: Optional[int] = None,
                  batch_size: Optional[int] = None, optimizer=None, print_log: bool = False,
                  set_to_zero: bool = True) -> StepOptimization:
    """Install memopt on the to_static ``step`` (see the module docstring).

    ``rewrite(program, *, fetch_list, budget, batch_size, level)`` rewrites
    one PIR program in place and returns its Report (:mod:`memopt.api`
    passes its own).  Checks, before anything changes: Paddle's internals
    (:func:`memopt.paddle.dygraph.hook.check_internals`), that the step has
    not run yet (:class:`memopt.errors.StepAlreadyRunError`), that the
    eager optimizer step fits ``budget``.
    """
    from .hook import check_internals

    function = static_function_of(step)
    if function is None:
        raise UnsupportedProgramError(
            f"expected what paddle.jit.to_static returned, got {type(step).__name__}")
    check_internals()
    from paddle.jit.dy2static.program_translator import SymbolicStaticFunction

    sot = isinstance(function, SymbolicStaticFunction)
    name = getattr(function._dygraph_function, "__qualname__", "the step")
    if _has_run(function, sot):
        raise StepAlreadyRunError(
            f"memory_optimize must be called on a to_static step before its first call: "
            f"{name} has already run, and Paddle ignores edits of a program it has run. "
            f"Call memopt.memory_optimize(step, ...) right after paddle.jit.to_static(...), "
            "before training. Nothing was changed.")
    with _lock:
        for handle in list(_live):
            if handle._function is function and not handle.removed:
                raise StepAlreadyRunError(
                    f"memopt is already installed on {name}: call .remove() on the object "
                    "the first memory_optimize returned before installing it again. Nothing "
                    "was changed.")
    params = _parameters(step, function, optimizer)
    outside = _outside(optimizer, params, set_to_zero) if budget is not None else []
    if budget is not None:
        state = sum(b for what, b in outside if what.startswith("optimizer state"))
        _check_update_fits(budget, params, state, optimizer, batch_size or 0)
    handle = StepOptimization(step, function, rewrite, level=level, budget=budget,
                              batch_size=batch_size or 1, outside=outside,
                              print_log=print_log, sot=sot)
    with _lock:
        _install()
        _live.add(handle)
        original = function._perform_call

        def _perform_call(*args, **kwargs):
            previous = _active()
            _local.sot = handle if sot else None
            handle._call += 1
            handle._error = None
            try:
                out = original(*args, **kwargs)
                if handle._call == 1 and not handle.records:
                    log.warning("memopt: the first call of %s built no training program "
                                "(SOT ran it eagerly, or it has no trainable parameters): "
                                "nothing was rewritten", name)
                return out
            except Exception as exc:
                error, handle._error = handle._error, None
                if error is not None and error is not exc:
                    # to_static re-raises errors as a new exception of the same type
                    # with its own message: raise memopt's own
                    raise error.with_traceback(None) from None
                raise
            finally:
                _local.sot = previous

        function.__dict__["_perform_call"] = _perform_call
        if not sot:
            _by_cache[function._program_cache] = handle
            for _, (_, partial) in list(function._program_cache._caches.items()):
                handle._attach(partial)  # built (get_concrete_program), not yet run
    return handle
