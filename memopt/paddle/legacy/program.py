"""Legacy Paddle programs (``paddle.base.framework.Program``) <-> memopt.

Two jobs, kept apart:

- :func:`program_to_graph` reads a program into a :class:`memopt.graph.Graph`
  without touching it: every block, every variable (shape with ``-1`` for the
  batch, dtype, kind, persistable / feed / fetch / data flags), every op (what
  it reads and writes, the sub-blocks it runs, its role from ``op_role``,
  ``loop`` for ``while`` / ``while_grad``).  Each op's
  :class:`~memopt.graph.OpFacts` state what the planner needs from Paddle:
  ``loss`` (the op has the Loss role), ``inplace`` (the input/output pair
  Paddle's kernel may run in place, from the op's declared in-place
  inferer, kept only where bit-exact), ``inplace_alt`` (``elementwise_add``'s
  ``(Y, Out)`` where X, Y and Out have one shape), ``dims_only`` (inputs
  read for their dims only, with an operand of the same dims that can stand
  in), ``aliases`` (einsum), ``full_writes`` / ``sub_outputs`` (control grad
  ops) and ``release`` (a release :func:`insert_releases` put there);
  ``attrs["index"]`` is the op's position in its block.
- :func:`rewrite` changes a program: input substitutions, renames (per block,
  every use of a name replaced by another) and a new order of block 0's ops.
  Everything is validated first and applied in one go; if anything fails
  midway the steps done are undone, so the program is either fully rewritten
  or exactly as it was.  :func:`insert_releases` adds the ops that free
  temporaries after their last use (all or nothing too).

:mod:`memopt.api` wires this adapter to the planners; the adapter never
calls them.  The memory merged or released lives under fresh names and the
old names leave the program, with the record in the program's desc
(:mod:`memopt.paddle.legacy.merge_record`), so a later fetch of such a variable
fails by name wherever the program goes (:class:`memopt.errors.MergedVariableError`
where memopt is imported).

Paddle is imported lazily, inside the functions.
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ...errors import GraphError, UnsupportedProgramError
from ...graph import DENSE, RELEASED_VAR, Block, Graph, Op, OpFacts, Var
from ..distributed import mark_in_flight

log = logging.getLogger(__name__)

#: op_role bits (paddle.base.core.op_proto_and_checker_maker.OpRole)
ROLE_BACKWARD = 0x0001
ROLE_OPTIMIZE = 0x0002
ROLE_LR_SCHED = 0x0010
ROLE_LOSS = 0x0100

#: Ops that run their sub-block repeatedly (values carried across iterations).
LOOP_OPS = frozenset({"while", "while_grad", "recurrent", "recurrent_grad"})

#: Name Paddle uses for "no variable here" in grad op outputs.
EMPTY_VAR = "@EMPTY@"

#: Output slots whose variables are declared with a placeholder shape but hold
#: real data at run time (einsum's cached operands): their size is unknown, so
#: they get this kind and are never merged.  (They could not be anyway: the
#: kernel points the cache at its transposed operand's buffer, which is the
#: operand's own memory when no transpose is needed, so another variable
#: written into a merged cache would overwrite that operand.)  Where a cache
#: may be its operand's buffer (:func:`einsum_cache_copies`), the operand is
#: left alone too (the einsum's ``facts.aliases``): merged, its memory
#: could be taken over before ``einsum_grad`` reads the cache, and a later
#: member written by a kernel that hands its output a new buffer (einsum's
#: own) would leave the cache holding the old one (measured on the
#: Transformer: 0.5 MiB more held at GC off).
_UNSIZED_SLOTS = frozenset({"InnerCache"})
UNSIZED = "unsized"


def einsum_cache_copies(equation: str, shapes: List[tuple]) -> List[bool]:
    """Per operand of a two-operand ``einsum``: whether its ``InnerCache``
    output is surely a fresh transposed copy of the operand (same number of
    elements, its own buffer) rather than the operand's own buffer.

    Paddle's kernel (``PerformContraction``) caches each operand after
    moving its labels into the order batch, free-of-A, free-of-B,
    contraction (operand 1: batch, contraction, free-of-A, free-of-B), each
    group in order of first appearance; where that order is the operand's
    own, no transpose runs and the cache points at the operand's buffer.
    This replays that ordering.  False (may alias, or a size that differs
    from the operand's) for anything else: a label repeated in an operand
    (diagonal), a label summed away (reduction), a dimension of size 1 or
    two occurrences of a label with different declared sizes (the kernel
    may tile), a broadcast ``...``, or not exactly two operands.
    """
    if "->" not in equation or "." in equation:
        return [False] * len(shapes)
    left, right = equation.split("->", 1)
    ops = left.split(",")
    if len(ops) != 2 or len(shapes) != 2 or not all(
            c.islower() and c.isalpha() for c in left.replace(",", "") + right):
        return [False] * len(shapes)
    if any(len(set(op)) != len(op) or len(op) != len(shape) for op, shape in zip(ops, shapes)):
        return [False] * 2
    dims: Dict[str, set] = {}
    for op, shape in zip(ops, shapes):
        for label, dim in zip(op, shape):
            dims.setdefault(label, set()).add(int(dim))
    if any(len(d) != 1 or 1 in d for d in dims.values()):
        return [False] * 2
    batch, a_free, b_free, contraction, reduction = range(5)
    kind = {c: b_free for c in right}
    seen: Dict[str, int] = {}
    order: List[str] = []
    for op in ops:
        for c in op:
            if c not in seen:
                order.append(c)
            seen[c] = seen.get(c, 0) + 1
            if seen[c] == 2:
                kind[c] = batch if kind.get(c) == b_free else contraction
    for c in ops[0]:
        if kind.get(c) == b_free:
            kind[c] = a_free
    for c in order:
        kind.setdefault(c, reduction)
    out = []
    for idx, op in enumerate(ops):
        groups = ((batch, a_free, b_free, contraction, reduction) if idx == 0
                  else (batch, contraction, a_free, b_free, reduction))
        moved = [c for g in groups for c in order if kind[c] == g and c in op]
        out.append(not any(kind[c] == reduction for c in op) and moved != list(op))
    return out


#: Output slots that carry dims only: Paddle's kernels never allocate them
#: (measured: einsum's ``XShape``, declared with its operand's full shape,
#: is an uninitialised tensor of dims ``[0]`` after a run; ``reshape2``'s is
#: declared ``[0, ...]``).  They get this kind: no bytes, never merged.
_META_SLOTS = frozenset({"XShape"})
META = "meta"

#: The op a release is made of: ``share_buffer(X=[RELEASED_VAR], Out=[v])``
#: leaves ``v`` holding no memory (no op writes :data:`RELEASED_VAR`), and its
#: old buffer goes back to the allocator (measured on Paddle 3.3.1 with the
#: garbage collector off: the allocator's count drops by ``v``'s bytes at that
#: op).  Paddle 3 has no ``delete_var`` op.
RELEASE_OP = "share_buffer"

#: ``Variable.detach()`` in a legacy static program: ``share_data``, whose
#: output shares its input's buffer.
SHARE_DATA_OP = "share_data"

_KIND_OF_TYPE: Dict[int, str] = {}


def _lod_names(program) -> set:
    """Names of the tensors of ``program`` that may carry a LoD (sequence
    lengths) at run time: its desc's ``lod_level`` is above 0, or it is the
    gradient of one.

    Never merged (the writing op's ``facts.aliases``): a kernel that does
    not set its output's LoD leaves the LoD its buffer last held, so a
    tensor written into the memory of a LoD tensor came back with that LoD
    (measured, level 1: a fetched ``transpose`` behind a ``reduce_mean``
    that took a ``sequence_conv`` output's memory carried ``[[0, 3, 7]]``,
    which ``return_numpy=True`` refuses and a sequence op reading it would
    take for its lengths)."""
    carriers = {name for pblock in program.blocks for name, pvar in pblock.vars.items()
                if _desc_lod_level(pvar.desc) > 0}
    if not carriers:
        return carriers
    grads = {name for pblock in program.blocks for name in pblock.vars
             if "@GRAD" in name and name.split("@GRAD", 1)[0] in carriers}
    return carriers | grads


def _desc_lod_level(desc) -> int:
    try:
        return int(desc.lod_level())
    except Exception:  # a variable type without a LoD level (readers, scopes)
        return 0


def is_legacy_program(obj) -> bool:
    """Whether ``obj`` is a legacy ``paddle.base.framework.Program``."""
    try:
        from paddle.base.framework import Program
    except ImportError:  # pragma: no cover - paddle missing
        return False
    return isinstance(obj, Program)


def _kind_names() -> Dict[int, str]:
    if not _KIND_OF_TYPE:
        from paddle.base import core

        vt = core.VarDesc.VarType
        for attr in dir(vt):
            if attr.isupper():
                _KIND_OF_TYPE.setdefault(int(getattr(vt, attr)), attr.lower())
        _KIND_OF_TYPE[int(vt.DENSE_TENSOR)] = DENSE
    return _KIND_OF_TYPE


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:
    from paddle.base.data_feeder import convert_dtype

    return convert_dtype(dtype)


@functools.lru_cache(maxsize=None)
def _has_inplace(op_type: str) -> bool:
    from paddle.base import core

    try:
        return bool(core.has_infer_inplace(op_type))
    except Exception:  # an op without OpInfo (a pure-python or unknown op)
        return False


#: Forward ops with a dims-only ``XShape`` output whose ``X -> Out`` pair
#: stays in place when both are one variable: their shape inference reads
#: ``X``'s dims into ``XShape`` before it resizes ``Out`` (measured on Paddle
#: 3.3.1: the grad gets ``X``'s shape back).  ``flatten_contiguous_range``
#: resizes ``Out`` first, so one variable gives ``XShape`` -- and the grad op
#: reading it -- the flattened dims: ``X@GRAD`` comes back flattened, and a
#: conv bias grad reading it fails (``conv2d_grad``: end row index out of
#: bound).  Other ``XShape`` ops (``flatten2``) are unmeasured and so kept
#: out of place.
_XSHAPE_INPLACE_OK = frozenset({"reshape2", "squeeze2", "unsqueeze2"})


def _inplace_pair(op_type: str, inputs: Mapping[str, list],
                  outputs: Mapping[str, list]) -> Optional[Tuple[str, str]]:
    """The ``(input var, output var)`` pair Paddle may run in place, or None.

    Paddle declares in-place pairs per op type (``core.has_infer_inplace``)
    but does not expose which slots; its inferers follow two patterns, used
    here: forward ops pair ``X`` with ``Out`` (``sum``: its first ``X``), grad
    ops ``Out@GRAD`` with ``X@GRAD`` (``softmax_with_cross_entropy_grad``:
    ``Softmax`` with ``Logits@GRAD``).  Only single-variable slots qualify,
    and only where neither name is used in another slot of the op.
    """
    if not _has_inplace(op_type):
        return None
    if outputs.get("XShape") and op_type not in _XSHAPE_INPLACE_OK:
        return None
    if op_type == "softmax_with_cross_entropy_grad":
        src, dst = "Softmax", "Logits@GRAD"
    elif op_type.endswith("_grad"):
        src, dst = "Out@GRAD", "X@GRAD"
    else:
        src, dst = "X", "Out"
    ins, outs = inputs.get(src) or [], outputs.get(dst) or []
    if op_type == "sum" and ins:
        ins = ins[:1]
    if len(ins) != 1 or len(outs) != 1 or EMPTY_VAR in (ins[0], outs[0]):
        return None
    src_var, dst_var = ins[0], outs[0]
    # the pair must be the op's only use of either name
    if sum(names.count(src_var) for names in inputs.values()) != 1:
        return None
    if sum(names.count(dst_var) for names in outputs.values()) != 1:
        return None
    if src_var in (n for names in outputs.values() for n in names):
        return None
    if dst_var in (n for names in inputs.values() for n in names):
        return None
    return src_var, dst_var


#: Control-flow grad ops: after their body ran they read the body's local
#: gradient of each input ``x`` (``x@GRAD``) and write it to the parent's
#: variable named in ``Input@GRAD`` / ``X@GRAD``.
_GRAD_CONTROL_OPS = {"conditional_block_grad": ("Input", "Input@GRAD"),
                     "while_grad": ("X", "X@GRAD")}


def _control_grad_facts(facts: OpFacts, op_type: str, desc, surely_written) -> None:
    """Set ``facts.sub_outputs`` (the body's local gradients the op reads
    back after the body ran) and, for ``conditional_block_grad``,
    ``facts.full_writes``.

    ``conditional_block_grad`` writes every parent-side gradient whole: a
    copy of the body's local gradient when the branch ran, zeros of the
    input's shape otherwise (Paddle's ``AssignLocalGradientToParentScope`` /
    ``AssignZeroToParentScope``), never reading it -- provided the input
    holds a tensor (zeros take its dims; an input holding none leaves the
    gradient untouched): so only gradients of inputs ``surely_written``
    (see :func:`_surely_written`) are ``full_writes``.  ``while_grad``
    accumulates into its parent-side gradients across iterations, so it gets
    no ``full_writes``.
    """
    in_slot, out_slot = _GRAD_CONTROL_OPS[op_type]
    inputs = desc.input(in_slot)
    facts.sub_outputs = tuple(n + "@GRAD" for n in inputs if n != EMPTY_VAR)
    outputs = desc.output(out_slot)
    if op_type == "conditional_block_grad" and len(outputs) == len(inputs):
        facts.full_writes = tuple(out for out, x in zip(outputs, inputs)
                                  if EMPTY_VAR not in (out, x) and surely_written(x))


def _surely_written(program, pblock, index: int):
    """``surely_written(name)``: whether variable ``name`` holds a tensor
    when op ``index`` of ``pblock`` runs -- a parameter, a data variable, or
    written by an op without sub-blocks earlier in the block, or anywhere in
    the forward block a grad block belongs to (which ran whole before it).
    Anything else (a value only a branch or a loop writes) may hold none."""
    def plain_writers(ops):
        out = set()
        for op in ops:
            if not _sub_block_ids(op.desc):
                out.update(op.desc.output_arg_names())
        return out

    written = plain_writers(pblock.ops[:index])
    forward = getattr(pblock, "forward_block_idx", -1)
    if forward is not None and 0 <= forward < program.num_blocks:
        written |= plain_writers(program.block(forward).ops)

    def check(name: str) -> bool:
        if name in written:
            return True
        pvar = pblock._find_var_recursive(name)
        return pvar is not None and (pvar.persistable or _is_data(pvar))

    return check


def _role(op_role: int) -> str:
    if op_role & (ROLE_OPTIMIZE | ROLE_LR_SCHED):
        return "optimize"
    if op_role & ROLE_BACKWARD:
        return "backward"
    return "forward"


_BLOCK_ATTRS: Dict[str, Tuple[Tuple[str, bool], ...]] = {}


def _sub_block_ids(desc) -> Tuple[int, ...]:
    """Indices of the blocks an op runs (its BLOCK / BLOCKS attributes).

    Which attributes hold blocks depends on the op type only, so it is
    looked up once per type.
    """
    op_type = desc.type()
    names = _BLOCK_ATTRS.get(op_type)
    if names is None:
        from paddle.base import core

        found = []
        for name in desc.attr_names():
            kind = desc.attr_type(name)
            if kind == core.AttrType.BLOCK:
                found.append((name, False))
            elif kind == core.AttrType.BLOCKS:
                found.append((name, True))
        names = _BLOCK_ATTRS[op_type] = tuple(found)
    ids: List[int] = []
    for name, many in names:
        if not desc.has_attr(name):
            continue
        if many:
            ids.extend(desc._blocks_attr_ids(name))
        else:
            ids.append(desc._block_attr_id(name))
    return tuple(ids)


def _slots(names: Iterable[str], get) -> Dict[str, list]:
    return {slot: [n for n in get(slot) if n != EMPTY_VAR] for slot in names}


def _is_data(pvar) -> bool:
    """Whether a legacy variable is declared data (``paddle.static.data``).

    ``Variable.is_data`` is a Python-only flag, lost when a program is read
    back from bytes (``Program.parse_from_string``, every saved model); the
    desc's ``need_check_feed`` (set by ``paddle.static.data`` and
    serialized) survives, so either marks data.
    """
    if getattr(pvar, "is_data", False):
        return True
    need_check_feed = getattr(pvar.desc, "need_check_feed", None)
    return bool(need_check_feed()) if need_check_feed is not None else False


def _operand_y_in_place(pblock, desc) -> Optional[Tuple[str, str]]:
    """``(Y, Out)`` where an ``elementwise_add`` may write its output into
    ``Y``'s memory: ``X``, ``Y`` and ``Out`` are three names of one declared
    shape and dtype (no broadcast, so each output element is computed from
    the two input elements at its own index, and Paddle's kernel reads them
    before writing it -- the same reason it declares ``X -> Out`` in place).
    """
    xs, ys, outs = desc.input("X"), desc.input("Y"), desc.output("Out")
    if len(xs) != 1 or len(ys) != 1 or len(outs) != 1 or len({xs[0], ys[0], outs[0]}) != 3:
        return None
    pvars = [pblock._find_var_recursive(n) for n in (xs[0], ys[0], outs[0])]
    if any(v is None for v in pvars):
        return None
    shapes = {tuple(v.desc.shape()) for v in pvars}
    dtypes = {v.desc.dtype() for v in pvars}
    if len(shapes) != 1 or len(dtypes) != 1:
        return None
    return ys[0], outs[0]


def _aliasing_einsum_caches(pblock, desc) -> Dict[str, str]:
    """``{cache: operand}`` for each ``InnerCache`` output of an ``einsum``
    op that may be its operand's own buffer (see :func:`einsum_cache_copies`)."""
    operands = desc.input("Operands")
    caches = desc.output("InnerCache")
    pvars = [pblock._find_var_recursive(name) for name in operands]
    shapes = [tuple(v.desc.shape()) if v is not None else () for v in pvars]
    equation = desc.attr("equation") if desc.has_attr("equation") else ""
    copies = einsum_cache_copies(equation, shapes)
    if len(caches) != len(operands):
        copies = [False] * len(operands)
    return {cache: operand for cache, operand, copy in zip(caches, operands, copies)
            if cache != EMPTY_VAR and not copy}


