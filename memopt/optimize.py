"""``memory_optimize`` and ``release_memory``: the one-call memory transpiler.

``memopt.memory_optimize(program)`` rewrites a Paddle static program in place
so that variables whose lifetimes do not overlap share memory, and returns a
:class:`memopt.report.Report` saying what it did.  The work flows one way::

    Program -> adapter -> Graph -> liveness -> plan (pure data) -> checks
            -> adapter applies the plan all at once -> Report

This module validates the arguments, reads the runtime's memory model,
dispatches on the program type (legacy programs to
:mod:`memopt.paddle.legacy`, PIR programs to :mod:`memopt.paddle.pir`) and
holds the planner, which works on a :class:`memopt.graph.Graph` and imports
no Paddle.

The plan
--------
*Candidates* are the variables that may share memory: dense, not persistable,
not fed, fetched or declared data, not live at entry (read in their block
before any op of it writes them), not in ``skip_opt_set``, not a gradient
when ``skip_grads``, not likely to be fetched (the loss, an output nobody
reads, the input of a fetch op), and used in one block only by ops that run
no sub-block (a variable a control-flow op or a second block touches is left
alone; locals of sub-blocks at any depth are candidates among themselves).

Control flow is analysed per scope (:func:`split_shadowed`): a sub-block's
local that shadows a name of an enclosing block is its own variable (Paddle
creates it in the sub-block's scope), so the outer one gets its own
liveness.  An output a control op always writes whole without reading it
(``conditional_block_grad``'s parent-side gradients, the adapter's
``full_writes``) is live from that op on and takes part in its block like
any other variable; the body's values the op reads back after the body ran
(``sub_outputs``: local gradients) are never merged; a value read in the
next loop iteration is live across the whole loop.  No rename ever reaches
into another block (:func:`verify_renaming` checks it).

*In place*: where an op whose Paddle kernel may run in place (the adapter's
``"inplace"`` pair, or its ``"inplace_alt"``: an elementwise add of three
equal shapes writing into ``Y``) reads a candidate for the last time and
writes a candidate of the same shape and dtype (level 1: of any shape of the
same size, as ``reshape2``), the output takes the input's memory at that
very op.

*Rename*: with the garbage collector off, candidates (after in-place chains
are joined) are grouped so that the members of a group never live at the
same time -- by :func:`memopt.reuse.assign_groups` (the best of its orders)
for up to :data:`SMALL_PROBLEM` buffers, by the ``O(n log n)`` sweep
:func:`best_fit_groups` above that; level 0 groups only the same shape and
dtype, level 1 the same dtype across shapes, provided every member provably
fits (for every batch size) in the memory the group's earliest member
allocates (never across dtypes: Paddle's executor reads each variable's
declared dtype, so a name may not change it).

*Dims-only reads*: a grad op that reads a variable for its dims only
(``elementwise_add_grad``'s ``X``) reads an operand of the same dims instead
(:func:`dims_only_substitutions`), so the variable dies at its last real use:
with GC off its memory can then be taken over, with GC on (Paddle frees it
there anyway) an op may run in place on it (a conv's bias add).

*Schedule*: a training program runs every optimizer op at its end, so every
parameter gradient lives until then.  :func:`schedule_optimizer_ops` moves
each optimizer op up to right after the last op it depends on, as Paddle's
PIR executor does, so each gradient dies as soon as it is applied.

Runtime awareness: with Paddle's eager-deletion GC on (the default) a
variable's memory is freed after its last use, and renaming would only
stretch lifetimes (a group holds its memory from its first member's birth to
its last member's death) -- so with GC on only in-place reuse, dims-only
reads and the schedule are planned, and a plan whose estimated peak would
rise is dropped.  With GC off nothing is
freed during a run, and renaming is the main win.

Checks before the program is touched: :func:`memopt.simulate.check_groups`
on the grouping; :func:`verify_order`, which checks that the new op order
keeps every dependency; and :func:`verify_renaming`, which replays every
block and checks that each read still sees the value it saw before.
"""
from __future__ import annotations

import contextlib
import gc as python_gc
import logging
from dataclasses import dataclass, field
from typing import Dict, Hashable, Iterable, List, NamedTuple, Optional, Tuple

from .errors import PlanError, UnsupportedProgramError
from .graph import Graph, Size, Var
from .liveness import Interval, analyze_graph
from .problems import Buffer
from .report import REFERENCE_BATCH, Bytes, Holder, Report, Reuse

__all__ = [
    "Options",
    "Plan",
    "memory_optimize",
    "release_memory",
    "resolve_options",
    "plan_memory",
    "check_plan",
    "schedule_optimizer_ops",
    "best_fit_groups",
    "verify_order",
    "verify_renaming",
    "runtime_gc",
]

log = logging.getLogger(__name__)

GRAD_SUFFIX = "@GRAD"

# reasons a variable is left alone (Report.not_merged keys)
R_PERSISTABLE = "persistable"
R_IO = "feed/fetch/data"
R_SKIP = "skip_opt_set"
R_GRAD = "gradient (skip_grads=True)"
R_FETCHED = "likely fetched (loss, never read, or fetch op input)"
R_SHARED = "shared with control flow or another block"
R_KIND = "not a dense tensor"
R_ENTRY = "live at entry (read before written: an input or a loop-carried value)"


@dataclass(frozen=True)
class Options:
    """memory_optimize's arguments, checked, with names resolved.

    ``skip_opt_set`` holds variable names (Variables/Values already turned
    into their names); ``level`` is 0 or 1.
    """

    skip_opt_set: frozenset = frozenset()
    skip_grads: bool = True
    level: int = 0
    print_log: bool = False


def _name_of(item, index: int) -> str:
    """The variable name of a skip_opt_set item: a str, a legacy Variable, or
    a PIR Value (named as :func:`memopt.paddle.pir.value_name` does)."""
    if isinstance(item, str):
        return item
    if type(item).__name__ == "Value" and hasattr(item, "get_defining_op"):
        from .paddle import pir

        try:
            return pir.value_name(item)
        except ValueError as exc:
            raise TypeError(f"skip_opt_set[{index}]: {exc}") from None
    try:
        name = getattr(item, "name", None)
    except Exception:  # a PIR Value without a name raises
        name = None
    if isinstance(name, str) and name:
        return name
    raise TypeError(
        f"skip_opt_set[{index}] is a {type(item).__name__} with no variable name; "
        "pass variable names (str) or Variables")


