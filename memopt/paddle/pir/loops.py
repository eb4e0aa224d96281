"""How many times a PIR training program's ``while`` loops run, when the
program itself says so.

A ``while`` loop in the forward part of a training program pushes what its
backward part needs (``cf.tuple_push``) once per iteration, so the step's
peak grows with the trip count (:attr:`memopt.analysis.RuntimeModel.loop_iterations`,
1 by default).  ``budget=`` promises a measured peak, so it needs the real
count: :func:`loop_iterations` reads it from loops of the form
``paddle.static.nn.while_loop`` builds for ``for i in range(a, n, c)``:
the condition ``less_than(i, n)`` (or ``less_equal``) with ``i`` and ``n``
``pd_op.full`` constants, the body's next ``i`` made by ``scale(i, 1.0,
bias=c)``, ``add(i, full(c))`` or ``increment(i, c)``, ``c > 0``, and the body's next
condition the same comparison against the same ``n``; or, as
``paddle.increment(i)`` builds it, ``i`` not carried but increased in place
once per iteration by the body's one ``increment_``.  A condition that
ands such a test with another (``i < n and not done``: a decoder that may
stop early) runs at most the test's count: that bound is the count read.
"""
from __future__ import annotations

import math
from typing import Optional

from .program import PUSH_OP, WHILE_OP

__all__ = ["trip_count", "loop_iterations"]

_COMPARE = ("pd_op.less_than", "pd_op.less_equal")


def _constant(value) -> Optional[float]:
    """The value of a one-element ``pd_op.full``, else None."""
    op = value.get_defining_op() if value.initialized() else None
    if op is None or op.name() != "pd_op.full":
        return None
    shape = [int(d) for d in op.attrs().get("shape", [])]
    if math.prod(shape) != 1:
        return None
    return float(op.attrs()["value"])


def _step(value, arg) -> Optional[float]:
    """``c`` when ``value`` is ``arg + c`` (``scale(arg, 1, bias=c)``,
    ``add(arg, full(c))`` or ``increment(arg, c)``), else None."""
    op = value.get_defining_op() if value.initialized() else None
    if op is None or not op.num_operands() or not op.operand_source(0).is_same(arg):
        return None
    if op.name() == "pd_op.scale" and op.num_operands() > 1:
        attrs = op.attrs()
        if _constant(op.operand_source(1)) == 1.0 and attrs.get("bias_after_scale", True):
            return float(attrs.get("bias", 0.0))
    if op.name() == "pd_op.add" and op.num_operands() == 2:
        return _constant(op.operand_source(1))
    if op.name() in ("pd_op.increment", "pd_op.increment_"):  # paddle.increment(i, c)
        return float(op.attrs().get("value", 1.0))
    return None


def _bounding_compares(cond) -> list:
    """The comparisons that bound a loop condition ``cond``: its own
    ``less_than`` / ``less_equal``, or, for ``logical_and(a, b)`` (a loop
    that may also stop early, as a decoder on its end token does), those
    of either side: the loop runs at most as long as any of them allows."""
    op = cond.get_defining_op() if cond.initialized() else None
    if op is None:
        return []
    if op.name() in _COMPARE:
        return [op]
    if op.name() == "pd_op.logical_and" and op.num_operands() == 2:
        return _bounding_compares(op.operand_source(0)) + _bounding_compares(op.operand_source(1))
    return []


def trip_count(while_op) -> Optional[int]:
    """How many times ``while_op`` (a ``pd_op.while``) runs its body, if its
    condition and counter are constants of the form the module docstring
    describes (at most that many when the condition is also and-ed with
    another: an upper bound, what a peak needs); None otherwise."""
    counts = [n for n in (_count(while_op, compare)
                          for compare in _bounding_compares(while_op.operand_source(0)))
              if n is not None]
    return min(counts) if counts else None