def program_to_graph(program) -> Graph:
    """Read a legacy Paddle program into a :class:`~memopt.graph.Graph`.

    Read-only: the program is not changed.  Variables stay in the block that
    declares them (a name a block borrows from a sibling's scope, as a
    ``while_grad`` body does, is declared in the borrower too); ``@EMPTY@``
    placeholders are left out.  Feed and fetch ops of block 0 mark their
    variables ``is_feed`` / ``is_fetch`` and the fetched names become the
    graph's ``fetch_names``.

    Raises
    ------
    UnsupportedProgramError
        ``program`` is not a legacy Program.
    GraphError
        An op writes a name no enclosing block declares.
    """
    if not is_legacy_program(program):
        raise UnsupportedProgramError(
            f"expected a legacy paddle.base.framework.Program, got {type(program).__name__}")
    kinds = _kind_names()
    dims_slots: Dict[Tuple[int, int], dict] = {}  # (block, op index) -> slots
    blocks: List[Block] = []
    unsized: set = set()
    meta: set = set()
    fetched: List[str] = []
    fed: set = set()
    lod = _lod_names(program)
    run = blocks_run(program)
    seeds: set = set()  # what ops filling ones write (see _mark_gradient_targets)
    for pblock in program.blocks:
        block = Block(pblock.idx, pblock.parent_idx)
        blocks.append(block)
        for pvar in pblock.vars.values():
            desc = pvar.desc
            kind = kinds.get(int(desc.type()), "other")
            if kind == DENSE:
                shape, dtype = tuple(desc.shape()), _dtype_name(desc.dtype())
            else:
                shape, dtype = (), "float32"
            block.add_var(Var(pvar.name, shape, dtype, kind, persistable=desc.persistable(),
                              is_data=_is_data(pvar)))
        for index, pop in enumerate(pblock.ops):
            desc = pop.desc
            op_type = desc.type()
            reads = tuple(dict.fromkeys(desc.input_arg_names()))
            writes = tuple(dict.fromkeys(desc.output_arg_names()))
            if EMPTY_VAR in reads or EMPTY_VAR in writes:
                reads = tuple(n for n in reads if n != EMPTY_VAR)
                writes = tuple(n for n in writes if n != EMPTY_VAR)
            op_role = desc.attr("op_role") if desc.has_attr("op_role") else 0
            facts = OpFacts(loss=bool(op_role & ROLE_LOSS))
            if _has_inplace(op_type):
                facts.inplace = _inplace_pair(op_type, _slots(desc.input_names(), desc.input),
                                              _slots(desc.output_names(), desc.output))
            if op_type == "elementwise_add":
                facts.inplace_alt = _operand_y_in_place(pblock, desc)
            if op_type in _DIMS_ONLY_OPS and pblock.idx in run:
                dims_slots[(pblock.idx, index)] = {
                    slot: desc.input(slot) for slot in ("X", "Y", "Out@GRAD")}
            if (pblock.idx == 0 and op_type in _GRAD_SEED_OPS and desc.has_attr("value")
                    and desc.attr("value") == 1.0):
                seeds.update(writes)
            if op_type == RELEASE_OP and set(reads) == {RELEASED_VAR}:
                facts.release = tuple(n for n in writes if n != RELEASED_VAR)
            if op_type == "einsum":
                # an operand whose cache may be its own buffer is left alone;
                # a unary einsum may return its operand's own buffer (no
                # transpose, no reduction): merged, its memory would be the
                # operand's, so its output is left alone too
                aliases = tuple(sorted(set(_aliasing_einsum_caches(pblock, desc).values())))
                if len(desc.input("Operands")) == 1:
                    aliases += tuple(desc.output("Out"))
                facts.aliases = aliases
            if op_type == SHARE_DATA_OP:
                # ``x.detach()``: the output is the input's own buffer; a
                # variable renamed into either name wrote over both (level 1,
                # GC off: a matmul output renamed into the detached
                # variable's name wrote over the Linear output silu's
                # backward read)
                facts.aliases += tuple(reads) + tuple(writes)
            if lod:
                facts.aliases += tuple(n for n in writes if n in lod)
            subs = _sub_block_ids(desc)
            if op_type in _GRAD_CONTROL_OPS:
                _control_grad_facts(facts, op_type, desc,
                                    _surely_written(program, pblock, index))
            block.add_op(Op(op_type, reads, writes, subs, _role(int(op_role)),
                            op_type in LOOP_OPS, {"index": index}, facts))
            for slot in _UNSIZED_SLOTS.intersection(desc.output_names()):
                unsized.update(desc.output(slot))
            for slot in _META_SLOTS.intersection(desc.output_names()):
                meta.update(desc.output(slot))
            if pblock.idx == 0 and op_type in ("fetch", "fetch_v2"):
                fetched.extend(reads)
            if pblock.idx == 0 and op_type == "feed":
                fed.update(writes)
    for block in blocks:
        for name in unsized.intersection(block.vars):
            block.vars[name].kind = UNSIZED
        for name in meta.intersection(block.vars):
            block.vars[name].kind = META
    graph = Graph(blocks=blocks)
    _mark_scaled_loss(graph)
    _mark_gradient_targets(graph, seeds)
    _declare_borrowed(graph)
    _drop_unsafe_inplace(graph)
    _find_dims_only_reads(graph, dims_slots)
    for name in fetched:
        var = graph.find_var(name)
        if var is not None:
            var.is_fetch = True
    for name in fed:
        var = graph.find_var(name)
        if var is not None:
            var.is_feed = True
    graph.fetch_names = tuple(dict.fromkeys(fetched))
    return mark_in_flight(graph)


