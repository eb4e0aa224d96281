"""Offset planning: every buffer gets a byte offset in one arena.

Buffers live at the same time step (half-open intervals ``[lower, upper)``
that intersect) must not overlap in ``[offset, offset + size)``; a plan costs
its *height*, ``max(offset + size)``.  No plan can be lower than the peak of
live bytes (:func:`memopt.bounds.peak_live_bytes`).

Three layers, each usable alone:

1. **Heuristics** (:data:`HEURISTICS`): one ordering rule and one placement
   rule each, a few lines apiece, as in TFLite's arena planner and XLA's heap
   simulator:

   ``tflite_size``    decreasing size, best fit (TFLite's greedy by size);
   ``xla_spatial``    decreasing size, then longer life, best fit (XLA's
                      ``GlobalDecreasingSizeBestFitHeap``, spatial order);
   ``xla_temporal``   longer life, then larger size, best fit (XLA, temporal);
   ``first_fit``      by start time, lowest gap that fits (an online allocator);
   ``size_first_fit`` decreasing size, lowest gap that fits.

   *Best fit* takes the smallest gap between buffers already placed (and live
   at the same time) that is large enough, else the top; *first fit* the
   lowest such gap.

2. **Chooser** (:func:`choose`): runs several heuristics and keeps the lowest
   plan (ties: the first in the list), as XLA does.

3. **Search** (:class:`CanonicalSearch`): a branch and bound over
   *canonical* (compacted) solutions in the manner of MiniMalloc, with its
   section bounds, decomposition into independent time ranges, a memo of
   failed sub-problems and restarts over several value orders and two
   branching rules.  Its node loop is :mod:`memopt._search_kernel`, compiled
   by numba when installed (an optional dependency; plain Python otherwise,
   same plans, 50 to 120 times slower).

:func:`plan_arena` puts them together.  ``mode="heuristic"``: the chooser.
``mode="default"`` (about a second): the chooser; if its plan is not within
``tolerance`` of the lower bound, greedy descents of the search, then the
search at 8.3 % and 4 % above the bound, at the bound itself and at the capacity if
one is given, and a bisection between what fails and what fits.
``mode="exact"``: the same schedule with a minute and a million nodes; a plan
is *proven optimal* when its height equals the peak-live bound or the search
exhausted every plan one size quantum lower.

Real program traces are easy (greedy by size is on the bound or within a few
hundredths of a percent); interval problems built to be hard (the MiniMalloc
"challenging" set) are not: see ``benchmarks/bench_planner.py``.

Every plan is checked by the independent :func:`memopt.simulate.check_offsets`
before it is returned.  Deterministic: same input, same plan (the search has
a node budget besides its time limit; only a time limit that strikes first
can make two runs differ).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from .bounds import peak_live_bytes
from .problems import Buffer, Problem, size_at
from .simulate import check_offsets

__all__ = [
    "ArenaPlan",
    "HEURISTICS",
    "run_heuristic",
    "choose",
    "plan_arena",
    "CanonicalSearch",
]

log = logging.getLogger(__name__)


@dataclass
class ArenaPlan:
    """Offsets of every buffer in one arena.

    Attributes
    ----------
    offsets : buffer id -> offset in bytes.
    height : ``max(offset + size)`` in bytes.
    strategy : what produced it: a heuristic's name or ``"canonical_search"``.
    lower_bound : a lower bound on any plan's height (peak live bytes, or a
        better one the search proved); ``height == lower_bound`` means optimal.
    optimal : True when the height is proven optimal.
    seconds : wall time spent planning.
    trials : ``(strategy, height, seconds)`` of every method tried, in order.
    """

    offsets: Dict[Hashable, int]
    height: int
    strategy: str = ""
    lower_bound: int = 0
    optimal: bool = False
    seconds: float = 0.0
    trials: List[Tuple[str, int, float]] = field(default_factory=list)

    @property
    def gap(self) -> float:
        """Height over lower bound minus one (0.0 when on the bound)."""
        if self.lower_bound <= 0:
            return 0.0
        return self.height / self.lower_bound - 1.0


# -- problem arrays ------------------------------------------------------------

@dataclass
class _Arrays:
    """The problem as numpy arrays (sizes in bytes)."""

    ids: list
    lower: np.ndarray
    upper: np.ndarray
    size: np.ndarray

    @classmethod
    def of(cls, buffers: Sequence[Buffer], batch_size: Optional[int]) -> "_Arrays":
        n = len(buffers)
        return cls([b.id for b in buffers],
                   np.fromiter((b.lower for b in buffers), np.int64, n),
                   np.fromiter((b.upper for b in buffers), np.int64, n),
                   np.fromiter((size_at(b.size, batch_size) for b in buffers), np.int64, n))

    def __len__(self) -> int:
        return len(self.ids)


# -- heuristics ----------------------------------------------------------------

def _order_tflite_size(a: _Arrays) -> np.ndarray:
    return np.lexsort((np.arange(len(a)), a.lower, -a.size))


def _order_xla_spatial(a: _Arrays) -> np.ndarray:
    return np.lexsort((np.arange(len(a)), a.lower, -(a.upper - a.lower), -a.size))


def _order_xla_temporal(a: _Arrays) -> np.ndarray:
    return np.lexsort((np.arange(len(a)), a.lower, -a.size, -(a.upper - a.lower)))


def _order_by_start(a: _Arrays) -> np.ndarray:
    return np.lexsort((np.arange(len(a)), -a.size, a.upper, a.lower))


#: name -> (ordering rule, placement rule)
HEURISTICS: Dict[str, Tuple[Callable[[_Arrays], np.ndarray], str]] = {
    "tflite_size": (_order_tflite_size, "best"),
    "xla_spatial": (_order_xla_spatial, "best"),
    "xla_temporal": (_order_xla_temporal, "best"),
    "first_fit": (_order_by_start, "first"),
    "size_first_fit": (_order_tflite_size, "first"),
}


def _overlaps(a: _Arrays) -> List[np.ndarray]:
    """For every buffer, the indices of the buffers live at some same step."""
    n = len(a)
    rows: List[np.ndarray] = []
    block = max(1, 2_000_000 // max(n, 1))
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        hit = (a.lower[r0:r1, None] < a.upper[None, :]) & (a.upper[r0:r1, None] > a.lower[None, :])
        rows.extend(np.flatnonzero(row) for row in hit)
    return rows


def _place(a: _Arrays, order: np.ndarray, fit: str,
           overlaps: Optional[List[np.ndarray]] = None) -> np.ndarray:
    """Offsets for buffers taken in ``order``, each at the best or first gap.

    A gap is the free space between the buffers already placed that are live
    at the same time as the new one, sorted by offset (and the space above
    them all, which always fits).
    """
    n = len(a)
    if overlaps is None:
        overlaps = _overlaps(a)
    offsets = np.zeros(n, dtype=np.int64)
    tops = np.zeros(n, dtype=np.int64)
    size = a.size
    placed = np.zeros(n, dtype=bool)
    best_fit = fit == "best"
    for i in order.tolist():
        need = int(size[i])
        near = overlaps[i]
        idx = near[placed[near]]
        placed[i] = True
        if need and len(idx):
            los = offsets[idx]
            sort = los.argsort(kind="stable")
            los = los[sort]
            reach = np.maximum.accumulate(tops[idx[sort]])  # highest top so far
            below = np.empty_like(reach)  # free from here ...
            below[0] = 0
            below[1:] = reach[:-1]
            gaps = los - below  # ... up to the next buffer's offset
            fitting = (gaps >= need).nonzero()[0]
            if len(fitting) == 0:
                offsets[i] = reach[-1]
            elif best_fit:
                offsets[i] = below[fitting[gaps[fitting].argmin()]]
            else:
                offsets[i] = below[fitting[0]]
        tops[i] = offsets[i] + need
    return offsets


def _height(a: _Arrays, offsets: np.ndarray) -> int:
    return int((offsets + a.size).max()) if len(a) else 0


def run_heuristic(buffers: Sequence[Buffer], name: str,
                  batch_size: Optional[int] = None) -> ArenaPlan:
    """Plan with one heuristic of :data:`HEURISTICS` (checked before return)."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown heuristic {name!r}: expected one of "
                         f"{', '.join(HEURISTICS)}")
    start = time.perf_counter()
    a = _Arrays.of(buffers, batch_size)
    order_rule, fit = HEURISTICS[name]
    offsets = _place(a, order_rule(a), fit)
    plan = _plan_from(a, offsets, name, start)
    check_offsets(buffers, plan.offsets, batch_size=batch_size)
    return plan


