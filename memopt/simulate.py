"""What a memory plan costs, and an independent checker that it is valid.

Two kinds of plan come out of memopt's planners:

- an *offset plan* (:mod:`memopt.arena`): every buffer gets a byte offset in
  one arena; valid when no two buffers live at the same time step overlap in
  ``[offset, offset + size)``; it costs its height ``max(offset + size)``;
- a *group plan* (:mod:`memopt.reuse`): buffers are grouped, members of a
  group share one block of memory; valid when no two members of a group are
  live at the same time step.

The checkers here (:func:`check_offsets`, :func:`check_groups`) share no code
with the planners on purpose: a bug in a planner cannot hide itself.  They
raise :class:`~memopt.errors.PlanError` naming the buffer(s) at fault.

The simulation is a sweep over time: :func:`live_bytes` gives the bytes live
over every stretch of time steps (the no-fragmentation heap of XLA's heap
simulator), :func:`peak_live` its maximum, and :func:`group_timeline` the
memory a group plan holds over time under a runtime model (garbage collection
on: a group's memory is held from its first member's start to its last
member's end; off: every group is held for the whole run).

Time is in op positions; a buffer with ``[lower, upper)`` is live at the steps
``lower <= t < upper``.  Sizes are bytes; symbolic sizes
(:class:`memopt.graph.Size`) need a ``batch_size``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

import numpy as np

from .errors import PlanError
from .graph import size_at

__all__ = [
    "Timeline",
    "live_bytes",
    "peak_live",
    "check_offsets",
    "check_groups",
    "arena_height",
    "group_timeline",
]


#: Sums of byte counts below this are exact in np.int64 (with room for one
#: more addition); above it the arrays hold Python ints (dtype=object).
_INT64_SAFE = 2 ** 62


def byte_array(values: Sequence[int]) -> np.ndarray:
    """Byte counts as an array whose sums are exact: np.int64 when the sum
    of their magnitudes is below 2**62 (the fast, usual case), else an
    object array of Python ints (a 2**71-byte tensor neither raises
    OverflowError nor wraps to a negative peak)."""
    values = [int(v) for v in values]
    if sum(abs(v) for v in values) < _INT64_SAFE:
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=object)


@dataclass
class Timeline:
    """Piecewise-constant bytes over time.

    ``bytes[i]`` are live over the steps ``starts[i] <= t < starts[i + 1]``
    (the last stretch ends at ``end``).  Empty arrays when nothing is live.
    """

    starts: np.ndarray
    bytes: np.ndarray
    end: int

    @property
    def peak(self) -> int:
        """The most bytes live at any one step (0 when empty)."""
        return int(self.bytes.max()) if len(self.bytes) else 0

    @property
    def peak_step(self) -> Optional[int]:
        """The first step where the peak is reached (None when empty)."""
        if not len(self.bytes):
            return None
        return int(self.starts[int(np.argmax(self.bytes))])

    def at(self, step: int) -> int:
        """Bytes live at ``step``."""
        if not len(self.starts) or step < self.starts[0] or step >= self.end:
            return 0
        i = int(np.searchsorted(self.starts, step, side="right")) - 1
        return int(self.bytes[i])


def _sweep(lowers: np.ndarray, uppers: np.ndarray, sizes: np.ndarray) -> Timeline:
    """Bytes live over time for intervals ``[lowers[i], uppers[i])`` of ``sizes[i]``."""
    if len(lowers) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Timeline(empty, empty.copy(), 0)
    points = np.concatenate([lowers, uppers])
    deltas = np.concatenate([sizes, -sizes])
    steps, inverse = np.unique(points, return_inverse=True)
    change = np.zeros(len(steps), dtype=sizes.dtype)
    np.add.at(change, inverse, deltas)
    level = np.cumsum(change)
    # the last point is an end: nothing is live after it
    return Timeline(steps[:-1], level[:-1], int(steps[-1]))


def buffer_sizes(buffers: Sequence, batch_size: Optional[int] = None) -> np.ndarray:
    """The buffers' sizes in bytes, as an exact :func:`byte_array`."""
    return byte_array([int(size_at(b.size, batch_size)) for b in buffers])