def blocks_run(program) -> set:
    """Indices of the blocks the executor runs: block 0 and the sub-blocks
    its ops (and theirs) run.  Another block is never run: Fluid's
    ``RecomputeOptimizer`` leaves two such blocks behind, whose ops read
    block 0's variables.  Their reads are no dims-only reads memopt may
    substitute (the names they use stay used in two blocks: never merged;
    found: a substitution there let ``fc_1.tmp_0`` be merged, and the
    rewrite refused with a GraphError)."""
    run, todo = {0}, [0]
    while todo:
        for pop in program.block(todo.pop()).ops:
            for sub in _sub_block_ids(pop.desc):
                if sub not in run and 0 <= sub < program.num_blocks:
                    run.add(sub)
                    todo.append(sub)
    return run


#: Ops AMP puts after the user's loss to scale it (``paddle.static.amp``:
#: ``elementwise_mul`` by the persistable ``loss_scaling_*``); Paddle gives
#: the Loss role to that op, not to the one that writes the user's loss.
_LOSS_SCALING_OPS = frozenset({"elementwise_mul", "scale"})


def _mark_scaled_loss(graph: Graph) -> None:
    """Mark the op writing the user's loss as a loss op where the Loss-role
    op only scales it (AMP's loss scaling, :data:`_LOSS_SCALING_OPS`, its
    other operand persistable): the name the user holds and fetches as the
    loss is that op's input, and is kept like the loss (measured: under
    ``paddle.static.amp.decorate`` without ``fetch_list`` the user's loss was
    merged with a gradient and its fetch refused)."""
    ops = graph.global_block.ops
    for index, op in enumerate(ops):
        if not (op.facts.loss and op.type in _LOSS_SCALING_OPS and op.role == "forward"):
            continue
        unscaled = [n for n in op.reads if not graph.var(n, 0).persistable]
        if len(unscaled) != 1:
            continue
        writer = next((w for w in reversed(ops[:index]) if unscaled[0] in w.writes), None)
        if writer is not None and not writer.sub_blocks:
            writer.facts.loss = True


