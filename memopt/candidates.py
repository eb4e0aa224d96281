"""Who may share memory, and why not; which ops may run in place.

*Candidates* are the variables that may share memory: dense, not persistable,
not fed, fetched or declared data, not live at entry (read in their block
before any op of it writes them), not in ``skip_opt_set``, not a gradient
when ``skip_grads``, not likely to be fetched (the loss, an output nobody
reads, the input of a fetch op), and used in one block only by ops that run
no sub-block (a variable a control-flow op or a second block touches is left
alone; locals of sub-blocks at any depth are candidates among themselves).
:func:`classify` finds them and the reason (a :class:`memopt.refusals.Refusal`,
the keys of ``Report.not_merged``) every other temporary is left alone for.

*In place* (:func:`inplace_pairs`): where an op whose Paddle kernel may run
in place (the adapter's ``facts.inplace`` pair, or its ``facts.inplace_alt``: an
elementwise add of three equal shapes writing into ``Y``) reads a candidate
for the last time and writes a candidate of the same shape and dtype (level
1: of any shape of the same size, as ``reshape2``), the output takes the
input's memory at that very op.

*In-place variants* (:func:`variant_inplace`): where the runtime has an
in-place variant of an op (PIR's ``relu_``, the adapter's
``facts.variant``), the op is turned into it when its input dies there; the
rules and reasons (``Refusal.PROTECTED``...) are on that function.

*Dims-only reads* (:func:`dims_only_substitutions`): a grad op that reads a
variable for its dims only (``elementwise_add_grad``'s ``X``) reads an
operand of the same dims instead, so the variable dies at its last real use.

Works on a :class:`memopt.graph.Graph`; imports no Paddle.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

from .graph import Block, Graph, Size, Var
from .liveness import analyze_graph
from .plan import InplaceRewrite, Options
from .problems import Buffer
from .refusals import Refusal

__all__ = ["classify", "inplace_pairs", "can_run_in_place", "looped_blocks", "var_size",
           "temporaries", "persistable_sizes", "reason_counts", "dims_only_substitutions",
           "substitute", "variant_inplace", "GRAD_SUFFIX", "Refusal", "in_flight_names"]


GRAD_SUFFIX = "@GRAD"

def _is_grad(name: str) -> bool:
    return GRAD_SUFFIX in name


def in_flight_names(graph: Graph) -> frozenset:
    """Every name an asynchronous (communication) op of ``graph`` may read or
    write until the end of the step (``OpFacts.in_flight``, stated by the
    adapter: :mod:`memopt.paddle.distributed`): never shared, given away,
    written in place or released."""
    return frozenset(name for block in graph.blocks for op in block.ops
                     for name in op.facts.in_flight)


def classify(graph: Graph, options: Options, intervals, free_outputs=frozenset(),
              excluded=frozenset()) -> Tuple[Dict[str, int], Dict[str, Refusal], Dict[str, int]]:
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
            if op.facts.loss:
                loss_written.update(op.writes)
    declared: Dict[str, List[int]] = {}
    for block_idx, var in graph.all_vars():
        declared.setdefault(var.name, []).append(block_idx)
    fetched = set(graph.fetch_names)
    # buffers an asynchronous (communication) op may read or write until the
    # end of the step (OpFacts.in_flight)
    in_flight = in_flight_names(graph)

    candidates: Dict[str, int] = {}
    reason_of: Dict[str, Refusal] = {}
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
            reason = Refusal.KIND
        elif var.persistable:
            reason = Refusal.PERSISTABLE
        elif var.is_feed or var.is_fetch or var.is_data:
            reason = Refusal.IO
        elif name in read_first:
            reason = Refusal.ENTRY
        elif name in in_flight:
            reason = Refusal.COMM
        elif name in options.skip_opt_set:
            reason = Refusal.SKIP
        elif options.skip_grads and (_is_grad(name) or name in grad_written):
            reason = Refusal.GRAD
        elif name in loss_written or name in fetched or (homes[0] == 0 and name not in read):
            reason = Refusal.FETCHED
        elif (len(homes) > 1 or name in control or name in excluded
              or len(blocks_of.get(name, ())) != 1
              or homes[0] not in blocks_of.get(name, ())):
            reason = Refusal.SHARED
        elif var_size(var).coefficient == 0:
            continue
        else:
            candidates[name] = homes[0]
            continue
        reason_of[name] = reason
    return candidates, reason_of, home


def looped_blocks(graph: Graph) -> set:
    """Indices of the blocks run repeatedly: loop bodies and their sub-blocks."""
    looped: set = set()
    for block in graph.blocks:  # parents come before children
        for op in block.ops:
            if op.loop or block.idx in looped:
                looped.update(op.sub_blocks)
    return looped


def inplace_pairs(graph: Graph, live, candidates: Dict[str, int], intervals,
                  level: int = 0, allowed=None) -> List[Tuple[str, str, int]]:
    """``(input, output, position)`` for every op that can run in place on a
    dying candidate input of the output's dtype and shape -- at level 1, of
    any shape whose size is the input's for every batch size (``reshape2``,
    ``flatten``: Paddle's kernel then only relabels the dims of the one
    tensor instead of copying it into a second one).

    Skipped: an op that also writes its input or also reads its output
    (renaming would make it write, or read, one name twice), an input
    no earlier op of its block wrote (a value carried in from outside or
    from the previous loop iteration: there is nothing to take over yet),
    and a pair ``allowed(src, dst, op)`` refuses (see memopt.any_order).
    """
    looped = looped_blocks(graph)
    pairs = []
    written: Dict[int, set] = {}  # block -> names written by the ops before pos
    for pos, (block_idx, _, op) in enumerate(live.positions):
        before = written.setdefault(block_idx, set())
        # Paddle's declared pair first, then the adapter's alternative (an
        # elementwise add of equal shapes may write into either operand)
        options = [p for p in (op.facts.inplace, op.facts.inplace_alt)
                   if p is not None and p[0] in before]
        before.update(op.writes)
        for src, dst in options:
            if (allowed is None or allowed(src, dst, op)) and can_run_in_place(
                    graph, live, candidates, intervals, level, looped,
                    pos, block_idx, op, src, dst):
                pairs.append((src, dst, pos))
                break
    return pairs


def can_run_in_place(graph: Graph, live, candidates, intervals, level: int, looped,
                      pos: int, block_idx: int, op, src: str, dst: str) -> bool:
    """Whether ``op`` at ``pos`` may write candidate ``dst`` into the memory
    of candidate ``src``, which dies there (see :func:`inplace_pairs`)."""
    if candidates.get(src) != block_idx or candidates.get(dst) != block_idx or src == dst:
        return False
    if src in op.writes or dst in op.reads:
        return False
    if intervals[src].end != pos or intervals[dst].start != pos:
        return False
    a, b = graph.var(src, block_idx), graph.var(dst, block_idx)
    if a.dtype != b.dtype or (tuple(a.shape) != tuple(b.shape) and (
            level != 1 or var_size(a) != var_size(b))):
        return False
    # in a loop body the input's interval may end here yet the value be
    # carried to the next iteration: ask the liveness itself
    return not (block_idx in looped and src in live.live_out(pos))


_SIZES: Dict[tuple, Size] = {}


def var_size(var: Var) -> Size:
    """``var.size``, memoized on (shape, dtype, kind): shapes repeat a lot."""
    key = (var.shape, var.dtype, var.kind)
    size = _SIZES.get(key)
    if size is None:
        size = _SIZES[key] = var.size
    return size


def reason_counts(reason_of: Dict[str, Refusal]) -> Dict[Refusal, int]:
    """``{reason: how many temporaries were left alone for it}``."""
    counts: Dict[Refusal, int] = {}
    for reason in reason_of.values():
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def persistable_sizes(graph: Graph, home: Dict[str, int]) -> List[Size]:
    """Sizes of the dense persistable variables among ``home``'s names."""
    variables = (graph.blocks[b].vars[name] for name, b in home.items())
    return [var_size(var) for var in variables if var.is_dense and var.persistable]