def _plan_from(a: _Arrays, offsets: np.ndarray, strategy: str, start: float) -> ArenaPlan:
    height = _height(a, offsets)
    seconds = time.perf_counter() - start
    return ArenaPlan(dict(zip(a.ids, offsets.tolist())), height, strategy,
                     seconds=seconds, trials=[(strategy, height, seconds)])


def choose(buffers: Sequence[Buffer], names: Sequence[str] = tuple(HEURISTICS),
           batch_size: Optional[int] = None, *, stop_at: Optional[int] = None,
           check: bool = True) -> ArenaPlan:
    """Run the named heuristics and keep the lowest plan (ties: the first).

    ``stop_at``: a height good enough (for example the lower bound); the
    chooser stops at the first heuristic that reaches it.  ``check=False``
    leaves the check to the caller.
    """
    start = time.perf_counter()
    a = _Arrays.of(buffers, batch_size)
    near = _overlaps(a)
    best = None
    trials = []
    for name in names:
        if name not in HEURISTICS:
            raise ValueError(f"unknown heuristic {name!r}: expected one of "
                             f"{', '.join(HEURISTICS)}")
        t0 = time.perf_counter()
        order_rule, fit = HEURISTICS[name]
        offsets = _place(a, order_rule(a), fit, near)
        height = _height(a, offsets)
        trials.append((name, height, time.perf_counter() - t0))
        if best is None or height < best[0]:
            best = (height, name, offsets)
        if stop_at is not None and height <= stop_at:
            break
    if best is None:
        raise ValueError("choose() needs at least one heuristic name")
    plan = _plan_from(a, best[2], best[1], start)
    plan.trials = trials
    if check:
        check_offsets(buffers, plan.offsets, batch_size=batch_size)
    return plan