def resolve_options(skip_opt_set=None, skip_grads: bool = True, level: int = 0,
                    print_log: bool = False) -> Options:
    """Check memory_optimize's arguments and turn them into :class:`Options`.

    Raises
    ------
    TypeError
        ``skip_opt_set`` is a bare string (``("fc")`` is the string ``"fc"``,
        not a tuple) or not a set/list/tuple of names or Variables;
        ``skip_grads`` or ``print_log`` is not a bool.
    ValueError
        ``level`` is not 0 or 1.
    """
    if skip_opt_set is None:
        names: frozenset = frozenset()
    elif isinstance(skip_opt_set, (str, bytes)):
        raise TypeError(
            f"skip_opt_set must be a set, list or tuple of variable names, not the "
            f"string {skip_opt_set!r}: note that ({skip_opt_set!r}) is a string, not a "
            f"tuple; write ({skip_opt_set!r},) or {{{skip_opt_set!r}}}")
    elif isinstance(skip_opt_set, (set, frozenset, list, tuple)):
        items = sorted(skip_opt_set, key=str) if isinstance(skip_opt_set, (set, frozenset)) \
            else list(skip_opt_set)
        names = frozenset(_name_of(item, i) for i, item in enumerate(items))
    else:
        raise TypeError(
            "skip_opt_set must be None or a set, list or tuple of variable names or "
            f"Variables, got {type(skip_opt_set).__name__}")
    for arg, value in (("skip_grads", skip_grads), ("print_log", print_log)):
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise TypeError(f"{arg} must be True or False, got {value!r}")
    if isinstance(level, bool) or level not in (0, 1):
        raise ValueError(
            f"level must be 0 (reuse only between variables of the same shape and "
            f"dtype) or 1 (any variable of the same dtype whose memory is provably "
            f"large enough), got {level!r}")
    return Options(names, bool(skip_grads), int(level), bool(print_log))


def runtime_gc() -> Tuple[bool, str]:
    """Whether Paddle's eager-deletion garbage collector is on, and a line
    saying so (``FLAGS_eager_delete_tensor_gb`` >= 0: on; < 0: off)."""
    import paddle

    flag = "FLAGS_eager_delete_tensor_gb"
    value = float(paddle.get_flags([flag])[flag])
    on = value >= 0
    return on, f"garbage collection {'on' if on else 'off'} ({flag}={value:g})"


# -- the plan (pure data) ---------------------------------------------------------

@dataclass
class Plan:
    """A memory plan for a :class:`Graph`.

    ``renames[block][old] = new`` is the rewrite; ``groups`` the variable
    names that share one memory block (each in time order, first = the name
    they all take; groups of one left out); ``reuses`` one line per merged
    variable; ``inplace`` the ``(input, output, position)`` pairs run in
    place; ``reasons`` why candidates were left alone.  ``buffers`` holds
    every temporary's live interval (half-open op positions) and size, for
    the estimates; ``before`` the same in the original op order.  ``order``
    (None: unchanged) is the new order of block 0's ops as indices of the
    original ops, ``moved`` how many optimizer ops it moves up, and
    ``scheduled`` the graph in that order, which positions refer to.
    ``substitutions`` are the dims-only reads redirected
    (:func:`dims_only_substitutions`, applied before the order);
    ``estimates`` the ``(peak before, peak after, holders)`` of
    :func:`estimate`; ``notes`` extra lines for the report.
    """

    gc: bool
    level: int
    renames: Dict[int, Dict[str, str]] = field(default_factory=dict)
    groups: List[List[str]] = field(default_factory=list)
    reuses: List[Reuse] = field(default_factory=list)
    inplace: List[Tuple[str, str, int]] = field(default_factory=list)
    reasons: Dict[str, int] = field(default_factory=dict)
    buffers: Dict[str, Buffer] = field(default_factory=dict)
    persistable: List[Size] = field(default_factory=list)
    order: Optional[List[int]] = None
    moved: int = 0
    scheduled: Optional[Graph] = None
    before: Dict[str, Buffer] = field(default_factory=dict)
    estimates: Optional[tuple] = None
    notes: List[str] = field(default_factory=list)
    substitutions: List[Tuple[int, int, str, str, str]] = field(default_factory=list)

    def merged(self) -> Dict[str, str]:
        """``{name: a variable it now shares memory with}`` for every member
        of every group (the first member maps to the second)."""
        out: Dict[str, str] = {}
        for group in self.groups:
            out[group[0]] = group[1]
            for name in group[1:]:
                out[name] = group[0]
        return out


def _is_grad(name: str) -> bool:
    return GRAD_SUFFIX in name


def _classify(graph: Graph, options: Options, intervals, free_outputs=frozenset(),
              excluded=frozenset()) -> Tuple[Dict[str, int], Dict[str, str], Dict[str, int]]:
    """Candidates (name -> block) and the reason every other temporary is
    left alone; also the block of every temporary.

    A variable an op of its block reads before any op of it writes it is
    live at entry -- an input whose ``is_data`` flag was lost (a program
    read back from bytes) or a value carried from the previous loop
    iteration -- and is left alone: its memory holds a value from outside.

    ``free_outputs`` are control-op outputs proven to take part like any
    other variable of their block (see :func:`_control_outputs`);
    ``excluded`` are names left alone as shared with control flow (split
    locals of sub-blocks, values a control op reads back from its body).
    """
    blocks_of: Dict[str, set] = {}
    control: set = set()
    read: set = set()
    grad_written: set = set()
    loss_written: set = set()
    read_first: set = set()  # read in a block before any op of it writes them
    for block in graph.blocks:
        written: set = set()
        for op in block.ops:
            for name in (*op.reads, *op.writes):
                blocks_of.setdefault(name, set()).add(block.idx)
            read.update(op.reads)
            read_first.update(name for name in op.reads if name not in written)
            written.update(op.writes)
            if op.sub_blocks:
                control.update(op.reads)
                control.update(n for n in op.writes if n not in free_outputs)
            if op.role == "backward":
                grad_written.update(op.writes)
            if op.attrs.get("loss"):
                loss_written.update(op.writes)
    declared: Dict[str, List[int]] = {}
    for block_idx, var in graph.all_vars():
        declared.setdefault(var.name, []).append(block_idx)
    fetched = set(graph.fetch_names)

    candidates: Dict[str, int] = {}
    reason_of: Dict[str, str] = {}
    home: Dict[str, int] = {}
    for name in sorted(intervals):
        homes = declared.get(name)
        if not homes:
            continue
        if len(homes) > 1:
            # a copy of the declaration in a block no op of which uses the
            # name (a while_grad body's borrowed forward variable, after a
            # dims-only substitution removed its last use) shares nothing
            used = blocks_of.get(name, set())
            homes = [h for h in homes if h in used] or homes
        var = graph.blocks[homes[0]].vars[name]
        home[name] = homes[0]
        if not var.is_dense:
            reason = R_KIND
        elif var.persistable:
            reason = R_PERSISTABLE
        elif var.is_feed or var.is_fetch or var.is_data:
            reason = R_IO
        elif name in read_first:
            reason = R_ENTRY
        elif name in options.skip_opt_set:
            reason = R_SKIP
        elif options.skip_grads and (_is_grad(name) or name in grad_written):
            reason = R_GRAD
        elif name in loss_written or name in fetched or (homes[0] == 0 and name not in read):
            reason = R_FETCHED
        elif (len(homes) > 1 or name in control or name in excluded
              or len(blocks_of.get(name, ())) != 1
              or homes[0] not in blocks_of.get(name, ())):
            reason = R_SHARED
        elif _vsize(var).coefficient == 0:
            continue
        else:
            candidates[name] = homes[0]
            continue
        reason_of[name] = reason
    return candidates, reason_of, home


