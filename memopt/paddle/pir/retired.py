"""The ops the in-place rewrite replaces, kept alive: the user's Values of them stay valid.

:func:`memopt.paddle.pir.rewrite.apply_inplace` builds ``relu_`` beside a
``relu`` and moves the ``relu``'s uses to it.  It used to erase the
``relu`` then, which freed its results: the Python ``Value`` objects the
user still held (``h = relu(...)``) pointed at freed memory, and building
an op on one -- ``paddle.mean(h)`` for a metric after ``memory_optimize``
-- crashed the process (SIGSEGV in Paddle's op builder, Paddle 3.3.1).

Now the replaced op is *retired* (:func:`retire`): moved into one holding
program that lives as long as the process, its operands pointed at a
placeholder there, so it never runs and holds none of the user's values.
Its results stay valid Values (name, shape, dtype).  An op the user builds
on one reads a Value of the holding program; before the program runs, the
fetch guard points that operand at the replacement (:func:`redirect`),
which holds the same data as the retired Value would have -- unless an
in-place op wrote over the replacement since, and then the guard's check of
later readers (:mod:`memopt.paddle.pir.later_ops`) raises naming it.
Where memopt is not imported, Paddle's executor refuses such an op
(``Not found key in IRMapping``) instead of crashing.

The holding program is never destroyed (a reference is leaked on purpose):
destroying it while a user's op still reads one of its Values aborts the
process (``Destroyed a op_result that is still in use``), at exit too.
"""
from __future__ import annotations

from typing import Dict

__all__ = ["retire", "redirect", "replacement_of"]

#: (holding program, placeholder Value), made on first use.
_HOLD = None

#: ``Value.id`` of a retired op's result -> the replacement's result.
_REPLACEMENT: Dict[str, object] = {}


def _holding():
    """The holding program and its placeholder, made once per process."""
    global _HOLD
    if _HOLD is None:
        import ctypes

        import paddle

        from .inplace import insertion_point_kept

        program = paddle.static.Program()
        with insertion_point_kept(), paddle.static.program_guard(program):
            placeholder = paddle.full([1], 0, "float32")
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(program))  # never destroyed
        _HOLD = (program, placeholder)
    return _HOLD


def retire(old, new) -> None:
    """Move ``old`` (its uses already moved to ``new``, its replacement)
    into the holding program, reading nothing of its own program."""
    program, placeholder = _holding()
    for k in range(old.num_operands()):
        old.operand(k).set_source(placeholder)
    program.global_block().move_op_to_block_end(old)
    for a, b in zip(old.results(), new.results()):
        if a.initialized():
            _REPLACEMENT[a.id] = b


def replacement_of(value):
    """The replacement of a retired op's result (followed to one that is not
    retired itself), else None."""
    found = None
    while value.initialized() and value.id in _REPLACEMENT:
        value = found = _REPLACEMENT[value.id]
    return found


#: Program attribute: its op count when :func:`redirect` last looked (an op
#: built on a retired Value adds ops; the guard calls it before every run).
_SEEN_ATTR = "_memopt_redirect_seen"


def redirect(program) -> int:
    """Point every operand of ``program``'s ops (at any depth) that reads a
    retired Value at its replacement; how many were.  Looks again only when
    the program's op count changed since the last look."""
    if not _REPLACEMENT:
        return 0
    count = program.num_ops()
    if getattr(program, _SEEN_ATTR, None) == count:
        return 0
    from .program import all_ops

    moved = 0
    for op in all_ops(program.global_block()):
        for k in range(op.num_operands()):
            new = replacement_of(op.operand_source(k))
            if new is not None:
                op.operand(k).set_source(new)
                moved += 1
    try:
        setattr(program, _SEEN_ATTR, count)
    except AttributeError:  # a program object that takes no attributes
        pass
    return moved