# -- canonical branch and bound ------------------------------------------------

FOUND, INFEASIBLE, LIMIT = "found", "infeasible", "limit"

#: Strategies the search cycles through on restarts: a value order, then
#: ``/`` and a rule.  Letters name keys by which candidate buffers are tried,
#: all descending: Z size, W lifetime, A area (size x lifetime), T the most
#: bytes live in any of the buffer's sections.  ``B<k>`` is the blended score
#: log(size) + log(lifetime) / 2, with seeded normal noise of deviation 1
#: when ``k > 0`` (deterministic restarts).  Rules: none, branch at the
#: section with the fewest candidates; ``s``, at the one with the least
#: slack; ``m``, MiniMalloc's placement order instead (buffers by lowest
#: offset, then value order; see :func:`memopt._search_kernel.place_in_order`).
#: No rule wins everywhere: on the MiniMalloc set ``m`` closes A, C, D, F, G,
#: J and K in a few thousand nodes where the section rules need far more,
#: and the section rules close E, H and I first.
SEARCH_ORDERS = ("TWA/m", "B0", "WAT/m", "B0/s", "TAW/m", "ZW", "ZW/s", "TZW", "TZW/s")

#: The strategies for a capacity above the lower bound, where the greedy
#: value orders with the cheapest nodes usually succeed in their first run
#: (on the MiniMalloc set at 4 % above the bound).
EASY_ORDERS = ("ZW", "B0", "B0/s", "TAW/m", "TWA/m", "WAT/m", "ZW/s", "TZW", "TZW/s")

#: The orders of the greedy descents that open the search.
DIVE_ORDERS = ("B0/s", "ZW", "TWA/m", "B0", "TAW/m", "ZW/s")


def _luby(i: int) -> int:
    """The i-th term (from 1) of the Luby sequence 1 1 2 1 1 2 4 1 1 2 ..."""
    k = 1
    while (1 << k) - 1 < i:
        k += 1
    while True:
        if i == (1 << k) - 1:
            return 1 << (k - 1)
        i -= (1 << (k - 1)) - 1
        k = 1
        while (1 << k) - 1 < i:
            k += 1


def _strategies(first: Sequence[str]):
    """``first``, then seeded blended orders under every rule, forever."""
    yield from first
    seed = 1
    while True:
        for name in (f"B{seed}", f"B{seed}/m", f"B{seed}/s"):
            if name not in first:
                yield name
        seed += 1