def _in_loop(graph: Graph) -> set:
    """Indices of the blocks run repeatedly: loop bodies and their sub-blocks."""
    looped: set = set()
    for block in graph.blocks:  # parents come before children
        for op in block.ops:
            if op.loop or block.idx in looped:
                looped.update(op.sub_blocks)
    return looped


def _inplace_pairs(graph: Graph, live, candidates: Dict[str, int], intervals,
                   level: int = 0) -> List[Tuple[str, str, int]]:
    """``(input, output, position)`` for every op that can run in place on a
    dying candidate input of the output's dtype and shape -- at level 1, of
    any shape whose size is the input's for every batch size (``reshape2``,
    ``flatten``: Paddle's kernel then only relabels the dims of the one
    tensor instead of copying it into a second one).

    Skipped: an op that also writes its input or also reads its output
    (renaming would make it write, or read, one name twice), and an input
    no earlier op of its block wrote (a value carried in from outside or
    from the previous loop iteration: there is nothing to take over yet).
    """
    looped = _in_loop(graph)
    pairs = []
    written: Dict[int, set] = {}  # block -> names written by the ops before pos
    for pos, (block_idx, _, op) in enumerate(live.positions):
        before = written.setdefault(block_idx, set())
        # Paddle's declared pair first, then the adapter's alternative (an
        # elementwise add of equal shapes may write into either operand)
        options = [p for p in (op.attrs.get("inplace"), op.attrs.get("inplace_alt"))
                   if p is not None and p[0] in before]
        before.update(op.writes)
        for src, dst in options:
            if _can_run_in_place(graph, live, candidates, intervals, level, looped,
                                 pos, block_idx, op, src, dst):
                pairs.append((src, dst, pos))
                break
    return pairs


def _can_run_in_place(graph: Graph, live, candidates, intervals, level: int, looped,
                      pos: int, block_idx: int, op, src: str, dst: str) -> bool:
    """Whether ``op`` at ``pos`` may write candidate ``dst`` into the memory
    of candidate ``src``, which dies there (see :func:`_inplace_pairs`)."""
    if candidates.get(src) != block_idx or candidates.get(dst) != block_idx or src == dst:
        return False
    if src in op.writes or dst in op.reads:
        return False
    if intervals[src].end != pos or intervals[dst].start != pos:
        return False
    a, b = graph.var(src, block_idx), graph.var(dst, block_idx)
    if a.dtype != b.dtype or (tuple(a.shape) != tuple(b.shape) and (
            level != 1 or _vsize(a) != _vsize(b))):
        return False
    # in a loop body the input's interval may end here yet the value be
    # carried to the next iteration: ask the liveness itself
    return not (block_idx in looped and src in live.live_out(pos))


_SIZES: Dict[tuple, Size] = {}


def _vsize(var: Var) -> Size:
    """``var.size``, memoized on (shape, dtype, kind): shapes repeat a lot."""
    key = (var.shape, var.dtype, var.kind)
    size = _SIZES.get(key)
    if size is None:
        size = _SIZES[key] = var.size
    return size


class _Span(NamedTuple):
    """:class:`memopt.liveness.Interval`'s fields and ``half_open``, as a
    tuple (thousands are made per plan: a frozen dataclass costs more)."""

    start: int
    end: int

    @property
    def half_open(self) -> Tuple[int, int]:
        return self.start, self.end + 1


class _StraightLine:
    """Liveness of a graph with one block and no sub-blocks: a variable is
    live from its first write (from the start if it is read first) to its
    last use (to the end if fetched) -- what :func:`analyze_graph` finds for
    straight-line code, in one pass."""

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

    def intervals(self) -> Dict[str, "Interval"]:
        return self._intervals

    def live_out(self, position: int) -> frozenset:  # pragma: no cover - loops only
        raise NotImplementedError("straight-line code has no loop")


def _analyze(graph: Graph):
    """Liveness of ``graph``: the one-pass form for a single block."""
    if len(graph.blocks) == 1 and not any(op.sub_blocks for op in graph.blocks[0].ops):
        return _StraightLine(graph)
    return analyze_graph(graph)


#: Separates a name from the block of its local instance in analysis keys
#: (``name@@block3``); Paddle names never contain it.
SCOPE_MARK = "@@block"


def split_shadowed(graph: Graph) -> Tuple[Graph, set]:
    """The graph with every shadowing local renamed apart, for the analysis.

    A sub-block that declares a (non-persistable) name an enclosing block
    also declares has its own variable: Paddle's executor creates a
    sub-block's declared variables in the sub-block's scope (as the inside
    gradients of a ``conditional_block_grad`` body, copied out to the
    parent's variable after the body runs).  The two are different memory,
    so the local one (and every use that resolves to it) becomes the key
    ``name@@block<k>`` (see :data:`SCOPE_MARK`), and the enclosing block's
    variable gets a liveness of its own.  Returns the graph (``graph``
    itself when nothing shadows) and the set of split keys; ops, blocks and
    variables are shared where unchanged.
    """
    if len(graph.blocks) == 1:
        return graph, set()
    seen: Dict[str, int] = {}
    twice: set = set()
    for block_idx, var in graph.all_vars():
        if seen.setdefault(var.name, block_idx) != block_idx:
            twice.add(var.name)
    if not twice:
        return graph, set()
    from dataclasses import replace

    from .graph import Block

    def key(name: str, block_idx: int) -> str:
        if name not in twice:
            return name
        home = graph.home_of(name, block_idx)
        if home <= 0 or graph.blocks[home].vars[name].persistable:
            return name
        outer = graph.home_of(name, graph.blocks[home].parent)
        if outer < 0 or graph.blocks[outer].vars[name].persistable:
            return name
        return f"{name}{SCOPE_MARK}{home}"

    split: set = set()
    blocks = []
    for block in graph.blocks:
        variables = block.vars
        local = {n: key(n, block.idx) for n in twice.intersection(block.vars)}
        local = {n: k for n, k in local.items() if k != n}
        if local:
            variables = {local.get(n, n): (replace(v, name=local[n]) if n in local else v)
                         for n, v in block.vars.items()}
            split.update(local.values())
        ops = block.ops
        if any(n in twice for op in ops for n in (*op.reads, *op.writes)):
            ops = []
            for op in block.ops:
                reads = tuple(key(n, block.idx) for n in op.reads)
                writes = tuple(key(n, block.idx) for n in op.writes)
                ops.append(op if (reads, writes) == (op.reads, op.writes)
                           else replace(op, reads=reads, writes=writes))
        blocks.append(Block(block.idx, block.parent, ops, variables))
    if not split:
        return graph, set()
    return Graph(blocks=blocks, fetch_names=graph.fetch_names), split


