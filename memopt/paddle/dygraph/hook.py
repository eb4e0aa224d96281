"""memopt inside ``paddle.jit.to_static``: the hook that rewrites each training program.

Paddle 3 (PIR) builds a to_static step's training program in
``PartialProgramLayer._append_backward``: the forward ops, then a few ops
seeding the output gradients (``full``/``full_like`` and a
``builtin.shadow_output`` named ``grad_input_*``), then the backward ops;
it then calls every hooker's
``after_append_backward(whole_program, inputs, src_vars, grad_outputs,
forward_end_idx, backward_start_idx)`` and splits the program it gets back
into a forward and a backward program at ``forward_end_idx`` (the seeding
ops, ``backward_start_idx - forward_end_idx`` of them, follow it).  The
split programs are run by an interpreter cached per program, so a program
must be rewritten there, before its first run.

:class:`StepHooker` (made by :func:`make_hooker`; a subclass of Paddle's
``PartialProgramLayerHook``) does that:

1. the values the program hands out that no op of it reads -- the
   gradients of the parameters and inputs, which Paddle turns into outputs
   after the hooks -- are kept to the program's end
   (:func:`program_outputs`, passed as ``fetch_list``);
2. ``rewrite(whole_program, fetch_list)`` rewrites the program in place (the
   PIR path of ``memory_optimize``, handed in by :mod:`memopt.api`: adapters
   never import the API) and returns its Report;
3. the seeding ops are put back together right after the last forward op
   they read (:func:`regather_seeds`; a memory-aware order may have moved
   them apart), and the hook returns the new ``forward_end_idx``.

While ``rewrite`` runs, :func:`is_step_program` is true of the program: a
budget check counts no buffers of fetched values carried into the next step
(a static Executor's fetch copies, :data:`memopt.paddle.pir.budget.FETCH_CARRIED`):
to_static hands the outputs over as eager tensors.

:func:`check_internals` checks every internal of Paddle this relies on and
raises :class:`memopt.errors.PaddleInternalsError` naming Paddle's version
and what differs.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Callable

from ...errors import PaddleInternalsError

__all__ = ["make_hooker", "program_outputs", "regather_seeds", "held_bytes",
           "is_step_program", "check_internals", "INTERNALS"]

#: The parameters of ``PartialProgramLayerHook.after_append_backward``
#: (Paddle 3.3.1), in order, after ``self``.
HOOK_PARAMETERS = ("whole_program", "inputs", "src_vars", "grad_outputs",
                   "forward_end_idx", "backward_start_idx")

_local = threading.local()


def is_step_program(program) -> bool:
    """Whether ``program`` is a to_static training program being rewritten by
    :class:`StepHooker` now (its outputs go to eager tensors, not to a
    static Executor's fetch list)."""
    return program is not None and getattr(_local, "program", None) is program


@contextlib.contextmanager
def _rewriting(program):
    previous = getattr(_local, "program", None)
    _local.program = program
    try:
        yield
    finally:
        _local.program = previous


# -- Paddle's internals relied on --------------------------------------------------

def _check_build_once():
    from paddle.jit.dy2static import program_translator as pt

    fn = getattr(getattr(pt, "ProgramCache", None), "_build_once", None)
    if fn is None:
        return "paddle.jit.dy2static.program_translator.ProgramCache._build_once is gone"
    names = list(inspect.signature(fn).parameters)
    if names != ["self", "cache_key"]:
        return f"ProgramCache._build_once takes {names}, not ['self', 'cache_key']"
    source = inspect.getsource(fn)
    if "add_hooker" not in source or "return concrete_program, partial_program" not in source:
        return ("ProgramCache._build_once no longer registers hookers on the partial program "
                "it returns as (concrete_program, partial_program)")
    return None


def _check_partial_program():
    from paddle.jit.dy2static import pir_partial_program as ppp

    cls = getattr(ppp, "PartialProgramLayer", None)
    if cls is None or not callable(getattr(cls, "add_hooker", None)):
        return "pir_partial_program.PartialProgramLayer.add_hooker is gone"
    train = inspect.getattr_static(cls, "train_program", None)
    if not hasattr(train, "attrname"):  # a functools.cached_property
        return "PartialProgramLayer.train_program is no longer built once and cached"
    source = inspect.getsource(cls._append_backward)
    for needle in ("hooker.after_append_backward(", "forward_end_idx + op_between_forward_and_backward"):
        if needle not in source:
            return (f"PartialProgramLayer._append_backward no longer contains {needle!r} "
                    "(the hook call and the split after it)")
    return None


def _check_hook_class():
    from paddle.jit.dy2static import pir_partial_program as ppp

    cls = getattr(ppp, "PartialProgramLayerHook", None)
    if cls is None:
        return "pir_partial_program.PartialProgramLayerHook is gone"
    names = tuple(inspect.signature(cls.after_append_backward).parameters)[1:]
    if names != HOOK_PARAMETERS:
        return (f"PartialProgramLayerHook.after_append_backward takes {list(names)}, "
                f"not {list(HOOK_PARAMETERS)}")
    return None


def _check_static_functions():
    from paddle.jit.dy2static import program_translator as pt

    for cls_name in ("ASTStaticFunction", "SymbolicStaticFunction"):
        cls = getattr(pt, cls_name, None)
        if cls is None or not callable(getattr(cls, "_perform_call", None)):
            return f"paddle.jit.dy2static.program_translator.{cls_name}._perform_call is gone"
    if "_program_cache" not in inspect.getsource(pt.StaticFunction.__init__):
        return "StaticFunction no longer keeps its programs in self._program_cache"
    if "last_call_input_spec" not in inspect.getsource(pt.SymbolicStaticFunction._perform_call):
        return "SymbolicStaticFunction._perform_call no longer records last_call_input_spec"
    return None


def _check_sot_builds_through_program_cache():
    from paddle.jit.sot.symbolic.compile_cache import CompileSIRCache

    source = inspect.getsource(CompileSIRCache.value_fn)
    if "paddle.jit.to_static(" not in source or "full_graph=True" not in source:
        return ("paddle.jit.sot's CompileSIRCache.value_fn no longer compiles each subgraph "
                "with paddle.jit.to_static(..., full_graph=True)")
    return None


#: ``{what memopt relies on: its check}``; each check returns None or what differs.
INTERNALS = {
    "ProgramCache._build_once registers hookers": _check_build_once,
    "PartialProgramLayer.add_hooker, cached train_program, the hook before the split":
        _check_partial_program,
    "PartialProgramLayerHook.after_append_backward's parameters": _check_hook_class,
    "StaticFunction._perform_call, _program_cache, last_call_input_spec":
        _check_static_functions,
    "SOT subgraphs built by paddle.jit.to_static(full_graph=True)":
        _check_sot_builds_through_program_cache,
}


def check_internals() -> None:
    """Raise :class:`PaddleInternalsError` (naming ``paddle.__version__``
    and every internal that differs) unless the installed Paddle has each
    internal of :data:`INTERNALS`, and PIR is on (``FLAGS_enable_pir_api``,
    the default of Paddle 3)."""
    import paddle

    problems = []
    for what, check in INTERNALS.items():
        try:
            found = check()
        except Exception as exc:  # an import or getsource that fails: Paddle differs
            found = f"{type(exc).__name__}: {exc}"
        if found:
            problems.append(f"{what}: {found}")
    from paddle.framework import use_pir_api

    if not use_pir_api():
        problems.append("PIR is off (FLAGS_enable_pir_api=0): to_static builds legacy "
                        "programs, which this hook does not rewrite")
    if problems:
        raise PaddleInternalsError(
            f"memory_optimize on a paddle.jit.to_static step needs the to_static internals "
            f"of Paddle 3.3 (installed: paddle {paddle.__version__}); these differ: "
            + "; ".join(problems) + ". Nothing was changed; use memopt.analyze on the step, "
            "or memory_optimize on a static program.")


# -- the program surgery ------------------------------------------------------------

def _is_tensor(value) -> bool:
    """Whether ``value`` is a real tensor value (not a null-typed grad slot)."""
    try:
        return bool(value.initialized()) and (value.is_dense_tensor_type()
                                              or value.is_selected_row_type())
    except Exception:
        return False


def program_outputs(whole_program, backward_start_idx: int) -> list:
    """The tensor values made by the backward ops (from
    ``backward_start_idx`` on) that no op reads: the gradients Paddle makes
    outputs of the program after the hooks (and any other unread result,
    kept to the end: more memory counted, never less)."""
    out = []
    for op in list(whole_program.global_block().ops)[backward_start_idx:]:
        for r in op.results():
            if _is_tensor(r) and r.use_empty():
                out.append(r)
    return out


def regather_seeds(whole_program, seeds: list) -> int:
    """Put the seeding ops ``seeds`` (in their order) together right after
    the last op they read that is not one of them, and return the index of
    the first: the new ``forward_end_idx``.  Valid for any topological order
    (the seeds read only forward values and each other; the ops they pass
    read them later)."""
    block = whole_program.global_block()
    ops = list(block.ops)
    seed_ids = {op.id() for op in seeds}
    position = {op.id(): k for k, op in enumerate(ops)}
    last = -1
    for op in seeds:
        for v in op.operands_source():
            d = v.get_defining_op() if v.initialized() else None
            if d is not None and d.id() not in seed_ids:
                last = max(last, position[d.id()])
    rest = [op for op in ops if op.id() not in seed_ids]
    # the op after which the seeds go, among the others
    cut = sum(1 for op in rest if position[op.id()] <= last)
    anchor = rest[cut] if cut < len(rest) else None
    if anchor is not None:  # (None: only seeds follow the ops they read)
        for op in seeds:
            op.move_before(anchor)
    got = [op.id() for op in block.ops]
    first = got.index(seeds[0].id())
    if got[first:first + len(seeds)] != [op.id() for op in seeds]:
        raise PaddleInternalsError("the gradient-seeding ops of a to_static program could not "
                                   "be put back together after memopt's rewrite")
    return first


def held_bytes(whole_program, forward_end_idx: int, batch: int) -> int:
    """Bytes the forward program of ``whole_program`` leaves allocated for
    its backward: the forward values (not parameters or data) that the
    seeding or backward ops read, at ``batch`` for a ``-1`` dimension.  The
    program's outputs (``shadow_output``) are left out: the program or eager
    code that reads them next counts them as its input."""
    from ...graph import size_of
    from ..pir.program import _dtype_name

    ops = list(whole_program.global_block().ops)
    later = {op.id() for op in ops[forward_end_idx:]}
    total = 0
    for op in ops[:forward_end_idx]:
        if op.name() in ("builtin.parameter", "pd_op.data"):
            continue
        for r in op.results():
            if not _is_tensor(r):
                continue
            users = list(r.all_used_ops())
            if any(u.name() == "builtin.shadow_output" for u in users):
                continue
            if any(u.id() in later for u in users):
                total += size_of(list(r.shape), _dtype_name(r)).at(batch)
    return total


def make_hooker(rewrite: Callable, on_report: Callable, batch: int):
    """A ``PartialProgramLayerHook`` whose ``after_append_backward`` rewrites
    the whole training program with ``rewrite(whole_program, fetch_list)``
    (returning a Report), regathers the seeding ops and calls
    ``on_report(report, held)`` with the bytes its forward program leaves
    allocated (:func:`held_bytes` at ``batch``)."""
    from paddle.jit.dy2static.pir_partial_program import PartialProgramLayerHook

    class StepHooker(PartialProgramLayerHook):
        """memopt's rewrite of a to_static training program (see the module docstring)."""

        def after_append_backward(self, whole_program, inputs, src_vars, grad_outputs,
                                  forward_end_idx, backward_start_idx):
            ops = list(whole_program.global_block().ops)
            seeds = ops[forward_end_idx:backward_start_idx]
            outputs = program_outputs(whole_program, backward_start_idx)
            with _rewriting(whole_program):
                report = rewrite(whole_program, outputs)
            start = regather_seeds(whole_program, seeds) if seeds else forward_end_idx
            on_report(report, held_bytes(whole_program, start, batch))
            return whole_program, start, src_vars

    return StepHooker()