class CanonicalSearch:
    """Does a set of buffers fit in ``capacity`` bytes?  Branch and bound.

    Time is cut into *sections*: the stretches between consecutive buffer
    starts and ends, in which the set of live buffers is constant.  The
    search builds *canonical* solutions, the ideas of MiniMalloc (Moffitt,
    ASPLOS 2023) in a formulation of our own:

    - **Gravity.**  Any plan can be turned into one no higher where every
      buffer sits at offset 0 or directly on a buffer it overlaps in time.
      Taken in order of offset, such a plan places each buffer exactly at the
      *floor* of its sections (the top of what is already placed there), so
      only those offsets are ever tried.
    - **Lowest point first.**  Each node takes the lowest floor ``m`` over
      the sections that still have unplaced buffers and the section ``s`` at
      ``m`` with the fewest candidates (then the least slack).  Either a
      buffer whose floor is ``m`` covers ``s`` and sits at ``m`` (one branch
      per such buffer, in the value order), or nothing sits at ``(s, m)`` and
      the floor of ``s`` rises to the lowest offset its next buffer can take
      (one more branch).  The branches are disjoint and together complete.
      Sections at ``m`` that no buffer can occupy rise without branching.
    - **Section bounds.**  In every section the unplaced bytes must fit
      between the floor and the capacity, where the floor counts at least the
      lowest floor of any unplaced buffer covering the section (each of those
      sits at or above its own floor).
    - **Decomposition.**  When no unplaced buffer spans the boundary between
      two sections, the two sides are independent and solved one after the
      other; a side that fails fails the node (no retrying its neighbour).
    - **Memo.**  A failed sub-problem (same sections, floors and unplaced
      buffers) is remembered, across restarts at the same capacity, and not
      searched again (a table of 2 x 40-bit hashes).

    The rule ``m`` of :data:`SEARCH_ORDERS` branches the other way, as
    MiniMalloc does: buffers are placed in order of offset (then value
    order), each at its floor, trying every unplaced buffer that keeps that
    order and leaves no gap some buffer could fill; see
    :func:`memopt._search_kernel.place_in_order`.  It has the same bounds and
    decomposition, no memo, and wins on other problems.

    Candidates at a node are tried in a static value order.  The run time of
    such a search is heavy-tailed: one order finds a plan in a hundred nodes
    where its neighbours fail in twenty thousand.  So :meth:`solve` restarts
    -- :data:`SEARCH_ORDERS`, then seeded random orders under every rule,
    forever -- with node limits following the Luby sequence
    (a few descents' worth each, now and then more); the memo of failed
    sub-problems carries over.

    The nodes run in :mod:`memopt._search_kernel`, compiled by numba when it
    is installed (plain Python otherwise: same plans, 50 to 120 times
    slower).
    """

    #: Slots of the memo of failed sub-problems (a power of two).
    MEMO_SLOTS = 1 << 20

    def __init__(self, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> None:
        lower = np.asarray(lower, dtype=np.int64)
        upper = np.asarray(upper, dtype=np.int64)
        points = np.unique(np.concatenate([lower, upper]))
        self.n = n = len(size)
        self.sections = S = max(len(points) - 1, 0)
        s0 = np.searchsorted(points, lower).astype(np.int64)
        s1 = np.searchsorted(points, upper).astype(np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        self.life = upper - lower
        self.quantum = int(np.gcd.reduce(self.size)) if n else 1
        # the kernel numbers buffers by first section: those starting in a
        # range of sections are then a range of numbers
        self._perm = perm = np.argsort(s0, kind="stable")
        self._s0, self._s1, self._size = s0[perm], s1[perm], self.size[perm]
        self._buf_at = np.searchsorted(self._s0, np.arange(S + 1)).astype(np.int64)
        lengths = self._s1 - self._s0
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        section = (np.arange(len(owner), dtype=np.int64)  # each buffer's sections in turn
                   - np.repeat(np.cumsum(lengths) - lengths, lengths)
                   + np.repeat(self._s0, lengths))
        by_section = np.lexsort((owner, section))
        self._sec_buf = owner[by_section]
        self._sec_ptr = np.searchsorted(section[by_section], np.arange(S + 1)).astype(np.int64)
        lo_p, hi_p = lower[perm], upper[perm]
        overlap = (lo_p[:, None] < hi_p[None, :]) & (hi_p[:, None] > lo_p[None, :])
        np.fill_diagonal(overlap, False)
        self._ovl_ptr = np.concatenate(([0], np.cumsum(overlap.sum(1)))).astype(np.int64)
        self._ovl_buf = np.nonzero(overlap)[1].astype(np.int64)
        self.total = np.zeros(S, dtype=np.int64)
        if n:
            np.add.at(self.total, section, self._size[owner])
        self.peak = int(self.total.max()) if S else 0
        # per section: buffers crossing into the next one (the kernel's
        # starting state, copied for each run)
        crossing = np.zeros(S + 1, dtype=np.int64)
        np.add.at(crossing, self._s0, 1)
        np.add.at(crossing, self._s1 - 1, -1)
        self._crossing = np.cumsum(crossing)[:S]
        most = np.array([self.total[s0[i]:s1[i]].max() for i in range(n)], dtype=np.int64)
        self._keys = {"Z": -self.size, "W": -self.life, "A": -self.size * self.life,
                      "T": -most}
        self._ranks: Dict[str, np.ndarray] = {}
        #: the blended order's score: log(size) + life_weight * log(lifetime),
        #: plus noise * N(0, 1) for a seeded order ``B<k>``, ``k > 0``
        self.life_weight, self.noise = 0.5, 1.0
        self.nodes = 0
        self._rate: Dict[bool, float] = {}  # nodes per second, measured, per kernel
        self._failed_for: Optional[int] = None
        self._memo: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._memo_used = 0  # entries in the memo

    def rank(self, name: str) -> np.ndarray:
        """Position of every buffer in the value order ``name`` (see
        :data:`SEARCH_ORDERS`)."""
        if name not in self._ranks:
            n = self.n
            if name.startswith("B"):
                score = (np.log(np.maximum(self.size, 1))
                         + self.life_weight * np.log(np.maximum(self.life, 1)))
                seed = int(name[1:] or 0)
                if seed:
                    score = score + self.noise * np.random.default_rng(seed).standard_normal(n)
                order = np.lexsort((np.arange(n), -score))
            else:
                order = np.lexsort([np.arange(n)] + [self._keys[c] for c in reversed(name)])
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n)
            self._ranks[name] = rank
        return self._ranks[name]

    # -- driver --------------------------------------------------------------
    def solve(self, capacity: int, node_budget: int, deadline: Optional[float] = None,
              orders: Sequence[str] = SEARCH_ORDERS) -> Tuple[str, Optional[np.ndarray]]:
        """Search for offsets with every top at most ``capacity``.

        Returns ``(FOUND, offsets)``, ``(INFEASIBLE, None)`` when the search
        space was exhausted (no plan fits: a proof), or ``(LIMIT, None)``
        when ``node_budget`` nodes or the ``deadline`` (a
        ``time.perf_counter()`` value) ran out first.  The deadline is checked
        between restarts, whose node limits are also cut to what the measured
        speed can do before it.
        """
        self.nodes = 0
        if self.n == 0:
            return FOUND, np.zeros(0, dtype=np.int64)
        if self.peak > capacity:
            return INFEASIBLE, None
        if self._failed_for != capacity or self._memo is None:
            self._failed_for, self._memo = capacity, None  # proofs hold per capacity
        base = 3 * (self.n + self.sections)  # a few descents' worth of nodes
        for run, name in enumerate(_strategies(orders)):
            left = node_budget - self.nodes
            if left <= 0 or (deadline is not None and time.perf_counter() > deadline):
                return LIMIT, None
            status, offsets = self._run(capacity, name, min(base * _luby(run + 1), left),
                                        deadline)
            if status != LIMIT:
                return status, offsets
        return LIMIT, None  # pragma: no cover - the strategies never run out

    def dive(self, strategy: str = SEARCH_ORDERS[0],
             deadline: Optional[float] = None) -> Optional[np.ndarray]:
        """One greedy descent with no capacity: a good plan in about n nodes.

        ``strategy`` as in :data:`SEARCH_ORDERS`.  None when the ``deadline``
        came first.
        """
        self._failed_for, self._memo = None, None
        self.nodes = 0
        status, offsets = self._run(int(self.size.sum()) + 1, strategy,
                                    64 * (self.n + self.sections) + 64, deadline)
        return offsets if status == FOUND else None

    def _run(self, capacity: int, strategy: str, limit: int,
             deadline: Optional[float]) -> Tuple[str, Optional[np.ndarray]]:
        """One run of the kernel from the root with at most ``limit`` nodes;
        ``strategy`` as in :data:`SEARCH_ORDERS` (value order, then the rule:
        ``/s`` least slack first, ``/m`` MiniMalloc's placement order)."""
        from . import _search_kernel as kernel

        n, S = self.n, self.sections
        order, _, rule = strategy.partition("/")
        # place_in_order sorts by offset * n + position in int64
        in_order = rule == "m" and capacity <= (1 << 62) // (n + 1)
        # a guess until measured: 2e7 (compiled) or 1e5 buffer-steps a second
        rate = self._rate.get(in_order,
                              (2e7 if kernel.JIT else 1e5) / max(n + S, 1))
        if deadline is not None:
            # the kernel cannot look at the clock: cut the run to what fits
            # (half of it: nodes get dearer as the capacity gets tighter)
            left = deadline - time.perf_counter()
            limit = min(limit, max(int(rate * left / 2), 64))
        if self._memo is None:
            self._memo = (np.zeros(self.MEMO_SLOTS, np.int64),
                          np.zeros(self.MEMO_SLOTS, np.int64))
            self._memo_used = 0
        ctl = np.zeros(kernel.CONTROL_SLOTS, dtype=np.int64)
        ctl[kernel.CAPACITY] = capacity
        ctl[kernel.LIMIT_AT] = limit
        ctl[kernel.LEAST_SLACK] = int(rule == "s")
        ctl[kernel.MEMO_USED] = self._memo_used
        offsets = np.zeros(n, dtype=np.int64)
        t0 = time.perf_counter()
        depth = sys.getrecursionlimit()
        if not kernel.JIT:  # a Python frame per node of a path
            sys.setrecursionlimit(max(depth, 4 * (n + S) + 1000))
        rank = self.rank(order)[self._perm]
        state = (np.zeros(S, dtype=np.int64), self.total.copy(), self._crossing.copy(),
                 np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), offsets)
        if in_order:
            call = (kernel.place_in_order, 0, S, 0, -1, 1, self._s0, self._s1, self._size,
                    rank, np.argsort(rank, kind="stable"), self._buf_at, self._sec_ptr,
                    self._sec_buf, self._ovl_ptr, self._ovl_buf, *state, ctl)
        else:
            call = (kernel.solve_range, 0, S, self._s0, self._s1, self._size, rank,
                    self._buf_at, self._sec_ptr, self._sec_buf, self._ovl_ptr, self._ovl_buf,
                    *state, np.zeros(S, dtype=np.int64), np.zeros(S, dtype=np.int64), ctl,
                    *self._memo)
        try:
            status = _deep_call(*call) if n + S > 1000 else call[0](*call[1:])
        finally:
            sys.setrecursionlimit(depth)
        self._memo_used = int(ctl[kernel.MEMO_USED])
        used = int(min(ctl[kernel.NODES], limit))
        self.nodes += used
        spent = time.perf_counter() - t0
        if used >= 200 and spent > 0.001:
            self._rate[in_order] = used / spent
        if status == kernel.LIMIT:
            return LIMIT, None
        if status == kernel.FAIL:
            return INFEASIBLE, None
        out = np.empty(n, dtype=np.int64)
        out[self._perm] = offsets
        return FOUND, out