def scoped_liveness(graph: Graph):
    """``(split graph, liveness, intervals, free outputs, excluded names)``:
    :func:`split_shadowed`, then the liveness of the split graph and
    :func:`_with_control_outputs` on it -- what every candidate rule reads."""
    split = split_shadowed(graph)[0]
    live = _analyze(split)
    return (split, live, *_with_control_outputs(split, live))


def reason_counts(reason_of: Dict[str, str]) -> Dict[str, int]:
    """``{reason: how many temporaries were left alone for it}``."""
    counts: Dict[str, int] = {}
    for reason in reason_of.values():
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def persistable_sizes(graph: Graph, home: Dict[str, int]) -> List[Size]:
    """Sizes of the dense persistable variables among ``home``'s names."""
    variables = (graph.blocks[b].vars[name] for name, b in home.items())
    return [_vsize(var) for var in variables if var.is_dense and var.persistable]


def _with_control_outputs(graph: Graph, live):
    """``(intervals, free outputs, excluded names)`` of a split graph: the
    liveness's intervals with those of :func:`_control_outputs` put in;
    excluded: the split locals and the values control ops read back."""
    intervals = live.intervals()
    free, sub_outputs = _control_outputs(graph, live, intervals)
    if free:
        intervals = dict(intervals)
        intervals.update(free)
    split = {n for n in intervals if SCOPE_MARK in n}
    return intervals, frozenset(free), sub_outputs | split


def _control_outputs(graph: Graph, live, intervals) -> Tuple[Dict[str, "Interval"], set]:
    """Outputs of control ops that may share memory in the op's block.

    A control op's ``attrs["full_writes"]`` (from the adapter) are outputs
    it always writes whole, after its sub-blocks ran, without reading them
    (``conditional_block_grad``'s parent-side gradients: copied from the
    body's local gradients, or zeros when the branch did not run).  The
    liveness counts a control op's outputs as read at its head (a loop or a
    branch may not write them); for such an output ``x`` that is used in
    one block only, written there by this op alone, read only by later
    plain ops and by no control op, the true interval starts at the op:
    returned as ``{x: Interval(position of the op, end)}``.  Also returns
    the names never to merge: ``attrs["sub_outputs"]`` of every control op
    (locals of its sub-blocks the op reads back after they ran: inside
    gradients) and ``attrs["aliases"]`` of any op (variables whose buffer a
    kernel may hand to another: a unary einsum's output, an einsum operand
    its cache may point at).
    """
    sub_outputs: set = set()
    wanted: Dict[str, int] = {}
    for pos, (_, _, op) in enumerate(live.positions):
        # outputs whose kernel may hand back an input's own buffer
        sub_outputs.update(op.attrs.get("aliases", ()))
        if op.sub_blocks:
            for name in op.attrs.get("sub_outputs", ()):
                # the body's own variable: its split key where it shadows one
                # of the op's block (that one is not read back)
                local = [f"{name}{SCOPE_MARK}{s}" for s in op.sub_blocks]
                local = [k for k, s in zip(local, op.sub_blocks) if k in graph.blocks[s].vars]
                sub_outputs.update(local or (name,))
            for name in op.attrs.get("full_writes", ()):
                if name not in op.reads:
                    wanted[name] = -1 if name in wanted else pos
    wanted = {n: p for n, p in wanted.items() if p >= 0 and n in intervals}
    if not wanted:
        return {}, sub_outputs
    bad: set = set()
    block_of: Dict[str, int] = {}
    for pos, (block_idx, _, op) in enumerate(live.positions):
        for name in (*op.reads, *op.writes):
            if name not in wanted:
                continue
            mine = wanted[name]
            if block_of.setdefault(name, live.positions[mine][0]) != block_idx:
                bad.add(name)  # used in another block
            elif pos == mine:
                continue
            elif op.sub_blocks or name in op.writes or pos < mine:
                bad.add(name)  # another control op, another writer, an earlier read
    return {n: Interval(p, max(p, intervals[n].end)) for n, p in wanted.items()
            if n not in bad}, sub_outputs


def _temporaries(graph: Graph, intervals) -> Dict[str, Buffer]:
    """Every non-persistable dense variable with a live interval: its buffer
    (a name declared in several blocks: its first declaration)."""
    declared: Dict[str, Var] = {}
    for _, var in graph.all_vars():
        declared.setdefault(var.name, var)
    out: Dict[str, Buffer] = {}
    for name, interval in intervals.items():
        var = declared.get(name)
        if var is None or not var.is_dense or var.persistable:
            continue
        size = _vsize(var)
        if size.coefficient:
            lower, upper = interval.half_open
            out[name] = Buffer(name, lower, upper, _plain(size))
    return out


def schedule_optimizer_ops(graph: Graph) -> Optional[List[int]]:
    """Move every optimizer op of block 0 up to right after the last op it
    depends on; None when nothing moves.

    A training program runs all optimizer ops at its end, so every gradient
    of a parameter is held until then.  Run right after its gradient is
    complete, an optimizer op lets that gradient die at once (Paddle's PIR
    executor schedules them so too).  An optimizer op (role ``"optimize"``,
    no sub-blocks) moves up past ops it does not depend on: it stays after
    every op that writes what it reads or reads or writes what it writes,
    and never crosses an op that runs sub-blocks.  Optimizer ops keep their
    relative order where they share a dependency.  The result is the new
    order as indices of the original ops.
    """
    ops = graph.blocks[0].ops
    if not any(op.role == "optimize" for op in ops):
        return None
    last_write: Dict[str, tuple] = {}
    last_access: Dict[str, tuple] = {}
    barrier: tuple = ()
    keys: List[tuple] = []
    for i, op in enumerate(ops):
        if op.role == "optimize" and not op.sub_blocks:
            dep = barrier
            for name in op.reads:
                dep = max(dep, last_write.get(name, ()))
            for name in op.writes:
                dep = max(dep, last_access.get(name, ()))
            key = dep + (0.5, i) if dep else (-1, i)
        else:
            key = (i,)
        if op.sub_blocks:
            barrier = max(barrier, key)
        for name in op.writes:
            last_write[name] = max(last_write.get(name, ()), key)
        for name in (*op.reads, *op.writes):
            last_access[name] = max(last_access.get(name, ()), key)
        keys.append(key)
    order = sorted(range(len(ops)), key=lambda i: keys[i])
    return None if order == list(range(len(ops))) else order