#: The ops that seed a backward pass with ones: ``T@GRAD`` filled like ``T``.
_GRAD_SEED_OPS = frozenset({"fill_any_like", "fill_constant"})


def _mark_gradient_targets(graph: Graph, seeds: set) -> None:
    """Mark the op writing each target of ``paddle.static.gradients`` as a
    loss op: ``gradients([loss], inputs)`` seeds the backward pass with a
    backward-role ``fill_any_like`` of ones of ``loss`` into ``loss@GRAD``
    and gives no op the Loss role that ``append_backward`` / ``minimize``
    give (found: such a program without ``fetch_list`` had its loss merged
    with ``mean_0.tmp_0@GRAD`` and the loss's fetch refused).  ``seeds``:
    the names block 0's ops filling ones write (zeros filled for an unused
    output's gradient seed no loss)."""
    ops = graph.global_block.ops
    for index, op in enumerate(ops):
        if (op.type not in _GRAD_SEED_OPS or op.role != "backward" or len(op.writes) != 1
                or op.writes[0] not in seeds):
            continue
        target = op.writes[0][:-len("@GRAD")] if op.writes[0].endswith("@GRAD") \
            else None
        if target is None or op.reads not in ((), (target,)):
            continue
        writer = next((w for w in reversed(ops[:index]) if target in w.writes), None)
        if writer is not None and writer.role == "forward" and not writer.sub_blocks:
            writer.facts.loss = True


