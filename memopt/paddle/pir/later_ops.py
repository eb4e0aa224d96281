"""Ops added to a PIR program after memory_optimize rewrote it.

The in-place rewrite (:mod:`memopt.paddle.pir.rewrite`) makes an op write
over an operand where no op after it reads that operand -- in the program
as it was.  An op added afterwards may read it: ``minimize`` or
``paddle.static.gradients`` called after ``memory_optimize`` appends a
backward part that reads forward values (``relu_grad`` reads relu's
result, which the rewritten ``tanh_`` wrote over), and the step silently
trains on other values (measured, Paddle 3.3.1: an MLP optimized at level
0 or 1 and then given ``SGD.minimize`` gave another loss at step 2 and
other parameters).  :func:`check_later_readers` finds such a reader; the
fetch guard runs it before every ``Executor.run`` of a PIR program, so
the run raises instead.

:func:`live_ids` serves the fetch guard too: a Value erased by the rewrite
keeps its ``id`` (its C++ address) in the rewrite's record, and an op
built later can get the same address; an id some op of the program still
defines is that op's Value, not the erased one.
"""
from __future__ import annotations

from .program import all_ops
from .inplace import reads_shape_only

#: Program attribute: the op count at the last check that found nothing
#: (checked again only when ops were added or removed).
_CHECKED_ATTR = "_memopt_later_ops_checked"


def live_ids(program) -> set:
    """The ids of every result an op of ``program`` defines (at any depth)."""
    return {r.id for op in all_ops(program.global_block()) for r in op.results()
            if r.initialized()}


def check_later_readers(program, mark_attr: str) -> None:
    """Raise :class:`~memopt.errors.MergedVariableError` when an op of
    ``program`` reads a Value after an op marked ``mark_attr`` (one
    memory_optimize made in place) wrote over it."""
    from paddle.base import core

    count = program.num_ops()
    if getattr(program, _CHECKED_ATTR, None) == count:
        return
    ops = list(all_ops(program.global_block()))
    marked = [op for op in ops if op.has_attr(mark_attr)]
    if marked:
        order = {op.id(): i for i, op in enumerate(ops)}
        for op in marked:
            at = order[op.id()]
            try:
                pairs = dict(core.pir.get_op_inplace_info(op))
            except Exception:
                continue
            for operand in pairs.values():
                if operand >= op.num_operands():
                    continue
                value = op.operand_source(operand)
                if not value.initialized():
                    continue
                for user in value.all_used_ops():
                    if order.get(user.id(), -1) > at and not reads_shape_only(user, value):
                        raise _later_reader_error(program, op, user, order[user.id()], at,
                                                  value)
    try:
        setattr(program, _CHECKED_ATTR, count)
    except AttributeError:  # a program object that takes no attributes
        pass


def _later_reader_error(program, writer, reader, reader_at: int, writer_at: int, value):
    from ...errors import MergedVariableError
    from .program import convert, label

    try:
        pg = convert(program)
        name = label(pg, pg.name(value))
    except Exception:
        name = "a Value"
    return MergedVariableError(
        f"{reader.name()} (op {reader_at} in program order) reads {name}, which "
        f"{writer.name()} (op {writer_at}) writes over in place: memopt.memory_optimize made "
        "it so before this op was added to the program (minimize, gradients or any op "
        "added after memory_optimize reads what the rewrite freed). Build the whole "
        "program first (forward, backward, optimizer), then call memory_optimize")