def reorder(graph: Graph, order: List[int]) -> Graph:
    """A graph sharing ``graph``'s blocks and ops, block 0's ops in ``order``."""
    from .graph import Block

    b0 = graph.blocks[0]
    new0 = Block(0, b0.parent, [b0.ops[i] for i in order], b0.vars)
    return Graph(blocks=[new0, *graph.blocks[1:]], fetch_names=graph.fetch_names)


def verify_order(graph: Graph, order: Optional[List[int]]) -> None:
    """Check that ``order`` (a permutation of block 0's ops) keeps every
    dependency: for each variable, a write stays after every earlier access
    and a read after the write before it; ops that run sub-blocks keep
    their order relative to every op.

    Raises
    ------
    PlanError
        Naming the variable and ops whose order would change.
    """
    if order is None:
        return
    ops = graph.blocks[0].ops
    if sorted(order) != list(range(len(ops))):
        raise PlanError("the new op order is not a permutation of block 0's ops")
    new_pos = [0] * len(ops)
    for pos, i in enumerate(order):
        new_pos[i] = pos
    # for each name, the op (original index) that comes last in the new order
    # among the earlier writers / earlier accessors of it
    last_write: Dict[str, int] = {}
    last_any: Dict[str, int] = {}
    latest = -1          # earlier op that comes last in the new order
    barrier = -1         # the last earlier op that runs sub-blocks
    for i, op in enumerate(ops):
        here = new_pos[i]
        if barrier >= 0 and new_pos[barrier] > here:
            raise PlanError(f"op {i} ({op.type}) would move above op {barrier} "
                            f"({ops[barrier].type}), which runs sub-blocks")
        if op.sub_blocks and latest >= 0 and new_pos[latest] > here:
            raise PlanError(f"op {i} ({op.type}) runs sub-blocks; op {latest} "
                            f"({ops[latest].type}) may not move below it")
        for name in op.reads:
            j = last_write.get(name)
            if j is not None and new_pos[j] > here:
                raise PlanError(f"op {i} ({op.type}) reads {name!r} and would move above "
                                f"op {j} ({ops[j].type}), which writes it")
        for name in op.writes:
            j = last_any.get(name)
            if j is not None and new_pos[j] > here:
                raise PlanError(f"op {i} ({op.type}) writes {name!r} and would move above "
                                f"op {j} ({ops[j].type}), which uses it")
        for table, names in ((last_write, op.writes), (last_any, (*op.reads, *op.writes))):
            for name in names:
                j = table.get(name)
                if j is None or new_pos[j] < here:
                    table[name] = i
        if latest < 0 or new_pos[latest] < here:
            latest = i
        if op.sub_blocks:
            barrier = i


def dims_only_substitutions(graph: Graph) -> List[Tuple[int, int, str, str, str]]:
    """``(block, op index, slot, var, substitute)`` for every read an op makes
    of a variable for its dims only, where the adapter found another operand
    of the op with the same dims (``op.attrs["dims_only"]``).

    Reading the substitute instead changes nothing the op computes and lets
    the variable die at its last real use -- what Paddle's garbage collector
    does by itself when it is on; with it off, the variable's memory can then
    be taken over.
    """
    out = []
    for block in graph.blocks:
        for index, op in enumerate(block.ops):
            for slot, (var, sub) in sorted(op.attrs.get("dims_only", {}).items()):
                out.append((block.idx, index, slot, var, sub))
    return out


def substitute(graph: Graph, substitutions) -> Graph:
    """A graph whose ops read the substitutes (see
    :func:`dims_only_substitutions`); blocks, variables and other ops shared."""
    from dataclasses import replace

    from .graph import Block

    by_op: Dict[Tuple[int, int], Dict[str, str]] = {}
    for block_idx, index, _, var, sub in substitutions:
        by_op.setdefault((block_idx, index), {})[var] = sub
    blocks = []
    for block in graph.blocks:
        ops = list(block.ops)
        for (block_idx, index), mapping in by_op.items():
            if block_idx == block.idx:
                op = ops[index]
                reads = tuple(dict.fromkeys(mapping.get(n, n) for n in op.reads))
                ops[index] = replace(op, reads=reads)
        blocks.append(Block(block.idx, block.parent, ops, block.vars))
    return Graph(blocks=blocks, fetch_names=graph.fetch_names)


def verify_substitutions(graph: Graph, substitutions) -> None:
    """Each substitute is another operand the op already reads, of the same
    static shape and dtype as the variable it stands in for."""
    for block_idx, index, slot, var, sub in substitutions:
        op = graph.blocks[block_idx].ops[index]
        a, b = graph.var(var, block_idx), graph.var(sub, block_idx)
        if var not in op.reads or sub not in op.reads:
            raise PlanError(f"op {index} ({op.type}) of block {block_idx}: {var!r} -> "
                            f"{sub!r} in slot {slot}, but the op does not read both")
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise PlanError(f"op {index} ({op.type}) of block {block_idx}: {sub!r} "
                            f"cannot stand in for {var!r}: different shape or dtype")


