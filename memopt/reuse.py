"""Whole-buffer reuse: group buffers that may share one block of memory.

This is the planning problem behind renaming in ``memory_optimize`` and XLA's
buffer assignment: every :class:`~memopt.problems.Buffer` goes to exactly one
*group*; all members of a group live in the same memory, so no two of them may
be live at the same time step (their half-open intervals ``[lower, upper)`` are
pairwise disjoint).  A group costs the bytes of its largest member; a plan
costs the sum over its groups.

API
---
``assign_groups(buffers, *, order="best", compatible=None, fits=None, kind=None)``
returns a :class:`GroupPlan`.

- ``compatible(a, b) -> bool``: may ``a`` and ``b`` ever share memory (for
  example "same shape and dtype", as level 0 of ``memory_optimize`` asks).  A
  buffer joins a group only if it is compatible with *every* member.  None:
  any two buffers are compatible.
- ``kind(b) -> hashable``: buffers of different kinds never share; the same
  as ``compatible=lambda a, b: kind(a) == kind(b)``, but cheap: use it for
  equivalences such as "same dtype".
- ``fits(member, first) -> bool``: when given, the memory of a group is
  allocated by its *earliest* member (smallest ``lower``) and must never grow:
  a group is kept so that ``fits(m, earliest)`` holds for every other member
  ``m``.  A buffer that would become the new earliest member must be one that
  every current member fits.  Level 1 of ``memory_optimize`` passes
  ``lambda m, f: m.size.provably_le(f.size)``, which compares symbolic sizes
  (:class:`memopt.graph.Size`) for every batch size.  None: any sizes combine
  and a group costs its largest member (XLA's rule).
- ``order``: the order in which buffers are offered to the groups:

  ``"forward"``  by start time (then end, then input position);
  ``"reverse"``  by end time, latest first -- XLA's reverse order, which
                 lets a value that is live out start a group that earlier
                 temporaries then join;
  ``"size"``     largest first (then by start);
  ``"duration"`` longest lifetime first (then by start);
  ``"best"``     all of :data:`ORDERS`, keeping the cheapest plan (ties: the
                 first in :data:`ORDERS`).

  Each buffer goes to the admissible group that raises the plan's cost least,
  then wastes least (the group's bytes minus the buffer's), then was created
  first; if there is none it opens a new group.  Everything is
  deterministic: same input, same plan.  The groups (of the buffer's kind)
  are searched in order of that key -- by weight, from the buffer's own up,
  then down -- so the first free admissible one met is the choice, usually
  long before the last group.

Sizes may be ints (bytes) or :class:`memopt.graph.Size`.  Symbolic sizes are
compared where a choice must be made (which group, which order is best) by
their bytes at a reference batch of :data:`RANK_BATCH` (ties at batch 1); this
affects only the quality of a plan, never its validity, which is checked by
:func:`memopt.simulate.check_groups`.

Example: XLA's reverse order
----------------------------
A parameter ``x`` and a chain of six convolutions ``c1 .. c6`` whose last
output ``c6`` is live out, with XLA's rule that a live-out value only goes to
memory of exactly its size (``tests/test_reuse.py``).  Offered forward, ``c5``
takes the 1 KiB that ``x`` frees, so the result finds no 1 KiB group and
opens a fourth; offered in reverse, the result comes first and ``x`` joins
it: three groups.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from .graph import Size, as_size, size_at
from .problems import SizeLike
from .problems import Buffer

__all__ = ["GroupPlan", "assign_groups", "group_buffers", "best_fit_groups", "SMALL_PROBLEM",
           "ORDERS", "RANK_BATCH", "order_buffers"]


#: The orders ``"best"`` tries, in tie-breaking order.
ORDERS = ("forward", "reverse", "size", "duration")


#: Batch size at which symbolic sizes are compared when ranking choices.
RANK_BATCH = 64

Predicate = Callable[[Buffer, Buffer], bool]


def _weight(size: SizeLike) -> int:
    """Bytes used to rank choices (symbolic sizes at :data:`RANK_BATCH`)."""
    return as_size(size).at(RANK_BATCH)


def _is_symbolic(size: SizeLike) -> bool:
    return as_size(size).symbolic


@dataclass
class GroupPlan:
    """Groups of buffers that share memory.

    Attributes
    ----------
    groups : each group's members in time order (by ``lower``); groups in the
        order they were opened.
    group_of : buffer id -> index into ``groups``.
    order : the order that produced this plan (``"forward"``, ...).
    """

    groups: List[List[Buffer]]
    group_of: Dict[Hashable, int]
    order: str = ""

    @property
    def symbolic(self) -> bool:
        return any(_is_symbolic(b.size) for g in self.groups for b in g)

    @property
    def cost(self) -> Optional[int]:
        """Bytes: the sum over groups of the largest member.

        None when some size is symbolic: use :meth:`cost_at`.
        """
        if self.symbolic:
            return None
        return self.cost_at(1)

    def cost_at(self, batch_size: int) -> int:
        """Bytes at a concrete batch size: sum over groups of the largest member."""
        return sum(max(size_at(b.size, batch_size) for b in group)
                   for group in self.groups if group)

    def group_bytes(self, batch_size: Optional[int] = None) -> List[int]:
        """Bytes of each group (its largest member) at ``batch_size``."""
        if batch_size is None:
            batch_size = 1
        return [max(size_at(b.size, batch_size) for b in group) for group in self.groups]

    def _rank(self) -> tuple:
        if self.symbolic:
            return (self.cost_at(RANK_BATCH), self.cost_at(1), len(self.groups))
        return (self.cost_at(1), len(self.groups))

    def __str__(self) -> str:
        lines = [f"GroupPlan(order={self.order!r}, {len(self.groups)} groups, "
                 f"cost={self.cost if not self.symbolic else 'symbolic'})"]
        for k, group in enumerate(self.groups):
            members = ", ".join(f"{b.id}[{b.lower},{b.upper})" for b in group)
            lines.append(f"  group {k}: {members}")
        return "\n".join(lines)


def order_buffers(buffers: Sequence[Buffer], order: str) -> List[int]:
    """Indices of ``buffers`` in the named order (see the module docstring)."""
    idx = range(len(buffers))
    if order == "forward":
        key = lambda i: (buffers[i].lower, buffers[i].upper, i)
    elif order == "reverse":
        key = lambda i: (-buffers[i].upper, -buffers[i].lower, i)
    elif order == "size":
        key = lambda i: (-_weight(buffers[i].size), buffers[i].lower, i)
    elif order == "duration":
        key = lambda i: (buffers[i].lower - buffers[i].upper, buffers[i].lower, i)
    else:
        raise ValueError(f"unknown order {order!r}: expected one of "
                         f"{', '.join(ORDERS)} or 'best'")
    return sorted(idx, key=key)


@dataclass
class _Group:
    """A group under construction: members sorted by ``lower``."""

    lowers: List[int] = field(default_factory=list)
    uppers: List[int] = field(default_factory=list)  # of the members, in the same order
    members: List[Buffer] = field(default_factory=list)
    weight: int = 0  # bytes of the largest member, at RANK_BATCH

    def add(self, buf: Buffer) -> None:
        i = bisect_left(self.lowers, buf.lower)
        self.lowers.insert(i, buf.lower)
        self.uppers.insert(i, buf.upper)
        self.members.insert(i, buf)
        w = _weight(buf.size)
        if w > self.weight:
            self.weight = w


def _admits(group: _Group, buf: Buffer, compatible: Optional[Predicate],
            fits: Optional[Predicate]) -> bool:
    if fits is not None:
        earliest = group.members[0]
        if buf.lower < earliest.lower:  # buf would allocate the group's memory
            if not all(fits(m, buf) for m in group.members):
                return False
        elif not fits(buf, earliest):
            return False
    if compatible is not None:
        if not all(compatible(buf, m) for m in group.members):
            return False
    return True


def _best_group(buf: Buffer, w: int, groups: List[_Group], by_weight: List[Tuple[int, int]],
                compatible: Optional[Predicate], fits: Optional[Predicate]) -> Optional[int]:
    """The admissible group free over ``buf``'s lifetime with the least
    ``(cost added, bytes wasted, index)``, or None.

    ``by_weight`` holds ``(weight, index)`` of the groups, sorted.  The keys
    rise along it from the first group at least as heavy as ``buf`` upward
    (no cost added, less waste first), then from there downward, one run of
    equal weights at a time (less cost added first; in a run, lower index
    first), so the first admissible free group met is the best one.
    """
    lower, upper = buf.lower, buf.upper

    def takes(k: int) -> bool:
        group = groups[k]
        i = bisect_left(group.lowers, upper)  # members[:i] start before buf ends
        if i and group.uppers[i - 1] > lower:  # ... and the last of them ends after
            return False
        return _admits(group, buf, compatible, fits)

    start = bisect_left(by_weight, (w, -1))
    for _, k in by_weight[start:]:
        if takes(k):
            return k
    end = start
    while end > 0:
        first = bisect_left(by_weight, (by_weight[end - 1][0], -1))
        for _, k in by_weight[first:end]:
            if takes(k):
                return k
        end = first
    return None


def _greedy(buffers: Sequence[Buffer], order: str, compatible: Optional[Predicate],
            fits: Optional[Predicate], kinds: Sequence[int]) -> GroupPlan:
    groups: List[_Group] = []
    of_kind: Dict[int, List[tuple]] = {}  # kind -> (weight, index) of its groups, sorted
    for i in order_buffers(buffers, order):
        buf = buffers[i]
        w = _weight(buf.size)
        by_weight = of_kind.setdefault(kinds[i], [])
        k = _best_group(buf, w, groups, by_weight, compatible, fits)
        if k is None:
            k = len(groups)
            groups.append(_Group())
        else:
            by_weight.remove((groups[k].weight, k))
        groups[k].add(buf)
        insort(by_weight, (groups[k].weight, k))
    final = [g.members for g in groups]
    group_of = {b.id: k for k, members in enumerate(final) for b in members}
    return GroupPlan(final, group_of, order)


def assign_groups(buffers: Sequence[Buffer], *, order: str = "best",
                  compatible: Optional[Predicate] = None,
                  fits: Optional[Predicate] = None,
                  kind: Optional[Callable[[Buffer], Hashable]] = None) -> GroupPlan:
    """Group ``buffers`` so that members of a group never overlap in time.

    Parameters
    ----------
    buffers : the buffers; ids must be unique.
    order : ``"forward"``, ``"reverse"``, ``"size"``, ``"duration"`` or
        ``"best"`` (all of them, cheapest plan kept; ties go to the first in
        :data:`ORDERS`).
    compatible : ``compatible(a, b)``: may ``a`` and ``b`` share memory.
        A buffer joins a group only if compatible with every member.
    fits : ``fits(member, first)``: when given, every member must fit the
        group's earliest member, which allocates the group's memory.
    kind : ``kind(buffer)``: a hashable class; buffers of different kinds
        never share.  The same plan as ``compatible=lambda a, b: kind(a) ==
        kind(b)`` (both may be given: then both must hold), but checked once
        per buffer instead of once per member of every group tried -- the
        fast way to say "same dtype" or "same shape and dtype".

    Returns
    -------
    GroupPlan
        Buffers never grouped with another form singleton groups.

    Raises
    ------
    ValueError
        An unknown ``order`` or a duplicate buffer id.
    """
    buffers = list(buffers)
    ids = set()
    for b in buffers:
        if b.id in ids:
            raise ValueError(f"buffer id {b.id!r} appears twice; ids must be unique")
        ids.add(b.id)
    codes: Dict[Hashable, int] = {}
    kinds = [codes.setdefault(kind(b), len(codes)) for b in buffers] if kind \
        else [0] * len(buffers)
    if order != "best":
        return _greedy(buffers, order, compatible, fits, kinds)
    best_plan: Optional[GroupPlan] = None
    for name in ORDERS:
        plan = _greedy(buffers, name, compatible, fits, kinds)
        if best_plan is None or plan._rank() < best_plan._rank():
            best_plan = plan
    assert best_plan is not None  # ORDERS is not empty
    return best_plan


# -- the one-sweep groupers, for problems too big for assign_groups -----------------

#: Up to this many buffers :func:`group_buffers` runs
#: :func:`assign_groups` ("best" of its orders); above it,
#: :func:`best_fit_groups` (three sweeps, ``O(n log n)``).  The two give
#: different groups on the same problem (measured with
#: ``scripts/plan_digest.py``: ResNet-50 and MobileNetV2 at level 1 with GC
#: off differ), so both stay.
SMALL_PROBLEM = 200


def group_buffers(buffers: List[Buffer], klass: Callable[[Buffer], Hashable], fits: Optional[Predicate] = None
                  ) -> List[List[Buffer]]:
    """The whole-buffer grouping memory_optimize uses: groups of ``buffers``
    whose members never overlap in time, each of one class
    (``klass(buffer)``, hashable: buffers of different classes never share)
    and, where ``fits`` is given, each member ``fits(member, first member)``.

    :func:`assign_groups` (``order="best"``) for up to :data:`SMALL_PROBLEM`
    buffers, :func:`best_fit_groups` above.  (Without ``fits``, classes are
    expected to hold only buffers of one size, as memory_optimize's level 0
    classes do: one shape and dtype.)"""
    if len(buffers) <= SMALL_PROBLEM:
        return assign_groups(buffers, kind=klass, fits=fits).groups
    return best_fit_groups(buffers, klass)


def best_fit_groups(buffers: List[Buffer], klass: Callable[[Buffer], Hashable]
                    ) -> List[List[Buffer]]:
    """Group buffers by sweeping, best fit.

    Three sweeps, the cheapest plan kept (at :data:`memopt.reuse.RANK_BATCH`;
    ties: forward, then reverse):

    - forward (by start time): a buffer joins a free group of its class
      (``klass(buffer)``) -- one whose last member has ended -- whose memory,
      allocated by the group's first member, is the smallest that provably
      holds it (:meth:`Size.provably_le`, for every batch size); else it
      opens a group;
    - reverse (by end time, latest first, as XLA's reverse order): a buffer
      becomes the new first member of a free group -- one whose first member
      starts after it ends -- whose members it provably holds, the largest
      such group (least growth); else it opens a group;
    - largest first (:func:`_largest_first`): a buffer joins the admitting
      group of its class with the least spare memory, else opens one.

    The time sweeps are ``O(n log n)``; largest first scans a class's groups
    smallest first and stops at the first that admits the buffer (at worst
    ``O(n * groups)``).  Every way, every member fits its group's first
    member and members of a group never overlap in time.  Deterministic:
    ties go to the group opened first.
    """
    plans = [_sweep(buffers, klass, reverse=False), _sweep(buffers, klass, reverse=True),
             _largest_first(buffers, klass)]

    def cost(groups: List[List[Buffer]]) -> int:
        return sum(max(as_size(b.size).at(RANK_BATCH) for b in g) for g in groups)

    return min(plans, key=cost)


#: Groups :func:`_largest_first` tries per buffer (the smallest that could
#: hold it) before opening a new one: bounds its time on big programs.
_SCAN = 96


def _largest_first(buffers: List[Buffer], klass: Callable[[Buffer], Hashable]
                   ) -> List[List[Buffer]]:
    """Largest buffers first (at :data:`memopt.reuse.RANK_BATCH`), each into
    the free group of its class with the least spare memory that admits it:
    no member overlaps it in time, and every member provably fits the
    group's earliest member (which allocates the memory).  Groups are
    scanned smallest first, so the search stops at the first that admits
    the buffer (and after :data:`_SCAN` groups)."""

    sizes = [as_size(b.size) for b in buffers]
    weight = [s.at(RANK_BATCH) for s in sizes]
    order = sorted(range(len(buffers)), key=lambda i: (-weight[i], buffers[i].lower, i))
    lowers: List[List[int]] = []     # per group: members' lowers, sorted
    members: List[List[int]] = []    # per group: buffer indices, by lower
    # class -> sorted [(the group's earliest member's weight, group)]
    by_class: Dict[Hashable, list] = {}
    for i in order:
        buf, size = buffers[i], sizes[i]
        pool = by_class.setdefault(klass(buf), [])
        chosen = None
        start = bisect_left(pool, (weight[i], -1))
        for cap, gid in pool[start:start + _SCAN]:
            lo = lowers[gid]
            k = bisect_left(lo, buf.upper)
            if k and buffers[members[gid][k - 1]].upper > buf.lower:
                continue  # a member overlaps it in time
            first = members[gid][0]
            if buf.lower < buffers[first].lower:
                if not all(sizes[m].provably_le(size) for m in members[gid]):
                    continue
            elif not size.provably_le(sizes[first]):
                continue
            chosen = (cap, gid)
            break
        if chosen is None:
            gid = len(members)
            lowers.append([buf.lower])
            members.append([i])
            insort(pool, (weight[i], gid))
            continue
        gid = chosen[1]
        k = bisect_left(lowers[gid], buf.lower)
        lowers[gid].insert(k, buf.lower)
        members[gid].insert(k, i)
        if k == 0 and weight[i] != chosen[0]:  # a new earliest member
            pool.remove(chosen)
            insort(pool, (weight[i], gid))
    return [[buffers[i] for i in group] for group in members]


def _sweep(buffers: List[Buffer], klass: Callable[[Buffer], Hashable], reverse: bool
           ) -> List[List[Buffer]]:

    if reverse:
        order = sorted(range(len(buffers)),
                       key=lambda i: (-buffers[i].upper, -buffers[i].lower, i))
    else:
        order = sorted(range(len(buffers)),
                       key=lambda i: (buffers[i].lower, buffers[i].upper, i))
    groups: List[List[Buffer]] = []
    capacity: List[Size] = []
    klass_of: List[Hashable] = []
    busy: List[Tuple[int, int]] = []  # (time the group frees up, in sweep direction; group)
    free: Dict[Hashable, Dict[int, list]] = {}  # class -> power -> sorted [(coef, group)]
    for i in order:
        buf = buffers[i]
        now = -buf.upper if reverse else buf.lower
        while busy and busy[0][0] <= now:
            _, gid = heapq.heappop(busy)
            cap = capacity[gid]
            insort(free.setdefault(klass_of[gid], {}).setdefault(cap.power, []),
                   (cap.coefficient, gid))
        size = as_size(buf.size)
        k = klass(buf)
        best = None  # (rank key, gid, power, index)
        for power, pool in free.get(k, {}).items():
            if reverse:
                # largest group that buf provably holds: power <= buf's, coef <= buf's
                if power > size.power:
                    continue
                j = bisect_right(pool, (size.coefficient, len(groups))) - 1
                if j < 0:
                    continue
                coef, gid = pool[j]
                key = (-Size(coef, power).at(RANK_BATCH), gid)
            else:
                # smallest group that provably holds buf
                if power < size.power:
                    continue
                j = bisect_left(pool, (size.coefficient, -1))
                if j >= len(pool):
                    continue
                coef, gid = pool[j]
                key = (Size(coef, power).at(RANK_BATCH), gid)
            if best is None or key < best[0]:
                best = (key, gid, power, j)
        if best is None:
            gid = len(groups)
            groups.append([buf])
            capacity.append(size)
            klass_of.append(k)
        else:
            _, gid, power, j = best
            free[k][power].pop(j)
            groups[gid].append(buf)
            if reverse:
                capacity[gid] = size
        heapq.heappush(busy, (buf.lower if reverse else buf.upper, gid))
    if reverse:
        for g in groups:
            g.reverse()
    return groups
