"""What a PIR inference model holds: the program as the user built it.

``paddle.static.save_inference_model`` writes a model for
``paddle.inference``'s predictor, which runs it with kernels and passes
of its own (oneDNN on CPU, fusions, its own memory optimization).  An op
``memory_optimize`` made in place (``pd_op.add_`` for ``pd_op.add``) is
another op to that predictor: measured on Paddle 3.3.1 (CPU), a
conv-BN-ReLU-linear-softmax classifier rewritten at level 1 (``add`` ->
``add_``, ``relu`` -> ``relu_``) gave softmax outputs that differ from the
unchanged model's in the last bits, with the predictor's IR passes on and
off, while the executor gave the same bytes.

So the program the save writes -- Paddle's pruned copy, never the user's
program -- gets back the op each in-place op replaced (:func:`out_of_place`,
run by the fetch guard's serialize hook before the record of the marks is
written again, which then records nothing): the saved model is the
unchanged model's, whatever runs it; the predictor does its own memory
planning.  ``memory_optimize`` on a program read back with
``load_inference_model`` makes it in place again, for the executor.
"""
from __future__ import annotations

from .program import all_ops

__all__ = ["out_of_place", "out_of_place_for_save", "predictor_note"]

#: The op attribute marking an op memory_optimize made in place: the same
#: string as :data:`memopt.paddle.pir.rewrite.MARK_ATTR` (that module
#: registers :func:`out_of_place`, so this one does not import it).
MARK_ATTR = "memopt_inplace"


def out_of_place(program) -> int:
    """Replace every op of ``program`` that ``memory_optimize`` made in
    place (marked with :data:`MARK_ATTR`) by the
    out-of-place op it replaced: same operands and attributes, its uses
    moved over, the in-place op erased.  Returns how many; all or nothing
    (a variant that cannot be built leaves the program as it was)."""
    import paddle

    from .inplace import _ops_module, insertion_point_kept, static_mode

    marked = [op for op in all_ops(program.global_block()) if op.has_attr(MARK_ATTR)]
    built = []
    try:
        for op in marked:
            short = op.name().partition(".")[2]
            attrs = op.attrs()
            args = [op.operand_source(i) for i in range(op.num_operands())]
            args += [attrs[a] for a in op.get_attr_names()]
            with static_mode(), insertion_point_kept():
                paddle.pir.set_insertion_point(op)
                out = getattr(_ops_module(), short[:-1])(*args)
            first = out[0] if isinstance(out, (list, tuple)) else out
            new = first.get_defining_op()
            if new.name() != op.name()[:-1] or new.num_results() != op.num_results():
                new.erase()
                raise ValueError(f"{op.name()[:-1]} built for {op.name()} does not match it")
            built.append((op, new))
    except Exception:
        for _, new in built:
            new.erase()
        raise
    for op, new in built:
        try:
            new.callstack = op.callstack
        except Exception:  # pragma: no cover - an op without a call stack
            pass
        op.replace_all_uses_with(new.results())
        op.erase()
    return len(built)


def out_of_place_for_save(program) -> None:
    """The fetch guard's serialize hook: :func:`out_of_place` on the program
    ``save_inference_model`` writes; where an op cannot be built back the
    model keeps memopt's in-place ops and their record (as saved before
    this module), with a warning."""
    try:
        out_of_place(program)
    except Exception as exc:  # noqa: BLE001 - the save goes on, as before
        import warnings

        warnings.warn(f"memopt: the inference model keeps the ops memory_optimize made in "
                      f"place ({exc}); paddle.inference's predictor may give outputs that "
                      f"differ in the last bits", RuntimeWarning, stacklevel=2)


def predictor_note(program):
    """A warning for a PIR inference model (it has ``pd_op.fetch`` ops, as
    ``save_inference_model`` writes them) holding ops ``memory_optimize``
    made in place, or None.  Such a file -- what ``memopt optimize`` writes
    for one -- runs bit-identically under ``load_inference_model`` and the
    Executor, but ``paddle.inference``'s predictor runs the in-place ops
    with other kernels (oneDNN, its CPU default: measured, outputs differ
    in the last bits; bit-identical with ``Config.disable_mkldnn()``)."""
    ops = list(all_ops(program.global_block()))
    marked = sum(1 for op in ops if op.has_attr(MARK_ATTR))
    if not marked or not any(op.name() == "pd_op.fetch" for op in ops):
        return None
    return (f"this inference model now has {marked} op(s) made in place: "
            "paddle.static.load_inference_model + Executor run it bit-identically, but "
            "paddle.inference's predictor (oneDNN kernels, its CPU default) gives outputs "
            "that differ from the unchanged model's in the last bits. For the predictor, "
            "deploy the unchanged model (the predictor plans its own memory)")