def plan_memory(graph: Graph, options: Options, gc: bool) -> Plan:
    """Plan memory sharing for ``graph`` (see the module docstring).

    Parameters
    ----------
    graph : the program model (from an adapter).
    options : resolved options (level, skip_opt_set, skip_grads).
    gc : plan for Paddle's garbage collector on (in-place reuse and the
        optimizer schedule only) or off (also dims-only substitutions and
        whole-buffer renaming).

    Returns
    -------
    Plan
        Not yet checked: see :func:`check_plan`.
    """
    from .reuse import assign_groups  # local: the planner module is only needed here

    # dims-only reads: with GC off they let a variable's memory be taken
    # over after its last real use; with GC on (Paddle frees such a variable
    # early itself) they let an op run in place on it (a conv's bias add)
    substitutions = dims_only_substitutions(graph)
    substituted = substitute(graph, substitutions) if substitutions else graph
    # with GC on Paddle frees a variable read for its dims only after its
    # last real use: the reference the estimates compare with
    reference = substituted if gc else graph
    original, live, intervals, free, excluded = scoped_liveness(reference)
    before = _temporaries(original, intervals)
    plan = Plan(gc=gc, level=options.level, before=before, substitutions=substitutions)
    graph = substituted
    order = schedule_optimizer_ops(graph)
    if order is not None:
        plan.order = order
        plan.moved = sum(1 for k, i in enumerate(order) if i != k and
                         graph.blocks[0].ops[i].role == "optimize" and i > k)
        graph = reorder(graph, order)
    plan.scheduled = graph
    changed = graph is not reference
    if changed:
        graph, live, intervals, free, excluded = scoped_liveness(graph)
    else:
        graph = original
    candidates, reason_of, home = _classify(graph, options, intervals, free, excluded)
    plan.reasons = reason_counts(reason_of)

    var_of = {name: graph.blocks[home[name]].vars[name] for name in home}
    plan.persistable = persistable_sizes(graph, home)
    plan.buffers = _temporaries(graph, intervals) if changed else before

    # in-place chains: union of (input, output) pairs, head = the first input
    pairs = _inplace_pairs(graph, live, candidates, intervals, options.level)
    plan.inplace = pairs
    head: Dict[str, str] = {}
    for src, dst, _ in pairs:
        head[dst] = head.get(src, src)
    chains: Dict[str, List[str]] = {}
    for name in sorted(candidates, key=lambda n: (intervals[n].start, n)):
        chains.setdefault(head.get(name, name), []).append(name)
    chain_buffers = []
    for first, members in chains.items():
        lower = min(plan.buffers[m].lower for m in members)
        upper = max(plan.buffers[m].upper for m in members)
        chain_buffers.append(Buffer(first, lower, upper, plan.buffers[first].size))

    if gc:
        grouped = [[b] for b in chain_buffers]
    else:
        compatible, fits = _predicates(var_of, home, options.level)
        if len(chain_buffers) <= SMALL_PROBLEM:
            grouped = assign_groups(chain_buffers, kind=_klass(var_of, home, options.level),
                                    fits=fits).groups
        else:
            grouped = best_fit_groups(chain_buffers, _klass(var_of, home, options.level))
        _check_grouping(chain_buffers, grouped, compatible, fits)

    inplace_at = {(src, dst): pos for src, dst, pos in pairs}
    op_at = {pos: live.positions[pos][2].type for _, _, pos in pairs}
    for group in grouped:
        members = [m for buf in sorted(group, key=lambda b: (b.lower, str(b.id)))
                   for m in chains[buf.id]]
        if len(members) < 2:
            continue
        owner = members[0]
        plan.groups.append(members)
        block_renames = plan.renames.setdefault(home[owner], {})
        for prev, cur in zip(members, members[1:]):
            block_renames[cur] = owner
            var = var_of[cur]
            pos = inplace_at.get((prev, cur))
            plan.reuses.append(Reuse(
                var=cur, takes=prev, renamed_to=owner, shape=tuple(var.shape),
                dtype=var.dtype, size=var.size, block=home[cur],
                how="in-place" if pos is not None else "rename",
                op=op_at[pos] if pos is not None else ""))
    plan.estimates = estimate(plan, gc)
    if gc and plan.estimates[1] > plan.estimates[0]:
        # never raise the peak the garbage collector reaches on its own
        plan.notes.append("no change: the plan would have raised the estimated peak")
        plan.order, plan.moved, plan.renames, plan.groups = None, 0, {}, []
        plan.substitutions = []
        plan.reuses, plan.inplace, plan.buffers = [], [], plan.before
        plan.estimates = estimate(plan, gc)
    log.debug("plan (gc=%s, level %d): %d candidates, %d in place, %d groups, %d ops moved",
              gc, options.level, len(candidates), len(pairs), len(plan.groups), plan.moved)
    return plan


#: Up to this many buffers the grouping is :func:`memopt.reuse.assign_groups`
#: ("best" of its orders); above it, :func:`best_fit_groups` (one sweep).
SMALL_PROBLEM = 200


def _klass(var_of, home, level: int):
    """Compatibility class of a buffer: its block and dtype (level 1), plus
    its shape (level 0).  Buffers of different classes never share."""
    def klass(buf: Buffer):
        var = var_of[buf.id]
        if level == 0:
            return home[buf.id], tuple(var.shape), var.dtype
        return home[buf.id], var.dtype

    return klass


def best_fit_groups(buffers: List[Buffer], klass) -> List[List[Buffer]]:
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
    from .reuse import RANK_BATCH

    plans = [_sweep(buffers, klass, reverse=False), _sweep(buffers, klass, reverse=True),
             _largest_first(buffers, klass)]

    def cost(groups):
        return sum(max(_as_size(b.size).at(RANK_BATCH) for b in g) for g in groups)

    return min(plans, key=cost)


#: Groups :func:`_largest_first` tries per buffer (the smallest that could
#: hold it) before opening a new one: bounds its time on big programs.
_SCAN = 96


def _largest_first(buffers: List[Buffer], klass) -> List[List[Buffer]]:
    """Largest buffers first (at :data:`memopt.reuse.RANK_BATCH`), each into
    the free group of its class with the least spare memory that admits it:
    no member overlaps it in time, and every member provably fits the
    group's earliest member (which allocates the memory).  Groups are
    scanned smallest first, so the search stops at the first that admits
    the buffer (and after :data:`_SCAN` groups)."""
    from bisect import bisect_left, insort

    from .reuse import RANK_BATCH

    sizes = [_as_size(b.size) for b in buffers]
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


def _sweep(buffers: List[Buffer], klass, reverse: bool) -> List[List[Buffer]]:
    import heapq
    from bisect import bisect_left, bisect_right, insort

    from .reuse import RANK_BATCH

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
        size = _as_size(buf.size)
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


def _plain(size: Size):
    """A Size as the planners take it: int when it does not grow with B."""
    return size.coefficient if size.power == 0 else size


def _as_size(size) -> Size:
    return size if isinstance(size, Size) else Size(int(size), 0)


def _predicates(var_of, home, level: int):
    def compatible(a: Buffer, b: Buffer) -> bool:
        if home[a.id] != home[b.id]:
            return False
        va, vb = var_of[a.id], var_of[b.id]
        if va.dtype != vb.dtype:
            # Paddle's executor reads declared dtypes (type promotion, kernel
            # choice): a name may not change dtype, at any level
            return False
        return level == 1 or tuple(va.shape) == tuple(vb.shape)

    def fits(member: Buffer, first: Buffer) -> bool:
        return _as_size(member.size).provably_le(_as_size(first.size))

    return compatible, (fits if level == 1 else None)


def _check_grouping(buffers, groups, compatible, fits) -> None:
    """The independent checker of :mod:`memopt.simulate` on the grouping."""
    from .simulate import check_groups

    class _Grouping:
        pass

    grouping = _Grouping()
    grouping.groups = groups
    grouping.group_of = {b.id: k for k, group in enumerate(groups) for b in group}
    # compatible() compares block, dtype and (level 0) shape for equality:
    # an equivalence, so each member is checked against its group's first
    check_groups(buffers, grouping, compatible=compatible, fits=fits, equivalence=True)