def temporaries(graph: Graph, intervals) -> Dict[str, Buffer]:
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
        size = var_size(var)
        if size.coefficient:
            lower, upper = interval.half_open
            out[name] = Buffer(name, lower, upper, size.plain())
    return out



def dims_only_substitutions(graph: Graph) -> List[Tuple[int, int, str, str, str]]:
    """``(block, op index, slot, var, substitute)`` for every read an op makes
    of a variable for its dims only, where the adapter found another operand
    of the op with the same dims (``op.facts.dims_only``).

    Reading the substitute instead changes nothing the op computes and lets
    the variable die at its last real use -- what Paddle's garbage collector
    does by itself when it is on; with it off, the variable's memory can then
    be taken over.
    """
    out = []
    for block in graph.blocks:
        for index, op in enumerate(block.ops):
            for slot, (var, sub) in sorted(op.facts.dims_only.items()):
                out.append((block.idx, index, slot, var, sub))
    return out


def substitute(graph: Graph, substitutions) -> Graph:
    """A graph whose ops read the substitutes (see
    :func:`dims_only_substitutions`); blocks, variables and other ops shared."""
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


# -- in-place variants (PIR) ---------------------------------------------------------

def variant_inplace(graph: Graph, options: Options, allowed=None
                    ) -> Tuple[List[InplaceRewrite], Dict[Refusal, int]]:
    """Which ops may soundly be turned into their in-place variants
    (``op.facts.variant``, stated by the adapter); pure data.

    An op qualifies when, for each ``(input, output)`` pair of its variant:
    the input dies at the op (no later read anywhere, loops included), is
    defined in the op's own block by an op that is neither a view
    (``facts.view``) nor synthetic (a loop's carried value, a stack), and is
    not persistable, fed, fetched, in ``skip_opt_set`` or written over by an
    in-place op (``facts.overwrites``) nor in ``options.read_later``; the
    output is not persistable,
    fetched or in ``skip_opt_set``; no other operand of the op reads the
    input; both have the same dtype and, at level 0, the same shape (level
    1: the same size in bytes for every batch size).  With ``skip_grads``,
    backward and optimizer ops are left alone; a variant whose kernel
    refuses to run in place (``kernel_refuses``) too.  ``allowed(src, dst,
    op)``, when given, must accept every pair (``memory_optimize(level=2)``
    passes :func:`memopt.any_order.single_reader_rule`: only variants whose
    peak no executor order can raise).

    Returns ``(rewrites, reasons)``: the :class:`memopt.plan.InplaceRewrite`
    list in program order and ``{reason: ops left alone for it}``.
    """
    positions = list(graph.walk_ops())
    live = analyze_graph(graph)
    in_flight = in_flight_names(graph)
    skip = set(options.skip_opt_set) | in_flight
    var_block: Dict[str, int] = {}
    for block_idx, var in graph.all_vars():
        var_block.setdefault(var.name, block_idx)
    owners = {sub: pos for pos, (_, op) in enumerate(positions) for sub in op.sub_blocks}
    overwritten_persistable = set()
    maker_of: Dict[str, int] = {}  # name -> flat position of its first writer
    for pos, (_, op) in enumerate(positions):
        for src, dst in op.facts.overwrites:
            overwritten_persistable.add(dst)
        for name in op.writes:
            maker_of.setdefault(name, pos)
    rewrites: List[InplaceRewrite] = []
    reasons: Dict[Refusal, int] = {}

    def refuse(reason: Refusal) -> None:
        reasons[reason] = reasons.get(reason, 0) + 1

    for pos, (block_idx, op) in enumerate(positions):
        variant = op.facts.variant
        if variant is None:
            continue
        if variant.kernel_refuses:
            refuse(Refusal.KERNEL)
            continue
        if options.skip_grads and op.role in ("backward", "optimize"):
            refuse(Refusal.GRAD)
            continue
        if not variant.pairs:
            continue
        pairs, reason = [], None
        for pair in variant.pairs:
            if pair is None:
                reason = Refusal.SHAPE
                break
            nin, nout, repeated = pair
            var_in, var_out = graph.find_var(nin, block_idx), graph.find_var(nout, block_idx)
            if var_in is None or var_out is None or not var_in.is_dense or not var_out.is_dense:
                reason = Refusal.SHAPE
                break
            if nin in in_flight or nout in in_flight:
                reason = Refusal.COMM
                break
            if (var_in.persistable or var_in.is_data or var_in.is_feed or var_in.is_fetch
                    or var_out.persistable or var_out.is_fetch or nin in skip or nout in skip
                    or nin in overwritten_persistable or nin in graph.fetch_names
                    or nout in graph.fetch_names):
                reason = Refusal.PROTECTED
                break
            maker = maker_of.get(nin)
            maker_op = positions[maker][1] if maker is not None else None
            if (var_block.get(nin) != block_idx or maker is None or maker_op.facts.view
                    or maker_op.facts.synthetic):
                reason = Refusal.OUTSIDE
                break
            if repeated:
                reason = Refusal.ALIVE
                break
            if nin in options.read_later:
                reason = Refusal.READ_LATER
                break
            if live.liveness.is_live_out(pos, nin) or _read_later_in_loop(
                    positions, owners, block_idx, pos, nin):
                reason = Refusal.ALIVE
                break
            if var_in.dtype != var_out.dtype or (
                    tuple(var_in.shape) != tuple(var_out.shape) if options.level == 0
                    else var_in.size != var_out.size):
                reason = Refusal.SHAPE
                break
            if allowed is not None and not allowed(nin, nout, op):
                reason = Refusal.ORDER
                break
            pairs.append((nin, nout))
        if reason:
            refuse(reason)
            continue
        rewrites.append(InplaceRewrite(pos, op.type, tuple(pairs), block_idx))
    return rewrites, reasons


def _read_later_in_loop(positions, owners, block_idx, pos, name) -> bool:
    """Whether ``name`` is read again by a later iteration of a loop around
    op ``pos`` (liveness already says so for values defined outside the
    loop; this guards values defined inside that a loop-carried read may
    reach through the back edge)."""
    b = block_idx
    while b in owners:
        owner = positions[owners[b]][1]
        if owner.loop:
            head = owners[b]
            return name in owner.reads or name in owner.writes or any(
                name in op.reads for i, (_, op) in enumerate(positions)
                if head <= i < pos and _inside(positions, owners, i, b))
        b = positions[owners[b]][0]
    return False


def _inside(positions, owners, position: int, block: int) -> bool:
    b = positions[position][0]
    while True:
        if b == block:
            return True
        if b not in owners:
            return False
        b = positions[owners[b]][0]