#: Stack of the thread that runs a deep search (virtual memory: only the
#: pages a search reaches are used).  The kernels recurse once per node of a
#: path, up to buffers + sections deep: more than the main thread's 8 MiB
#: allow for a few thousand buffers.
DEEP_STACK_BYTES = 1 << 30


def _deep_call(fn, *args):
    """``fn(*args)`` in a thread with a stack of :data:`DEEP_STACK_BYTES`."""
    out: list = []

    def run() -> None:
        try:
            out.append((True, fn(*args)))
        except BaseException as error:  # handed to the caller below
            out.append((False, error))

    before = threading.stack_size(DEEP_STACK_BYTES)
    try:
        worker = threading.Thread(target=run, name="memopt-arena-search")
        worker.start()
    finally:
        threading.stack_size(before)
    worker.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


# -- the planner -----------------------------------------------------------------

#: The search (its matrices are buffers x buffers) runs on independent groups
#: of at most this many buffers; larger problems get the chooser's plan.
MAX_SEARCH_BUFFERS = 5000

#: Default settings per mode: (seconds at most, nodes per buffer at most).
MODES = {
    "heuristic": (0.0, 0),
    "default": (0.9, 1000),
    "exact": (60.0, 1_000_000),
}


def _partitions(a: _Arrays, live: np.ndarray) -> List[np.ndarray]:
    """Indices (into ``a``) of independent groups: no buffer spans a cut."""
    idx = live[np.lexsort((a.upper[live], a.lower[live]))]
    parts: List[List[int]] = []
    reach = None
    for i in idx.tolist():
        if reach is None or a.lower[i] >= reach:
            parts.append([])
            reach = int(a.upper[i])
        parts[-1].append(i)
        reach = max(reach, int(a.upper[i]))
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