def verify_renaming(graph: Graph, renames: Dict[int, Dict[str, str]],
                    inplace: Iterable[Tuple[str, str, int]] = ()) -> None:
    """Check that renaming changes no value any op reads.

    Replays each block in order, tracking which original variable each name
    holds after the rename.  Every read must find the value it found before:
    a renamed name must hold the variable read, last written in the same
    block (a read of a merged variable before its first write in the block --
    a value carried in from outside or from the previous loop iteration -- is
    an error).  An op may read and write the same name only where it did so
    before or where it is one of the ``inplace`` pairs.  Two distinct
    variables an op uses may not end up under one name otherwise.

    Raises
    ------
    PlanError
        Naming the block, op and variables at fault.
    """
    _verify_scopes(graph, renames)
    allowed = {(src, dst) for src, dst, _ in inplace}
    merged = {name for mapping in renames.values() for name in mapping}
    merged |= {new for mapping in renames.values() for new in mapping.values()}
    for block in graph.blocks:
        mapping = renames.get(block.idx, {})
        if not mapping and not (merged & set(block.vars)):
            continue
        holds: Dict[str, str] = {}
        for index, op in enumerate(block.ops):
            where = f"op {index} ({op.type}) of block {block.idx}"
            new_reads: Dict[str, str] = {}
            for name in op.reads:
                new = mapping.get(name, name)
                if name in merged and holds.get(new) != name:
                    raise PlanError(
                        f"{where} reads {name!r}, but after renaming {new!r} holds "
                        f"{holds.get(new)!r} there")
                if new_reads.setdefault(new, name) != name:
                    raise PlanError(f"{where} reads {new_reads[new]!r} and {name!r}, "
                                    f"both renamed to {new!r}")
            new_writes: Dict[str, str] = {}
            for name in op.writes:
                new = mapping.get(name, name)
                if new_writes.setdefault(new, name) != name:
                    raise PlanError(f"{where} writes {new_writes[new]!r} and {name!r}, "
                                    f"both renamed to {new!r}")
                src = new_reads.get(new)
                if src is not None and src != name and (src, name) not in allowed:
                    raise PlanError(f"{where} reads {src!r} and writes {name!r}, both "
                                    f"renamed to {new!r}, but the op may not run in place")
            for name in op.writes:
                holds[mapping.get(name, name)] = name


def _verify_scopes(graph: Graph, renames: Dict[int, Dict[str, str]]) -> None:
    """No rename reaches into another block: a name renamed in block ``b``
    (old or new) that an op of another block uses must resolve there to a
    variable of its own (a local declaration shadowing ``b``'s), since the
    rewrite changes ``b``'s ops only.

    Raises
    ------
    PlanError
        Naming both blocks and the variable.
    """
    touched = {b: set(m) | set(m.values()) for b, m in renames.items() if m}
    if not touched or len(graph.blocks) == 1:
        return
    for block in graph.blocks:
        if block.idx in touched and len(touched) == 1:
            continue
        for op in block.ops:
            for name in (*op.reads, *op.writes):
                home = graph.home_of(name, block.idx)
                if home != block.idx and name in touched.get(home, ()):
                    raise PlanError(
                        f"op {op.type!r} of block {block.idx} uses {name!r} of block {home}, "
                        f"where the plan renames it: the rename would not reach it")


def check_plan(graph: Graph, plan: Plan) -> None:
    """Every check a plan must pass before a program is rewritten: the new
    op order keeps every dependency of ``graph`` (the original), and the
    renaming changes no value any op reads in that order."""
    verify_substitutions(graph, plan.substitutions)
    substituted = substitute(graph, plan.substitutions) if plan.substitutions else graph
    verify_order(substituted, plan.order)
    scheduled = substituted if plan.order is None else reorder(substituted, plan.order)
    verify_renaming(scheduled, plan.renames, plan.inplace)
    for group in plan.groups:
        owner = group[0]
        for name in group[1:]:
            if plan.renames.get(_block_of(plan, name), {}).get(name) != owner:
                raise PlanError(f"{name!r} is in the group of {owner!r} but not renamed to it")


def _block_of(plan: Plan, name: str) -> int:
    for block, mapping in plan.renames.items():
        if name in mapping:
            return block
    return -1


# -- estimates and the report ---------------------------------------------------------

class _Groups:
    def __init__(self, groups) -> None:
        self.groups = groups


def estimate(plan: Plan, gc: bool, batch_size: int = REFERENCE_BATCH):
    """``(peak before, peak after, top holders after)`` in bytes at
    ``batch_size``, persistable variables included, under the GC model."""
    from .simulate import group_timeline

    persist = sum(_as_size(s).at(batch_size) for s in plan.persistable)
    buffers = plan.buffers
    grouped = set()
    after = []
    for group in plan.groups:
        after.append([buffers[n] for n in group])
        grouped.update(group)
    after.extend([b] for n, b in buffers.items() if n not in grouped)
    before = [[b] for b in (plan.before or buffers).values()]
    if not buffers:
        return persist, persist, []
    peak_before = group_timeline(_Groups(before), gc=gc, batch_size=batch_size).peak
    peak_after, holders = peak_and_holders(after, gc, batch_size)
    return persist + peak_before, persist + peak_after, holders


def peak_and_holders(groups: List[List[Buffer]], gc: bool, batch_size: int):
    """``(peak bytes, the five largest holders at the peak)`` of ``groups``
    (each holding its largest member's bytes, see
    :func:`memopt.simulate.group_timeline`) at ``batch_size``; with ``gc``
    off every group holds its memory at the peak."""
    from .simulate import group_timeline

    timeline = group_timeline(_Groups(groups), gc=gc, batch_size=batch_size)
    step = timeline.peak_step
    holders = []
    for group in groups:
        lo = min(b.lower for b in group)
        hi = max(b.upper for b in group)
        if step is None or not gc or lo <= step < hi:
            size = max(_as_size(b.size).at(batch_size) for b in group)
            holders.append(Holder(str(group[0].id), size, tuple(str(b.id) for b in group)))
    holders.sort(key=lambda h: (-h.bytes, h.name))
    return timeline.peak, holders[:5]


def make_report(plan: Plan, options: Options, runtime: str, program_type: str,
                seconds: float, batch_size: int = REFERENCE_BATCH, release: str = "",
                notes: Optional[List[str]] = None) -> Report:
    """The :class:`Report` of a checked plan."""
    if plan.estimates is not None and batch_size == REFERENCE_BATCH:
        peak_before, peak_after, holders = plan.estimates
    else:
        peak_before, peak_after, holders = estimate(plan, plan.gc, batch_size)
    sizes = {n: _as_size(b.size) for n, b in plan.buffers.items()}
    merged_away = {name for group in plan.groups for name in group[1:]}
    return Report(
        program_type=program_type, level=options.level, skip_grads=options.skip_grads,
        gc=plan.gc, runtime=runtime, reuses=list(plan.reuses),
        temporaries_before=Bytes.total(sizes.values()),
        temporaries_after=Bytes.total(s for n, s in sizes.items() if n not in merged_away),
        batch_size=batch_size,
        persistable_bytes=sum(_as_size(s).at(batch_size) for s in plan.persistable),
        peak_before=peak_before, peak_after=peak_after, top_holders=holders,
        release=release or _release_text(plan.gc), not_merged=dict(plan.reasons),
        seconds=seconds, notes=_notes(plan) + list(notes or []))


