"""The one liveness analysis of the project.

Backward dataflow liveness over any control-flow graph, loops included.  A
variable is *live* at a point when some path from that point reads it before
writing it.  Everything in memopt and autobatch that needs to know "is this
value still needed here?" asks this module.

The input is generic: a list of :class:`FlowNode` (what a node reads, what it
writes, which nodes may run next) over any hashable variable keys.  Adapters
turn programs into nodes: :func:`analyze_graph` does it for a
:class:`memopt.graph.Graph` (nested while / conditional sub-blocks become
loops and branches), and :mod:`autobatch.allocation_strategy` does it for
autobatch instruction blocks.

Semantics
---------
For node ``n``::

    live_out(n) = union(live_in(s) for s in successors(n))   (+ live_at_exit
                                                              if n has none)
    live_in(n)  = reads(n) | (live_out(n) - writes(n))

A node that both reads and writes a variable keeps it live above it (the read
wins).  The least fixed point is computed, so a value read in the next
iteration of a loop is live across the back edge and through the whole loop.

Implementation: nodes are grouped into basic blocks (maximal runs ``i, i+1,
...`` joined by single fall-through edges); the fixed point is computed over
blocks with bitsets (Python ints), and per-node facts are derived on demand by
a backward scan of one block.  Live intervals come from one backward scan of
every block, so a straight-line program of 100,000 nodes is analysed in well
under a second (benchmarks/bench_liveness.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (TYPE_CHECKING, Dict, Hashable, Iterable, List, NamedTuple, Optional, Sequence,
                    Tuple, cast)

if TYPE_CHECKING:
    from .graph import Graph

__all__ = [
    "FlowNode",
    "Interval",
    "Liveness",
    "analyze",
    "GraphLiveness",
    "analyze_graph",
    "StraightLine",
    "program_liveness",
]


@dataclass(frozen=True)
class FlowNode:
    """One node of a control-flow graph.

    ``reads`` and ``writes`` are variable keys (any hashable); ``successors``
    are indices of the nodes that may run next (empty: the program ends here).
    """

    reads: tuple = ()
    writes: tuple = ()
    successors: tuple = ()


@dataclass(frozen=True)
class Interval:
    """The node positions over which a variable holds memory, inclusive.

    ``start`` is the first position where the variable is written or live,
    ``end`` the last where it is read or live.  A variable written and never
    read has ``start == end``.  In a loop, a value carried to the next
    iteration spans the whole loop.  :meth:`overlaps` is the test memory
    sharing must pass: two variables whose intervals do not overlap are never
    live at the same node.
    """

    start: int
    end: int

    def overlaps(self, other: "Interval") -> bool:
        return self.start <= other.end and other.start <= self.end

    @property
    def half_open(self) -> Tuple[int, int]:
        """``(start, end + 1)``: the ``[lower, upper)`` form of the planners."""
        return self.start, self.end + 1


def _bits(mask: int) -> List[int]:
    """Indices of the set bits of ``mask``, ascending (bytewise: fast on wide masks)."""
    if not mask:
        return []
    data = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    out = []
    for i, byte in enumerate(data):
        while byte:
            low = byte & -byte
            out.append(8 * i + low.bit_length() - 1)
            byte ^= low
    return out


def _mask(indices: Iterable[int]) -> int:
    """The bitset with exactly ``indices`` set (linear in their count)."""
    indices = list(indices)
    if not indices:
        return 0
    buf = bytearray((max(indices) >> 3) + 1)
    for i in indices:
        buf[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(buf, "little")


#: Per-node live sets of a block are kept at every CHECKPOINT-th node; a query
#: rescans at most that many nodes.
CHECKPOINT = 64


class Liveness:
    """Result of :func:`analyze`: live sets per node and intervals per key."""

    def __init__(self, nodes: Sequence[FlowNode], live_at_exit: Iterable[Hashable],
                 entry: int) -> None:
        self._nodes = nodes
        n = len(nodes)
        if n and not (0 <= entry < n):
            raise ValueError(f"entry node {entry} is not one of the {n} nodes")
        self._key_index: Dict[Hashable, int] = {}
        self._keys: List[Hashable] = []
        self._reads = [self._ids(node.reads) for node in nodes]
        self._writes = [self._ids(node.writes) for node in nodes]
        self._exit_mask = _mask(self._ids(tuple(live_at_exit)))
        self._check_successors()
        self._build_blocks(entry)
        self._solve()
        self._node_cache: Dict[int, Dict[int, frozenset]] = {}
        self._intervals: Optional[Dict[Hashable, Interval]] = None

    # -- construction -----------------------------------------------------
    def _ids(self, keys: Iterable[Hashable]) -> List[int]:
        ids = []
        for key in keys:
            idx = self._key_index.get(key)
            if idx is None:
                idx = self._key_index[key] = len(self._keys)
                self._keys.append(key)
            ids.append(idx)
        return ids

    def _check_successors(self) -> None:
        n = len(self._nodes)
        for i, node in enumerate(self._nodes):
            for s in node.successors:
                if not (isinstance(s, int) and 0 <= s < n):
                    raise ValueError(f"node {i} names successor {s!r}, which is not "
                                     f"a node index in [0, {n})")

    def _build_blocks(self, entry: int) -> None:
        """Group nodes into basic blocks of consecutive indices."""
        n = len(self._nodes)
        preds = [0] * n
        for node in self._nodes:
            for s in node.successors:
                preds[s] += 1
        starts = []
        for i in range(n):
            prev = self._nodes[i - 1] if i else None
            joins = (i != entry and prev is not None and preds[i] == 1
                     and len(prev.successors) == 1 and prev.successors[0] == i)
            if not joins:
                starts.append(i)
        self._block_start = starts
        self._block_end = [s - 1 for s in starts[1:]] + [n - 1] if starts else []
        self._block_of = [0] * n
        for b, (s, e) in enumerate(zip(self._block_start, self._block_end)):
            for i in range(s, e + 1):
                self._block_of[i] = b
        nb = len(starts)
        self._block_succ = [
            sorted({self._block_of[s] for s in self._nodes[e].successors})
            for e in self._block_end
        ]
        self._block_pred: List[List[int]] = [[] for _ in range(nb)]
        for b, succs in enumerate(self._block_succ):
            for s in succs:
                self._block_pred[s].append(b)

    def _solve(self) -> None:
        """Iterate the block equations to their least fixed point."""
        nb = len(self._block_start)
        use = [0] * nb
        kill = [0] * nb
        for b in range(nb):
            u: set = set()
            k: set = set()
            for i in range(self._block_end[b], self._block_start[b] - 1, -1):
                u.difference_update(self._writes[i])
                k.update(self._writes[i])
                u.update(self._reads[i])
            use[b], kill[b] = _mask(u), _mask(k)
        live_in = [0] * nb
        live_out = [0] * nb
        worklist = list(range(nb))  # popped from the end: last blocks first
        queued = [True] * nb
        while worklist:
            b = worklist.pop()
            queued[b] = False
            out = self._exit_mask if not self._block_succ[b] else 0
            for s in self._block_succ[b]:
                out |= live_in[s]
            live_out[b] = out
            new_in = use[b] | (out & ~kill[b])
            if new_in != live_in[b]:
                live_in[b] = new_in
                for p in self._block_pred[b]:
                    if not queued[p]:
                        queued[p] = True
                        worklist.append(p)
        self._block_in = live_in
        self._block_out = live_out

    # -- queries ------------------------------------------------------------
    def _checkpoints(self, b: int) -> Dict[int, frozenset]:
        """Live-out sets (of key indices) at every CHECKPOINT-th node of block
        ``b`` and at its last node, from one backward scan (cached)."""
        marks = self._node_cache.get(b)
        if marks is None:
            s, e = self._block_start[b], self._block_end[b]
            live = set(_bits(self._block_out[b]))
            marks = {}
            for i in range(e, s - 1, -1):
                if i == e or (i - s) % CHECKPOINT == 0:
                    marks[i] = frozenset(live)
                live.difference_update(self._writes[i])
                live.update(self._reads[i])
            self._node_cache[b] = marks
        return marks

    def _live_out_ids(self, node: int) -> set:
        b = self._block_of[node]
        marks = self._checkpoints(b)
        start = self._block_start[b]
        mark = min(self._block_end[b], start + -(-(node - start) // CHECKPOINT) * CHECKPOINT)
        live = set(marks[mark])
        for i in range(mark, node, -1):
            live.difference_update(self._writes[i])
            live.update(self._reads[i])
        return live

    def live_out(self, node: int) -> frozenset:
        """Keys live just after ``node`` runs."""
        return frozenset(self._keys[i] for i in self._live_out_ids(node))

    def live_in(self, node: int) -> frozenset:
        """Keys live just before ``node`` runs."""
        live = self._live_out_ids(node)
        live.difference_update(self._writes[node])
        live.update(self._reads[node])
        return frozenset(self._keys[i] for i in live)

    def is_live_out(self, node: int, key: Hashable) -> bool:
        """Whether ``key`` is live just after ``node``."""
        idx = self._key_index.get(key)
        return idx is not None and idx in self._live_out_ids(node)

    @property
    def keys(self) -> List[Hashable]:
        """Every key that appears in the graph, in order of first appearance."""
        return list(self._keys)

    def intervals(self) -> Dict[Hashable, Interval]:
        """The :class:`Interval` of every key that is ever live or written.

        Keys in ``live_at_exit`` that no node mentions are left out.
        """
        if self._intervals is None:
            self._intervals = self._compute_intervals()
        return self._intervals

    def _compute_intervals(self) -> Dict[Hashable, Interval]:
        lo: Dict[int, int] = {}
        hi: Dict[int, int] = {}

        def touch(v: int, pos: int) -> None:
            if v in lo:
                if pos < lo[v]:
                    lo[v] = pos
                if pos > hi[v]:
                    hi[v] = pos
            else:
                lo[v] = hi[v] = pos

        for b, (s, e) in enumerate(zip(self._block_start, self._block_end)):
            for v in _bits(self._block_out[b]):
                touch(v, e)
            for v in _bits(self._block_in[b]):
                touch(v, s)
            for i in range(s, e + 1):
                for v in self._reads[i]:
                    touch(v, i)
                for v in self._writes[i]:
                    touch(v, i)
        return {self._keys[v]: Interval(lo[v], hi[v]) for v in sorted(lo)}


def analyze(nodes: Sequence[FlowNode], live_at_exit: Iterable[Hashable] = (),
            entry: int = 0) -> Liveness:
    """Liveness of every variable at every node of a control-flow graph.

    Parameters
    ----------
    nodes : the graph; node ``i``'s successors are indices into ``nodes``.
    live_at_exit : keys read after the program ends (fetched outputs); they
        are live out of every node without successors.
    entry : the node where execution starts.

    Returns
    -------
    Liveness
        ``live_in(i)``, ``live_out(i)`` per node and ``intervals()`` per key.
    """
    return Liveness(nodes, live_at_exit, entry)


# -- memopt Graph adapter ----------------------------------------------------

@dataclass
class GraphLiveness:
    """Liveness of a :class:`memopt.graph.Graph`, keyed by variable name.

    ``positions[i]`` is ``(block index, op index in block, op)`` for the op at
    flat position ``i`` (the order of :meth:`Graph.walk_ops`); intervals and
    live sets are in those positions.
    """

    positions: list
    liveness: Liveness

    def intervals(self) -> Dict[str, Interval]:
        # the keys are the graph's variable names
        return cast(Dict[str, Interval], self.liveness.intervals())

    def live_in(self, position: int) -> frozenset:
        return self.liveness.live_in(position)

    def live_out(self, position: int) -> frozenset:
        return self.liveness.live_out(position)


def analyze_graph(graph: Graph) -> GraphLiveness:
    """Liveness of a memopt :class:`~memopt.graph.Graph`.

    Ops are numbered in :meth:`Graph.walk_ops` order: an op that runs
    sub-blocks comes first (its *head*), its sub-blocks' ops follow.  The head
    of a loop op (``op.loop``) may enter the body or leave; the body's last op
    returns to the head, so values read in the next iteration stay live
    through the loop.  The head of a branch op may enter any of its sub-blocks
    or skip them all; each sub-block continues after the construct.

    Because a loop may run zero times and a branch may not be taken, a
    control op's outputs are not killed at its head: they count as read there,
    so a value they held before the construct stays live through it.

    The graph's ``fetch_names`` are live at the exit.
    """
    block_positions: Dict[int, List[int]] = {}
    indexed = []
    for pos, (block_idx, op) in enumerate(graph.walk_ops()):
        ops_here = block_positions.setdefault(block_idx, [])
        indexed.append((block_idx, len(ops_here), op))
        ops_here.append(pos)
    reads: List[tuple] = [()] * len(indexed)
    writes: List[tuple] = [()] * len(indexed)
    succs: List[list] = [[] for _ in indexed]
    for pos, (_, _, op) in enumerate(indexed):
        if op.sub_blocks:
            reads[pos] = tuple(dict.fromkeys((*op.reads, *op.writes)))
        else:
            reads[pos], writes[pos] = tuple(op.reads), tuple(op.writes)

    def link(block_idx: int, cont: Optional[int]) -> None:
        own = block_positions.get(block_idx, [])
        for k, pos in enumerate(own):
            after = own[k + 1] if k + 1 < len(own) else cont
            op = indexed[pos][2]
            targets = []
            for sub in op.sub_blocks:
                body = block_positions.get(sub)
                if body:
                    targets.append(body[0])
                    link(sub, pos if op.loop else after)
            if after is not None:
                targets.append(after)
            succs[pos] = list(dict.fromkeys(targets))

    link(0, None)
    nodes = [FlowNode(reads[i], writes[i], tuple(succs[i])) for i in range(len(indexed))]
    live = analyze(nodes, live_at_exit=tuple(graph.fetch_names))
    return GraphLiveness(positions=indexed, liveness=live)


# -- the fast path for straight-line code -------------------------------------

class _Span(NamedTuple):
    """:class:`memopt.liveness.Interval`'s fields and ``half_open``, as a
    tuple (thousands are made per plan: a frozen dataclass costs more)."""

    start: int
    end: int

    @property
    def half_open(self) -> Tuple[int, int]:
        return self.start, self.end + 1


class StraightLine:
    """Liveness of a graph with one block and no sub-blocks: a variable is
    live from its first write (from the start if it is read first) to its
    last use (to the end if fetched) -- what :func:`analyze_graph` finds for
    straight-line code, in one pass (the fast path of
    :func:`program_liveness`).  ``positions`` as in :class:`GraphLiveness`;
    ``live_out`` is not available (straight-line code has no loop)."""

    def __init__(self, graph: Graph) -> None:
        ops = graph.blocks[0].ops
        self.positions = [(0, i, op) for i, op in enumerate(ops)]
        first: Dict[str, int] = {}
        last: Dict[str, int] = {}
        for i, op in enumerate(ops):
            for name in op.reads:
                if name not in first:
                    first[name] = 0
                last[name] = i
            for name in op.writes:
                if name not in first:
                    first[name] = i
                last[name] = i
        end = max(len(ops) - 1, 0)
        for name in graph.fetch_names:
            if name in first:
                last[name] = end
        self._intervals = {n: _Span(first[n], last[n]) for n in first}

    def intervals(self) -> Dict[str, _Span]:
        return self._intervals

    def live_out(self, position: int) -> frozenset:  # pragma: no cover - loops only
        raise NotImplementedError("straight-line code has no loop")


def program_liveness(graph: Graph) -> "GraphLiveness | StraightLine":
    """Liveness of a memopt :class:`~memopt.graph.Graph`, with a fast path:
    a graph of one block without sub-blocks gets :class:`StraightLine` (the
    same intervals as :func:`analyze_graph`, in one pass), any other graph
    :func:`analyze_graph`."""
    if len(graph.blocks) == 1 and not any(op.sub_blocks for op in graph.blocks[0].ops):
        return StraightLine(graph)
    return analyze_graph(graph)