#: Grad ops whose CPU kernels are bit-exact in place when the other input is
#: broadcast over the leading dimensions only (a bias: ``Y`` a suffix of ``X``).
_TRAILING_BROADCAST_OK = frozenset({"elementwise_add_grad", "elementwise_sub_grad"})


def _drop_unsafe_inplace(graph: Graph) -> None:
    """Keep a grad op's in-place pair only where no operand broadcasts.

    Paddle declares ``Out@GRAD -> X@GRAD`` in place for elementwise grads,
    but its CPU kernel for a general broadcast zeroes ``X@GRAD`` before
    reading ``Out@GRAD`` (measured: a conv bias grad run in place changes
    the numbers).  So a grad op's pair is kept only when every dense operand
    has the pair's shape, or (add/sub grads) is a trailing suffix of it.
    """
    for block in graph.blocks:
        for op in block.ops:
            pair = op.facts.inplace
            if pair is None or not op.type.endswith("_grad"):
                continue
            shape = tuple(graph.var(pair[0], block.idx).shape)
            for name in (*op.reads, *op.writes):
                var = graph.var(name, block.idx)
                if not var.is_dense or tuple(var.shape) == shape:
                    continue
                other = tuple(var.shape)
                if (op.type in _TRAILING_BROADCAST_OK and 0 < len(other) < len(shape)
                        and shape[-len(other):] == other):
                    continue
                op.facts.inplace = None
                break


#: Grad ops whose ``X`` and ``Y`` inputs Paddle reads for their dims only
#: (``core.infer_no_need_buffer_slots``), and whose ``Out@GRAD`` has ``Out``'s
#: dims.
_DIMS_ONLY_OPS = frozenset({"elementwise_add_grad", "elementwise_sub_grad"})