def _count(while_op, compare) -> Optional[int]:
    """The trip count ``compare`` (a comparison bounding ``while_op``'s
    condition) allows, or None when it is not of the readable form."""
    counter, bound = compare.operand_source(0), compare.operand_source(1)
    start, end = _constant(counter), _constant(bound)
    inits = [while_op.operand_source(k) for k in range(1, while_op.num_operands())]
    slot = next((k for k, v in enumerate(inits) if v.is_same(counter)), None)
    if start is None or end is None:
        return None
    (body,) = list(while_op.blocks())
    ops = list(body.ops)
    if not ops or ops[-1].name() != "cf.yield" or ops[-1].num_operands() != len(inits) + 1:
        return None
    done = ops[-1]
    if slot is not None:  # a carried counter: the body yields its next value
        step = _step(done.operand_source(slot + 1), body.args()[slot])
        counted = done.operand_source(slot + 1)
    else:  # paddle.increment: the body adds to the outer counter in place, once
        bumps = [op for op in ops if op.num_operands()
                 and op.operand_source(0).is_same(counter)
                 and op.name() not in _COMPARE]
        if len(bumps) != 1 or bumps[0].name() != "pd_op.increment_":
            return None
        step = float(bumps[0].attrs().get("value", 1.0))
        counted = counter

    def recounts(again) -> bool:  # the body's next condition: the same test of the next count
        first = again.operand_source(0).get_defining_op()
        return again.name() == compare.name() and _constant(again.operand_source(1)) == end \
            and (again.operand_source(0).is_same(counted)
                 or slot is None and first is not None and first.name() == "pd_op.increment_"
                 and first.operand_source(0).is_same(counter))

    if step is None or step <= 0 or not any(
            recounts(again) for again in _bounding_compares(done.operand_source(0))):
        return None
    span = end - start
    if compare.name() == "pd_op.less_equal":
        return max(0, math.floor(span / step) + 1)
    return max(0, math.ceil(span / step))


def _pushes(block) -> bool:
    """Whether ``block`` (at any depth) pushes values for a backward pass."""
    return any(op.name() == PUSH_OP or any(_pushes(sub) for sub in op.blocks())
               for op in block.ops)


def loop_iterations(program) -> Optional[int]:
    """The largest number of times a body of a ``while`` that pushes values
    for the backward pass runs in one step of ``program`` (nested loops
    multiplied); 1 when there is no such loop, None when one's count is
    not a constant :func:`trip_count` reads."""
    best = 1

    def walk(block, outer: int) -> bool:
        nonlocal best
        for op in block.ops:
            times = outer
            if op.name() == WHILE_OP and any(_pushes(sub) for sub in op.blocks()):
                count = trip_count(op)
                if count is None:
                    return False
                times = outer * count
                best = max(best, times)
            for sub in op.blocks():
                if not walk(sub, times):
                    return False
        return True

    return best if walk(program.global_block(), 1) else None


def runtime_for(program, runtime, budget: bool):
    """``runtime`` with :attr:`~memopt.analysis.RuntimeModel.loop_iterations`
    raised to ``program``'s trip count (:func:`loop_iterations`).  With
    ``budget`` (``memory_optimize(budget=...)``, a promise on the measured
    peak) a loop whose count the program does not fix is refused
    (:class:`memopt.errors.UnsupportedProgramError`, nothing changed)."""
    from dataclasses import replace

    from ...errors import UnsupportedProgramError

    trips = loop_iterations(program)
    if trips is None:
        if budget:
            raise UnsupportedProgramError(
                "budget=: a while loop of this program saves values for the backward pass "
                "on every iteration and its trip count is not a constant memopt can read "
                "(a counter from paddle.full compared by less_than/less_equal with a "
                "paddle.full bound, stepped by a constant), so no peak can be promised. "
                "Give the loop constant bounds, or drop budget= (level=2 still applies)")
        return runtime
    return replace(runtime, loop_iterations=max(runtime.loop_iterations, trips))