def live_bytes(buffers: Sequence, batch_size: Optional[int] = None) -> Timeline:
    """Bytes of ``buffers`` live at each step: the cost with no fragmentation."""
    lowers = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=len(buffers))
    uppers = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=len(buffers))
    return _sweep(lowers, uppers, buffer_sizes(buffers, batch_size))


def peak_live(buffers: Sequence, batch_size: Optional[int] = None) -> int:
    """The most bytes live at one step: no plan of any kind can use less."""
    return live_bytes(buffers, batch_size).peak


def _offsets_of(plan: Any) -> Mapping[Hashable, int]:
    offsets = getattr(plan, "offsets", plan)
    if not isinstance(offsets, Mapping):
        raise TypeError("expected a mapping buffer id -> offset, or a plan with "
                        f".offsets; got {type(plan).__name__}")
    return offsets


def arena_height(buffers: Sequence, plan: Any, batch_size: Optional[int] = None) -> int:
    """``max(offset + size)`` over the buffers (0 when there are none)."""
    offsets = _offsets_of(plan)
    return max((offsets[b.id] + int(size_at(b.size, batch_size)) for b in buffers), default=0)


def check_offsets(buffers: Sequence, plan: Any, capacity: Optional[int] = None,
                  batch_size: Optional[int] = None) -> int:
    """Verify an offset plan; return its height in bytes.

    Parameters
    ----------
    buffers : the problem's buffers (:class:`memopt.problems.Buffer`).
    plan : a mapping buffer id -> offset (bytes), or an object with such an
        ``offsets`` attribute (an :class:`memopt.arena.ArenaPlan`).
    capacity : when given, the height must not exceed it.
    batch_size : for symbolic sizes.

    Raises
    ------
    PlanError
        A buffer without an offset, an offset that is not an int >= 0, an
        offset for an unknown buffer, two buffers live at the same step whose
        byte ranges overlap (both are named), or a height above ``capacity``.
    """
    offsets = _offsets_of(plan)
    known = set()
    for b in buffers:
        known.add(b.id)
        if b.id not in offsets:
            raise PlanError(f"buffer {b.id!r} has no offset in the plan")
        off = offsets[b.id]
        if isinstance(off, bool) or not isinstance(off, (int, np.integer)) or off < 0:
            raise PlanError(f"buffer {b.id!r} has the offset {off!r}; offsets are "
                            "ints >= 0")
    extra = [k for k in offsets if k not in known]
    if extra:
        raise PlanError(f"the plan places {extra[0]!r}, which is not a buffer of the "
                        "problem")
    # every pair, in blocks of rows: plainly correct, and fast enough in numpy
    n = len(buffers)
    lower = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=n)
    upper = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=n)
    starts = [int(offsets[b.id]) for b in buffers]
    ends = [off + int(size_at(b.size, batch_size)) for off, b in zip(starts, buffers)]
    both = byte_array(starts + ends)
    start, end = both[:n], both[n:]
    height = int(end.max()) if n else 0
    block = max(1, 4_000_000 // max(n, 1))
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        clash = ((lower[r0:r1, None] < upper[None, :]) & (lower[None, :] < upper[r0:r1, None])
                 & (start[r0:r1, None] < end[None, :]) & (start[None, :] < end[r0:r1, None])
                 & (start[r0:r1, None] < end[r0:r1, None]) & (start[None, :] < end[None, :]))
        clash &= np.arange(r0, r1)[:, None] < np.arange(n)[None, :]  # each pair once
        hits = np.argwhere(clash)
        if len(hits):
            i, j = int(hits[0][0]) + r0, int(hits[0][1])
            a, b = buffers[i], buffers[j]
            raise PlanError(
                f"buffers {a.id!r} [{a.lower}, {a.upper}) at bytes [{start[i]}, {end[i]}) "
                f"and {b.id!r} [{b.lower}, {b.upper}) at bytes [{start[j]}, {end[j]}) "
                "are live at the same time and overlap in memory")
    if capacity is not None and height > capacity:
        top = max(buffers, key=lambda x: offsets[x.id] + int(size_at(x.size, batch_size)))
        raise PlanError(f"the plan is {height} bytes high, above the capacity "
                        f"{capacity} (buffer {top.id!r} ends highest)")
    return height


def check_groups(buffers: Sequence, plan: Any,
                 compatible: Optional[Callable] = None,
                 fits: Optional[Callable] = None,
                 equivalence: bool = False) -> None:
    """Verify a group plan (:class:`memopt.reuse.GroupPlan`).

    Checks that every buffer is in exactly one group and ``plan.group_of``
    agrees; that no two members of a group are live at the same step; that
    ``compatible(a, b)`` holds for every two members (when given) and
    ``fits(member, earliest)`` for every member but the group's earliest
    (when given).  With ``equivalence=True`` the caller asserts that
    ``compatible`` is an equivalence relation (equal keys, say), so each
    member is checked against the earliest only: linear, not quadratic, in
    a group's size.

    Raises
    ------
    PlanError
        Naming the buffer(s) and the group at fault.
    """
    by_id = {b.id: b for b in buffers}
    seen: dict = {}
    for k, group in enumerate(plan.groups):
        for member in group:
            if member.id not in by_id:
                raise PlanError(f"group {k} holds {member.id!r}, which is not a buffer "
                                "of the problem")
            if by_id[member.id] != member:
                raise PlanError(f"group {k} holds a changed copy of buffer {member.id!r}")
            if member.id in seen:
                raise PlanError(f"buffer {member.id!r} is in groups {seen[member.id]} "
                                f"and {k}")
            seen[member.id] = k
    for b in buffers:
        if b.id not in seen:
            raise PlanError(f"buffer {b.id!r} is in no group")
        if plan.group_of.get(b.id) != seen[b.id]:
            raise PlanError(f"group_of[{b.id!r}] is {plan.group_of.get(b.id)!r} but the "
                            f"buffer is in group {seen[b.id]}")
    for k, group in enumerate(plan.groups):
        members = sorted(group, key=lambda m: (m.lower, m.upper))
        for a, b in zip(members, members[1:]):
            if b.lower < a.upper:
                raise PlanError(f"buffers {a.id!r} [{a.lower}, {a.upper}) and {b.id!r} "
                                f"[{b.lower}, {b.upper}) share group {k} but are live "
                                "at the same time")
        if compatible is not None:
            for x in range(1 if equivalence else len(members)):
                for y in range(x + 1, len(members)):
                    if not compatible(members[x], members[y]):
                        raise PlanError(f"buffers {members[x].id!r} and {members[y].id!r} "
                                        f"share group {k} but are not compatible")
        if fits is not None and members:
            first = members[0]
            for m in members[1:]:
                if not fits(m, first):
                    raise PlanError(f"buffer {m.id!r} shares group {k} but does not fit "
                                    f"its earliest member {first.id!r}, which allocates "
                                    "the memory")


def group_timeline(plan: Any, gc: bool = True, batch_size: Optional[int] = None) -> Timeline:
    """Memory a group plan holds over time.

    Each group holds the bytes of its largest member.  With ``gc=True`` it
    holds them from its earliest member's ``lower`` to its latest member's
    ``upper`` (the runtime frees a variable after its last use); with
    ``gc=False`` from the program's first step to its last.
    """
    groups = [g for g in plan.groups if g]
    sizes = byte_array([max(int(size_at(b.size, batch_size)) for b in g) for g in groups])
    lowers = np.array([min(b.lower for b in g) for g in groups], dtype=np.int64)
    uppers = np.array([max(b.upper for b in g) for g in groups], dtype=np.int64)
    if not gc and len(groups):
        lowers[:] = lowers.min()
        uppers[:] = uppers.max()
    return _sweep(lowers, uppers, sizes)