class _Part:
    """One independent group of buffers with its search and best plan so far."""

    def __init__(self, a: _Arrays, idx: np.ndarray, offsets: np.ndarray) -> None:
        self.idx = idx
        self.size = a.size[idx]
        self.search = CanonicalSearch(a.lower[idx], a.upper[idx], self.size)
        self.best = offsets[idx].copy()
        self.height = int((self.best + self.size).max())

    def offer(self, offsets: np.ndarray) -> None:
        height = int((offsets + self.size).max())
        if height < self.height:
            self.best, self.height = offsets, height


def plan_arena(problem, *, mode: str = "default", capacity: Optional[int] = None,
               time_limit: Optional[float] = None, node_budget: Optional[int] = None,
               tolerance: float = 0.001, batch_size: Optional[int] = None) -> ArenaPlan:
    """Offsets for every buffer of ``problem`` in one arena, as low as it can.

    Parameters
    ----------
    problem : a :class:`~memopt.problems.Problem` or a sequence of buffers.
    mode : ``"heuristic"`` (the chooser only), ``"default"`` (the chooser,
        greedy descents of the canonical search, then a short branch and bound
        toward the lower bound; about a second at most) or ``"exact"``
        (branch and bound until optimal or ``time_limit``).
    capacity : bytes the plan must fit in (default: the problem's capacity,
        if any).  The search aims below it; a plan above it raises.
    time_limit : seconds for the search (default 0.9 for ``"default"``, 60 for
        ``"exact"``); a safety net -- the node budget keeps runs
        deterministic.  The first search in a process also loads the
        compiled kernel (about 0.8 s with numba), which is not counted.
    node_budget : search nodes in all (default: 1,000 per buffer in the default
        mode, a million in the exact mode).
    tolerance : outside the exact mode, planning stops as soon as a plan is
        within this fraction of the lower bound (0.001: 0.1 %): the chooser
        stops at the first such heuristic and no search is run.  The exact
        mode always searches until the plan is proven optimal.
    batch_size : for symbolic sizes.

    Returns
    -------
    ArenaPlan
        Checked by :func:`memopt.simulate.check_offsets`.  ``optimal`` is
        True when the height equals the lower bound or the search proved
        that nothing lower fits.

    Raises
    ------
    PlanError
        No plan found within ``capacity``.
    ValueError
        An unknown ``mode``.
    """
    from .errors import PlanError

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    if isinstance(problem, Problem):
        buffers = problem.buffers
        if capacity is None:
            capacity = problem.capacity
    else:
        buffers = list(problem)
    default_time, per_buffer = MODES[mode]
    limit_s = default_time if time_limit is None else time_limit
    start = time.perf_counter()
    deadline = start + limit_s
    a = _Arrays.of(buffers, batch_size)
    budget = per_buffer * max(len(a), 1) if node_budget is None else node_budget

    lower_bound = peak_live_bytes(buffers, batch_size)
    good_enough = lower_bound if mode == "exact" else int(lower_bound * (1 + tolerance))
    base = choose(buffers, batch_size=batch_size, stop_at=good_enough, check=False)
    trials = list(base.trials)
    offsets = np.array([base.offsets[i] for i in a.ids], dtype=np.int64)
    height = _height(a, offsets)
    strategy = base.strategy
    proven = height <= lower_bound
    close_enough = mode != "exact" and height <= good_enough

    parts: List[_Part] = []
    if mode != "heuristic" and not proven and not close_enough:
        live = np.flatnonzero(a.size > 0)
        groups = _partitions(a, live)
        if max((len(idx) for idx in groups), default=0) > MAX_SEARCH_BUFFERS:
            log.info("arena search skipped: a group of more than %d buffers",
                     MAX_SEARCH_BUFFERS)
            groups = []
        parts = [_Part(a, idx, offsets) for idx in groups]
    if parts:
        deadline += _load_kernels()
        t0 = time.perf_counter()
        lower_bound, proven, used = _improve(parts, lower_bound, capacity, mode, budget,
                                             deadline, trials)
        searched = max(p.height for p in parts)
        trials.append(("canonical_search", searched, time.perf_counter() - t0))
        if searched < height:
            for part in parts:
                offsets[part.idx] = part.best
            height = _height(a, offsets)
            strategy = "canonical_search"
        log.debug("arena search: %d nodes, height %d, bound %d", used, height, lower_bound)

    plan = ArenaPlan(dict(zip(a.ids, offsets.tolist())), height, strategy,
                     lower_bound=lower_bound, optimal=proven or height <= lower_bound,
                     seconds=time.perf_counter() - start, trials=trials)
    check_offsets(buffers, plan.offsets, batch_size=batch_size)
    if capacity is not None and plan.height > capacity:
        raise PlanError(
            f"no plan found within the capacity of {capacity} bytes: the best is "
            f"{plan.height} bytes high (lower bound {lower_bound}); try "
            "mode='exact' or a longer time_limit")
    return plan