def _find_dims_only_reads(graph: Graph, dims_slots: Dict[Tuple[int, int], dict]) -> None:
    """Mark the reads a grad op makes for a variable's dims only.

    ``elementwise_add_grad`` reads ``X`` and ``Y`` for their dims only (Paddle
    declares them no-need-buffer).  Where ``X`` (or ``Y``) has the static
    shape and dtype of ``Out@GRAD`` -- no broadcast on its side, and the
    batch dimension ``-1`` is the same ``B`` -- ``Out@GRAD`` carries the same
    dims, so the slot may read ``Out@GRAD`` instead and the variable need not
    be kept alive (with the garbage collector on, Paddle frees it early
    itself).  ``dims_slots[(block, op index)]`` holds the op's ``X``, ``Y``
    and ``Out@GRAD`` slots; sets ``op.facts.dims_only = {slot: (var,
    substitute)}``.
    """
    for block in graph.blocks:
        for index, op in enumerate(block.ops):
            slots = dims_slots.get((block.idx, index))
            if slots is None:
                continue
            grad = slots.get("Out@GRAD") or []
            if len(grad) != 1:
                continue
            g = graph.var(grad[0], block.idx)
            found = {}
            for slot in ("X", "Y"):
                names = slots.get(slot) or []
                if len(names) != 1 or names[0] == grad[0]:
                    continue
                v = graph.var(names[0], block.idx)
                if (v.is_dense and not v.persistable and tuple(v.shape) == tuple(g.shape)
                        and v.dtype == g.dtype and v.size.coefficient):
                    found[slot] = (names[0], grad[0])
            if found:
                op.facts.dims_only = found


#: The kind of a name an op uses that no block declares: a variable Python
#: put in the scope itself (never merged, no bytes counted).
SCOPE_ONLY = "scope_only"


def _declare_borrowed(graph: Graph) -> None:
    """Declare in a block the names its ops take from a sibling block, and
    check that every other name an op uses is declared.

    A ``while_grad`` body reads the forward body's variables from the step
    scopes the ``while`` op kept, though the forward body is no enclosing
    block.  Such a name gets a copy of its declaration in the block using it
    (the planner never merges a name used in two blocks).  A name declared
    nowhere that no op writes is a variable that lives only in the scope:
    the blocking queue ``DataLoader.from_generator(iterable=False)`` makes
    in the global scope for its ``create_py_reader`` op, say.  It is
    declared in block 0 as :data:`SCOPE_ONLY` (persistable, never given or
    taken memory).  One an op writes raises :class:`GraphError`.
    """
    written = {n for block in graph.blocks for op in block.ops for n in op.writes}
    anywhere: Dict[str, Var] = {}
    for _, var in graph.all_vars():
        anywhere.setdefault(var.name, var)
    visible: List[set] = []
    for block in graph.blocks:  # a parent block always comes before its children
        inherited = visible[block.parent] if 0 <= block.parent < len(visible) else set()
        visible.append(inherited | set(block.vars))
    for block in graph.blocks:
        seen = visible[block.idx]
        for op in block.ops:
            for name in (*op.reads, *op.writes):
                if name in seen:
                    continue
                src = anywhere.get(name)
                if src is None and name in written:
                    raise GraphError(f"op {op.type!r} in block {block.idx} uses {name!r}, "
                                     "which no block of the program declares")
                if src is None:
                    src = Var(name, (), "float32", SCOPE_ONLY, persistable=True)
                    graph.global_block.add_var(src)
                    anywhere[name] = src
                    for i in range(len(visible)):
                        visible[i].add(name)
                    continue
                block.add_var(Var(src.name, src.shape, src.dtype, src.kind,
                                  src.persistable, is_data=src.is_data))
                seen.add(name)


# -- the rewrite ------------------------------------------------------------------

def _edits(program, renames: Mapping[int, Mapping[str, str]]):
    """Every slot to change: ``(op, is_input, slot, old names, new names)``,
    validated before anything is written."""
    edits = []
    for block_idx, mapping in sorted(renames.items()):
        if not mapping:
            continue
        if not 0 <= block_idx < program.num_blocks:
            raise GraphError(f"rename plan names block {block_idx}, but the program has "
                             f"{program.num_blocks} blocks")
        pblock = program.block(block_idx)
        for old, new in sorted(mapping.items()):
            for name in (old, new):
                if not pblock.has_var(name):
                    raise GraphError(f"rename plan names variable {name!r}, which block "
                                     f"{block_idx} does not declare")
            if new in mapping:
                raise GraphError(f"rename plan maps {old!r} to {new!r}, which is itself "
                                 "renamed: plans must map straight to the final name")
        keys = set(mapping)
        for pop in pblock.ops:
            desc = pop.desc
            if keys.isdisjoint(desc.input_arg_names()) and keys.isdisjoint(
                    desc.output_arg_names()):
                continue
            for is_input, slots, get in ((True, desc.input_names(), desc.input),
                                         (False, desc.output_names(), desc.output)):
                for slot in slots:
                    names = get(slot)
                    new_names = [mapping.get(n, n) for n in names]
                    if new_names != names:
                        edits.append((pop, is_input, slot, names, new_names))
    return edits


def _set_slot(pop, is_input: bool, slot: str, names: List[str]) -> None:
    if is_input:
        pop.desc.set_input(slot, names)
    else:
        pop.desc.set_output(slot, names)


def apply_renames(program, renames: Mapping[int, Mapping[str, str]]) -> int:
    """Rename variable uses in ``program``, all at once or not at all.

    ``renames[block index][old] = new``: every op of that block that reads or
    writes ``old`` uses ``new`` instead (both must be declared in the block;
    declarations are kept).  Returns the number of op slots changed.

    On any error the slots already changed are restored and the error is
    re-raised: the program's serialized form is exactly what it was.
    """
    return rewrite(program, renames, None)