def _notes(plan: Plan) -> List[str]:
    if not plan.moved:
        return list(plan.notes)
    return list(plan.notes) + [f"moved {plan.moved} optimizer ops up to right after their gradients are "
            "complete, so each gradient dies at once (bit-identical: every dependency "
            "is kept)"]


def _release_text(gc: bool) -> str:
    if gc:
        return ("Paddle's eager-deletion garbage collector frees each temporary right "
                "after its last use (no release ops needed)")
    return ("garbage collection is off: temporaries are held until the run ends; "
            "memopt.release_memory(program) frees each right after its last use "
            "(or set FLAGS_eager_delete_tensor_gb=0 with paddle.set_flags)")


def release_report(plan, released: List[str], ops: int, options: Options, gc: bool,
                   runtime: str, program_type: str, seconds: float,
                   batch_size: int = REFERENCE_BATCH) -> Report:
    """The :class:`Report` of release_memory: ``plan`` a
    :class:`memopt.release.ReleasePlan`, ``released`` the names it freed with
    ``ops`` release ops (none with the garbage collector on: it frees them)."""
    from .release import peak_holding

    sizes = [_as_size(b.size) for b in plan.buffers.values()]
    every = list(plan.buffers)
    if gc:
        before = after = peak_holding(plan.buffers, every, plan.persistable, batch_size)
        text = _release_text(True)
    else:
        before = peak_holding(plan.buffers, plan.already, plan.persistable, batch_size)
        after = peak_holding(plan.buffers, [*plan.already, *released], plan.persistable,
                             batch_size)
        text = (f"garbage collection is off: {len(released)} temporaries are freed right "
                f"after their last use by {ops} release ops (share_buffer from an empty "
                "variable: Paddle 3 has no delete_var op); the others are held until the "
                "run ends")
        if plan.already:
            text += f"; {len(plan.already)} were released before"
    kept = sorted(options.skip_opt_set & set(plan.buffers))
    notes = [f"kept by skip_opt_set: {', '.join(kept)}"] if kept else []
    return Report(
        program_type=program_type, level=options.level, skip_grads=False, gc=gc,
        runtime=runtime, temporaries_before=Bytes.total(sizes),
        temporaries_after=Bytes.total(sizes), batch_size=batch_size,
        persistable_bytes=sum(_as_size(s).at(batch_size) for s in plan.persistable),
        peak_before=before[0], peak_after=after[0], top_holders=after[1], release=text,
        not_merged=dict(plan.reasons), seconds=seconds, notes=notes, released=list(released))


# -- the public API ----------------------------------------------------------------

def _default_program(program):
    if program is not None:
        return program
    import paddle

    return paddle.static.default_main_program()


@contextlib.contextmanager
def _without_cycle_collection():
    """Pause Python's cyclic garbage collector for the duration.

    Planning allocates many small objects while Paddle programs (large
    object graphs) are alive, so the collector's passes land inside
    memory_optimize: on ResNet-50 with a dozen programs alive, median CPU
    time 0.127 s -> 0.116 s paused, and no more 0.25 s outliers when a full
    pass falls inside; on bench_scale's 100,000-op program (level 0, GC
    off) 22.6-24.8 s -> 13.8-14.4 s CPU.  Nothing planned here needs a
    cycle collected mid-way.
    """
    was_enabled = python_gc.isenabled()
    python_gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            python_gc.enable()


def _dispatch(program, options: Options, release: bool) -> Report:
    with _without_cycle_collection():
        return _dispatch_to_adapter(program, options, release)


def _dispatch_to_adapter(program, options: Options, release: bool) -> Report:
    from .paddle import legacy

    if legacy.is_legacy_program(program):
        if release:
            return legacy.release_memory(program, options)
        return legacy.memory_optimize(program, options)
    from .paddle import pir

    if pir.is_pir_program(program):
        if release:
            fn = getattr(pir, "release_memory", None)
            if fn is None:
                raise UnsupportedProgramError(
                    "release_memory is not available for PIR programs in this version")
            return fn(program, options)
        return pir.memory_optimize(program, options)
    raise UnsupportedProgramError(
        f"memory_optimize takes a Paddle static program (paddle.base.framework.Program "
        f"or paddle.pir.Program), got {type(program).__name__}")


def memory_optimize(program=None, skip_opt_set=None, skip_grads: bool = True,
                    level: int = 0, print_log: bool = False) -> Report:
    """Rewrite a Paddle static program so that variables share memory.

    Parameters
    ----------
    program : a legacy ``paddle.base.framework.Program`` or a
        ``paddle.pir.Program``; None means
        ``paddle.static.default_main_program()``.  Rewritten in place.
    skip_opt_set : names or Variables never renamed and whose memory is
        never given to another (a set, list or tuple -- not a bare string).
    skip_grads : leave the backward part (gradients) alone.
    level : 0 -- share only between the same shape and dtype; 1 -- share
        between the same dtype whenever the memory taken over is provably
        large enough (sizes symbolic in the batch dimension are compared for
        every batch size); never across dtypes, as Paddle's executor reads
        each variable's declared dtype.
    print_log : print the report (one line per reuse and a summary).

    Returns
    -------
    Report
        What was merged and the estimated memory before/after.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (see :func:`resolve_options`).
    UnsupportedProgramError
        ``program`` is not a Paddle static program.
    PlanError
        The plan failed a check (a bug): the program is unchanged.

    A later ``Executor.run`` that fetches a merged variable raises
    :class:`memopt.errors.MergedVariableError` naming it and the
    ``skip_opt_set`` fix, instead of returning another variable's data.
    """
    options = resolve_options(skip_opt_set, skip_grads, level, print_log)
    report = _dispatch(_default_program(program), options, release=False)
    if options.print_log:
        print(report)
    return report


def release_memory(program=None, skip_opt_set=None) -> Report:
    """Free each temporary of ``program`` right after its last use.

    Fluid did this by inserting ``delete_var`` ops.  With Paddle's
    eager-deletion garbage collector on (``FLAGS_eager_delete_tensor_gb``
    >= 0, the default) the executor frees every temporary after its last
    use itself, and the program is left as it is.  With it off, a legacy
    program gets a release op right after the last use of each temporary of
    its global block (:mod:`memopt.release`: gradients included; variables
    of control flow, fetched or likely fetched variables and ``skip_opt_set``
    are kept); a later fetch of a released variable raises
    :class:`memopt.errors.MergedVariableError`.  Call it after
    :func:`memory_optimize`: the two together hold the least memory a run
    with the collector off can.  PIR programs are left as they are.  The
    Report's ``released`` lists the freed names.
    """
    options = resolve_options(skip_opt_set)
    return _dispatch(_default_program(program), options, release=True)