_kernels_loaded = False


def _load_kernels() -> float:
    """Run both search kernels once on a tiny problem; the seconds it took.

    With numba the first call in a process loads the compiled code from its
    cache (about 0.8 s with numba's own import; the first run on a machine
    compiles it, tens of seconds).  :func:`plan_arena` does not count that
    against its time limit.  Returns 0.0 once done.
    """
    global _kernels_loaded
    if _kernels_loaded:
        return 0.0
    start = time.perf_counter()
    tiny = CanonicalSearch(np.array([0, 1]), np.array([2, 3]), np.array([1, 1]))
    for strategy in ("B0", "B0/m"):
        tiny.solve(2, 100, orders=(strategy,))
    _kernels_loaded = True
    return time.perf_counter() - start


def _improve(parts: List[_Part], lower_bound: int, capacity: Optional[int], mode: str,
             budget: int, deadline: float, trials: list) -> Tuple[int, bool, int]:
    """Lower the parts' heights by searching at decreasing capacities.

    The schedule: greedy descents; in the default mode one run of the search
    at the lower bound (25 % of the time at most), then the search at 8.3 %,
    then 4 % above the lower bound (or the capacity if lower; 30 % and 40 %
    of the time left); the
    search at the lower bound (60 % of the time left), then at the capacity
    if one is given, in the exact mode then at 4 % above the bound; more
    greedy descents if nothing is close yet; then a bisection between the
    highest capacity that failed and the best height found.
    Appends the descents' result to ``trials``.  Returns the (possibly
    raised) lower bound, whether the final height is proven optimal, and the
    nodes used.
    """
    quantum = int(np.gcd.reduce([p.search.quantum for p in parts])) if parts else 1
    used = 0

    def attempt(target: int, nodes: int, share: float) -> str:
        """Fit every part within ``target`` using at most ``nodes`` nodes and
        ``share`` of the time left: FOUND, INFEASIBLE or LIMIT.  The parts
        are independent: each one that fits keeps its plan, whatever the
        others do, and each gets an equal part of what is left.  Above the
        lower bound the restarts open with :data:`EASY_ORDERS`."""
        nonlocal used
        now = time.perf_counter()
        until = now + share * max(deadline - now, 0.0)
        pending = [p for p in parts if p.height > target]
        outcome = FOUND
        for k, part in enumerate(pending):
            now = time.perf_counter()
            mine = now + max(until - now, 0.0) / (len(pending) - k)
            status, offs = part.search.solve(
                target, max(nodes // len(pending), 1), mine,
                SEARCH_ORDERS if target <= lower_bound else EASY_ORDERS)
            used += part.search.nodes
            if status == FOUND:
                part.offer(offs)
            elif outcome != INFEASIBLE:
                outcome = status
        return outcome

    def best() -> int:
        return max(p.height for p in parts)

    def dive(orders: Sequence[str]) -> None:
        t0 = time.perf_counter()
        for part in parts:
            for order in orders:
                dived = part.search.dive(order, deadline)
                if dived is not None:
                    part.offer(dived)
        trials.append(("canonical_dive", best(), time.perf_counter() - t0))

    near = lower_bound + lower_bound // 25 // quantum * quantum  # 4 % above
    lo = lower_bound - quantum  # highest capacity known (or assumed) too small
    dive(DIVE_ORDERS[:3])
    first = near if capacity is None else max(lower_bound, min(near, capacity))
    # the default mode first makes sure of a plan close to the bound (often a
    # few hundred nodes); then, as the exact mode does first, the bound itself:
    # the portfolio of restarts often reaches it in a few thousand nodes, and
    # then the plan is proven optimal
    targets = []
    if mode != "exact":
        wide = lower_bound + lower_bound // 12 // quantum * quantum  # 8.3 % above
        if capacity is not None:
            wide = max(lower_bound, min(wide, capacity))
        # a first shot at the bound: the first strategy's run, which often
        # lands on it (6 of the 11 MiniMalloc problems)
        shot = 3 * sum(p.search.n + p.search.sections for p in parts)
        targets += [(lower_bound, shot, 0.25), (wide, budget // 8, 0.3),
                    (first, budget // 4, 0.4)]
    targets.append((lower_bound, budget // 2, 0.6))
    if capacity is not None and lower_bound < capacity:
        targets.append((capacity, budget // 4, 0.5))
    if mode == "exact":
        targets.append((first, budget // 4, 0.5))
    for target, nodes, share in targets:
        if best() <= target or time.perf_counter() > deadline or used >= budget:
            continue
        status = attempt(target, nodes, share)
        if status == INFEASIBLE:
            lower_bound = max(lower_bound, target + quantum)
        if status != FOUND:
            lo = max(lo, target)
    if best() > near:  # nothing close yet: more greedy descents
        dive(DIVE_ORDERS[3:])
    # bisection between what failed and what fits
    while used < budget and time.perf_counter() < deadline:
        hi = best()
        if hi - lo <= quantum:
            break
        target = lo + (hi - lo) // 2 // quantum * quantum
        if target <= lo:
            target = lo + quantum
        status = attempt(target, max((budget - used) // 4, 1), 0.5)
        if status == INFEASIBLE:
            lower_bound = max(lower_bound, target + quantum)
        if status != FOUND:
            lo = target
    height = best()
    return lower_bound, height <= lower_bound, used