def rewrite(program, renames: Mapping[int, Mapping[str, str]],
            order: Optional[List[int]] = None, substitutions=()) -> int:
    """Substitute, rename, then put block 0's ops in ``order`` -- all or nothing.

    ``substitutions`` are ``(block, op index, slot, var, substitute)``: that
    input slot of that op reads ``substitute`` instead of ``var`` (applied
    before the renames, by original op index).

    ``order`` lists block 0's op indices in their new order (None: keep it);
    only the ops that change place are moved (their descs are re-created),
    every other op keeps its Operator object.  Everything is validated
    first; if a step fails midway, the steps done are undone in reverse and
    the error is re-raised.  Returns the number of op slots renamed.
    """
    sub_edits = []
    for block_idx, index, slot, var, sub in substitutions:
        pop = program.block(block_idx).ops[index]
        names = pop.desc.input(slot)
        if var not in names:
            raise GraphError(f"op {index} ({pop.type}) of block {block_idx} does not read "
                             f"{var!r} in slot {slot}")
        sub_edits.append((pop, True, slot, names, [sub if n == var else n for n in names]))
    if order is not None:
        n = len(program.global_block().ops)
        if sorted(order) != list(range(n)):
            raise GraphError(f"the new op order is not a permutation of the {n} ops "
                             "of block 0")
    done = []
    moves: List[Tuple[int, int]] = []
    try:
        for pop, is_input, slot, old_names, new_names in sub_edits:
            _set_slot(pop, is_input, slot, new_names)
            done.append((pop, is_input, slot, old_names))
        edits = _edits(program, renames)
        for pop, is_input, slot, old_names, new_names in edits:
            _set_slot(pop, is_input, slot, new_names)
            done.append((pop, is_input, slot, old_names))
        if order is not None:
            current = list(range(len(order)))
            for k, want in enumerate(order):
                if current[k] == want:
                    continue
                j = current.index(want, k)
                _move_op(program.global_block(), j, k)
                moves.append((j, k))
                current.insert(k, current.pop(j))
    except BaseException:
        block = program.global_block()
        for j, k in reversed(moves):
            _move_op(block, k, j)
        for pop, is_input, slot, old_names in reversed(done):
            _set_slot(pop, is_input, slot, old_names)
        raise
    return len(edits)


def _move_op(block, src: int, dst: int) -> None:
    """Move block op ``src`` so that it ends at index ``dst`` (the ops between
    shift by one); the moved op's desc and Operator are re-created."""
    from paddle.base.framework import Operator

    if src == dst:
        return
    desc = block.desc
    insert_at, old_at = (dst, src + 1) if src > dst else (dst + 1, src)
    new = desc._insert_op(insert_at)
    new.copy_from(desc.op(old_at))
    desc._remove_op(old_at, old_at + 1)
    block.ops.insert(insert_at, Operator(block, new))
    del block.ops[old_at]


# -- fetches of merged variables ---------------------------------------------------

def merged_record(program) -> Dict[str, str]:
    """``{user name: the fresh name its memory now lives under}`` for every
    variable a rewrite of ``program`` (or of the program it was copied or
    loaded from) merged or released -- read from the program's desc
    (:mod:`memopt.paddle.legacy.merge_record`); empty if none."""
    from . import merge_record

    return {name: entry[0] for name, entry in merge_record.record_of(program).items()}


def check_fetch(program, fetch_list) -> None:
    """Raise :class:`MergedVariableError` if ``fetch_list`` asks for a
    variable memory_optimize merged away or release_memory released (see
    :func:`memopt.paddle.legacy.merge_record.check_fetch`)."""
    from . import merge_record

    merge_record.check_fetch(program, fetch_list)


def fetch_hook(program, fetch_list):
    """The :mod:`memopt.paddle.guards.fetch` hook: name merged variables."""
    if is_legacy_program(program):
        check_backward_order(program)
        check_fetch(program, fetch_list)
        _check_pir_executor(program)
    return fetch_list


def check_backward_order(program) -> None:
    """UnsupportedProgramError for a program memopt rewrote before its
    backward part was appended (:data:`merge_record.BEFORE_BACKWARD_VAR`),
    which has one now: its gradients were built from merged variables."""
    from .merge_record import BEFORE_BACKWARD_VAR
    from ..pending_backward import legacy_has_backward

    if BEFORE_BACKWARD_VAR in program.global_block().vars and legacy_has_backward(program):
        raise UnsupportedProgramError(
            "memory_optimize / release_memory rewrote this program before its backward part "
            "was appended (optimizer.minimize, append_backward or gradients came after it): "
            "the backward reads variables whose memory the rewrite gave to others and names "
            "gradients after merged variables, so training would be wrong. Build the "
            "program again and call memory_optimize after optimizer.minimize(loss)")


def _check_pir_executor(program) -> None:
    """UnsupportedProgramError, before Paddle fails obscurely, for a program
    memopt rewrote in a way Paddle's translation to PIR
    (``FLAGS_enable_pir_in_executor=1``) cannot run: releases
    (``share_buffer`` becomes a ``pd_op.share_data_`` whose result is the
    variable it reads), with the GC on, dims-only substitutions (PIR's
    collector frees the variable before the op reads it), and level 2's
    in-place ``depend`` ops (the translation refuses them)."""
    from .depend import in_place_depends
    from .merge_record import SUBSTITUTED_VAR

    names = program.global_block().vars
    released, substituted = RELEASED_VAR in names, SUBSTITUTED_VAR in names
    depends = bool(in_place_depends(program.desc))
    if not (released or substituted or depends):
        return
    from .. import flags

    runtime = flags.read_flags()
    if not runtime.pir_executor:
        return
    if depends:
        raise UnsupportedProgramError(
            "this program has depend ops whose X is their Out (memopt.memory_optimize's "
            "level=2 puts them in to keep its op order), which Paddle's translation to PIR "
            "(FLAGS_enable_pir_in_executor=1) refuses (it looks for an in-place "
            "pd_op.depend_). Run it with FLAGS_enable_pir_in_executor=0 (the legacy "
            "executor the order was made for), or call memory_optimize with level=1")
    if substituted and runtime.gc:
        raise UnsupportedProgramError(
            "this program was rewritten by memopt.memory_optimize for the legacy executor "
            "and cannot run translated to PIR with the garbage collector on "
            "(FLAGS_enable_pir_in_executor=1, FLAGS_eager_delete_tensor_gb>=0): some grad "
            "ops read one variable for its dims and for its data, which PIR's collector "
            "frees before the op runs. Run it with FLAGS_enable_pir_in_executor=0, or "
            "rebuild it and call memory_optimize with FLAGS_enable_pir_in_executor=1 set")
    if released:
        raise UnsupportedProgramError(
            "this program was rewritten by memopt.release_memory and cannot run translated "
            "to PIR (FLAGS_enable_pir_in_executor=1): the translation makes each release a "
            "pd_op.share_data_ whose result is the variable it reads. Run it with "
            "FLAGS_enable_pir_in_executor=0, or rebuild it and skip release_memory (turn the "
            "garbage collector on: FLAGS_eager_delete_tensor_gb=0)")


def normalize_hook(program, fetch_vars) -> None:
    """The :mod:`memopt.paddle.guards.fetch` normalize hook: a legacy
    ``save_inference_model`` of a merged variable raises
    :class:`MergedVariableError` naming it (Paddle pruned the program to
    nothing and blamed the first feed: "'img' doesn't exist in pruned
    inference program"); and warns when the program's buffers hold
    variables of different shapes (:mod:`memopt.paddle.legacy.deploy`)."""
    if is_legacy_program(program):
        check_fetch(program, fetch_vars)
        from .deploy import warn_on_save

        warn_on_save(program)  # buffers across shapes: the predictor's passes


def known_names(program) -> set:
    """Every variable name declared in any block of ``program``."""
    return {name for block in program.blocks for name in block.vars}


def check_user_names(program, options) -> None:
    """ValueError (program untouched) for ``skip_opt_set`` / ``fetch_list``
    names ``program`` does not declare (:func:`memopt.names.check_known`)."""
    from ...names import check_known

    if not (options.skip_opt_set or options.fetch_list):
        return
    known = known_names(program)
    loss = [n for op in program.global_block().ops
            if op.desc.has_attr("op_role")
            and int(op.desc.attr("op_role")) & (ROLE_LOSS | ROLE_BACKWARD) == ROLE_LOSS
            for n in op.desc.output_arg_names()]
    aliases = {"loss": loss}
    check_known(options.skip_opt_set, known, "skip_opt_set", aliases=aliases)
    check_known(options.fetch_list, known, "fetch_list", aliases=aliases)


def _graph_for(program, options) -> Graph:
    """The program's graph with ``options.fetch_list`` fetched at the end."""
    graph = program_to_graph(program)
    if options.fetch_list:
        graph.fetch_names = tuple(dict.fromkeys((*graph.fetch_names,
                                                 *sorted(options.fetch_list))))
    return graph


def insert_releases(program, after: Mapping[int, Iterable[str]]) -> int:
    """Free temporaries of block 0 right after given ops, all or nothing.

    ``after[i]`` names the variables to release right after block 0's op
    ``i`` (indices of the program as it is).  Each gets a ``share_buffer``
    op from :data:`RELEASED_VAR` (declared in block 0 if missing), with the
    role of op ``i``, in the order given; afterwards it holds no memory.
    Returns the number of ops inserted.  On any error the
    ops already inserted (and the declaration, if made here) are removed
    and the error is re-raised: the program is exactly as it was.
    """
    from paddle.base.framework import Operator

    block = program.global_block()
    block._sync_with_cpp()  # block.ops and the desc in step from here on
    n_ops = len(block.ops)
    for index, names in after.items():
        if not 0 <= index < n_ops:
            raise GraphError(f"release after op {index}, but block 0 has {n_ops} ops")
        for name in names:
            if not block.has_var(name):
                raise GraphError(f"release names {name!r}, which block 0 does not declare")
    created = not block.has_var(RELEASED_VAR)
    # (position, whether block.ops has it yet) per inserted op, for the undo
    inserted: List[List] = []
    try:
        if created:
            block.create_var(name=RELEASED_VAR, shape=[0], dtype="float32",
                             persistable=False)
        null = block.var(RELEASED_VAR)
        template = None
        for index in sorted(after, reverse=True):
            desc = block.ops[index].desc
            role = desc.attr("op_role") if desc.has_attr("op_role") else 0
            # one op per variable: share_buffer with several X entries all
            # uninitialised fails Paddle's kernel-type check (measured)
            for name in reversed(list(after[index])):
                new = block.desc._insert_op(index + 1)
                inserted.append([index + 1, False])
                if template is None:
                    op = Operator(block=block, desc=new, type=RELEASE_OP, inputs={"X": [null]},
                                  outputs={"Out": [block.var(name)], "XOut": [null]},
                                  attrs={"share_dims_and_dtype": [False], "op_role": role})
                    template = new
                else:
                    # a copy of the first with another output: 3x faster than
                    # building each op from scratch (ResNet-50: 0.15 -> 0.05 s)
                    new.copy_from(template)
                    new.set_output("Out", [name])
                    new._set_attr("op_role", role)
                    op = Operator(block, new)
                block.ops.insert(index + 1, op)
                inserted[-1][1] = True
    except BaseException:
        for position, in_ops in reversed(inserted):
            block.desc._remove_op(position, position + 1)
            if in_ops:
                del block.ops[position]
        if created and block.has_var(RELEASED_VAR):
            block._remove_var(RELEASED_VAR)
        raise
    return len(inserted)
