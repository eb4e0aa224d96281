"""The neutral program model every memopt analysis works on.

A :class:`Graph` is a list of :class:`Block` objects; block 0 is the global
block and every other block is a sub-block run by a control-flow op of its
parent (a ``while`` body, a ``conditional_block`` branch).  A :class:`Block`
holds :class:`Op` objects in program order and the :class:`Var` objects it
declares.  An op names the variables it reads and writes and the sub-blocks it
runs; nothing else about the op matters to memory planning.

Sizes are kept symbolic in the batch dimension: a shape may contain ``-1``
(the batch size ``B``, unknown until run time), and a variable's byte size is
a :class:`Size` ``coefficient * B**power``.  Nothing here ever silently
replaces ``B`` by 1.

The model imports neither Paddle nor TensorFlow: adapters
(:mod:`memopt.paddle.legacy.program`, :mod:`memopt.paddle.pir.program`) build it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple

from .errors import GraphError

#: Bytes per element for the dtype names the adapters produce.
DTYPE_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "float16": 2, "bfloat16": 2, "uint16": 2,
    "int32": 4, "float32": 4, "uint32": 4,
    "int64": 8, "float64": 8, "complex64": 8, "uint64": 8,
    "complex128": 16,
}


@dataclass(frozen=True, order=True)
class Size:
    """A byte count that may grow with the batch size: ``coefficient * B**power``.

    ``power`` is the number of ``-1`` (batch) dimensions in the shape, so a
    fixed-shape tensor has ``power == 0`` and ``coefficient`` equal to its
    bytes.  Two sizes compare only where the comparison holds for every batch
    size ``B >= 1`` (see :meth:`provably_le`).
    """

    coefficient: int
    power: int = 0

    def at(self, batch_size: int) -> int:
        """Bytes for a concrete batch size (``batch_size >= 1``)."""
        return int(self.coefficient * batch_size ** self.power)

    def provably_le(self, other: "Size") -> bool:
        """True when ``self <= other`` for every batch size ``B >= 1``.

        ``c1 * B**k1 <= c2 * B**k2`` for all ``B >= 1`` exactly when
        ``c1 <= c2`` and ``k1 <= k2`` (for positive coefficients); a zero-byte
        size fits anywhere.
        """
        if self.coefficient == 0:
            return True
        return self.coefficient <= other.coefficient and self.power <= other.power

    @property
    def symbolic(self) -> bool:
        return self.power > 0

    def plain(self) -> "int | Size":
        """The size as the interval planners take it: an int when it does not
        grow with the batch, else the Size itself."""
        return self.coefficient if self.power == 0 else self

    def __add__(self, other: "Size") -> "Size":
        if self.power != other.power:
            raise ValueError(
                f"cannot add {self} and {other}: different powers of the batch size"
            )
        return Size(self.coefficient + other.coefficient, self.power)

    def __str__(self) -> str:
        if self.power == 0:
            return f"{self.coefficient} B"
        if self.power == 1:
            return f"{self.coefficient}*batch B"
        return f"{self.coefficient}*batch^{self.power} B"


def as_size(size: "Size | int") -> Size:
    """``size`` as a :class:`Size`: a Size as it is, an int ``n`` as ``Size(n)``
    (a byte count that does not grow with the batch).  The one normaliser:
    everything that takes "an int or a Size" goes through it or
    :func:`size_at`."""
    return size if isinstance(size, Size) else Size(int(size), 0)


def size_at(size: "Size | int", batch_size: Optional[int] = None) -> int:
    """Bytes of ``size`` (an int or a :class:`Size`) at ``batch_size``.

    A symbolic size (``power > 0``) needs a ``batch_size``; a fixed one
    (``power == 0``, or an int) does not.
    """
    size = as_size(size)
    if size.power == 0:
        return size.coefficient
    if batch_size is None:
        raise ValueError(f"size {size} depends on the batch size: pass batch_size")
    return size.at(batch_size)


def size_of(shape: Sequence[int], dtype: str) -> Size:
    """Byte size of a dense tensor of ``shape`` and ``dtype``.

    ``-1`` (or any negative) dimensions are the symbolic batch size.  An
    unknown dtype raises :class:`GraphError` naming it.
    """
    try:
        elem = DTYPE_BYTES[dtype]
    except KeyError:
        raise GraphError(
            f"unknown dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}"
        ) from None
    coefficient, power = elem, 0
    for dim in shape:
        if dim < 0:
            power += 1
        else:
            coefficient *= dim
    return Size(coefficient, power)


#: A later value of a name is ``name#k``: a variable written again, as an
#: adapter reading a legacy program through PIR names it, or a clash of names.
VERSION_MARK = "#"


def versioned(name: str, k: int) -> str:
    """The ``k``-th later value of ``name`` (``k >= 1``)."""
    return f"{name}{VERSION_MARK}{k}"


def unversioned(name: str) -> str:
    """The name a value's name is a version of (itself when not one)."""
    return name.split(VERSION_MARK)[0]


#: The variable a release takes its (never allocated) buffer from: no op
#: writes it, so the released variable is left holding no memory.
RELEASED_VAR = "memopt@released"


#: Var kinds: only dense tensors can share memory; the rest are never merged.
DENSE = "dense"


@dataclass
class Var:
    """A program variable.

    Attributes
    ----------
    name : the variable's name, unique within its block's scope chain.
    shape : dimensions in elements; ``-1`` is the symbolic batch dimension.
    dtype : element type name (a key of :data:`DTYPE_BYTES`).
    kind : ``"dense"`` for a dense tensor; anything else (``"lod_tensor_array"``,
        ``"step_scopes"``, ``"reader"``...) is never given or taken memory.
    persistable : parameters and optimizer state; they outlive every run.
    is_feed / is_fetch / is_data : fed, fetched, or declared as a data input.
    label : how the user knows the variable when ``name`` is not that (a PIR
        value: the ``name=`` given in Python, or the op that makes it and
        where, with ``name`` beside it); empty when the name says it all.
        :attr:`display` is what messages print.
    bound : the most bytes the variable holds when its ``-1`` dims are not
        (all) the batch: a dim the data decides (``masked_select``'s output)
        or a batch folded into another (``reshape`` to ``[-1, k]``); None
        when ``shape`` says it (:mod:`memopt.paddle.dim_extents`).
    """

    name: str
    shape: tuple = ()
    dtype: str = "float32"
    kind: str = DENSE
    persistable: bool = False
    is_feed: bool = False
    is_fetch: bool = False
    is_data: bool = False
    label: str = ""
    bound: Optional[Size] = None

    @property
    def display(self) -> str:
        """The variable as messages name it: :attr:`label`, else the name."""
        return self.label or self.name

    @property
    def size(self) -> Size:
        """Byte size (symbolic in the batch); zero for non-dense kinds."""
        if self.kind != DENSE:
            return Size(0, 0)
        if self.bound is not None:
            return self.bound
        return size_of(self.shape, self.dtype)

    @property
    def is_dense(self) -> bool:
        return self.kind == DENSE

    def __str__(self) -> str:
        """One line: ``x: float32[-1, 784] (3136*batch B) fetch`` -- the
        name (and label), dtype and shape (``kind`` when not dense), bytes,
        then what the variable is (persistable, feed, fetch, data)."""
        name = self.name if not self.label else f"{self.name} ({self.label})"
        dims = ", ".join(str(d) for d in self.shape)
        what = f"{self.dtype}[{dims}]" if self.is_dense else self.kind
        flags = [flag for flag, on in (("persistable", self.persistable), ("feed", self.is_feed),
                                       ("fetch", self.is_fetch), ("data", self.is_data)) if on]
        bound = "at most " if self.bound is not None else ""
        return f"{name}: {what} ({bound}{self.size}){''.join(' ' + f for f in flags)}"


@dataclass(frozen=True)
class InplaceVariant:
    """An in-place variant of an op (PIR's ``pd_op.relu_`` for ``pd_op.relu``):
    the same computation writing outputs over inputs.

    ``pairs`` are the ``(input, output, repeated)`` the variant writes over,
    in its slot order (``repeated``: the op also reads ``input`` through
    another operand; ``None`` for a pair whose values the adapter could not
    name); ``kernel_refuses``: the runtime's kernel for the variant cannot
    run in place on the device planned for.
    """

    pairs: Tuple[Optional[Tuple[str, str, bool]], ...] = ()
    kernel_refuses: bool = False


@dataclass
class OpFacts:
    """What an adapter states about an op beyond its reads and writes: the
    adapter -> core contract.  Every field is a fact about the runtime's
    kernel for this op, established by the adapter (which knows Paddle); the
    core trusts them and checks nothing about Paddle.  Defaults: no fact.

    Attributes
    ----------
    inplace : ``(input, output)``: the kernel may write ``output`` into
        ``input``'s memory (Paddle's declared in-place pair, kept only where
        bit-exact); memory_optimize then lets them share when the input dies
        at this op.
    inplace_alt : a second such pair, tried when ``inplace`` does not apply
        (``elementwise_add``'s ``(Y, Out)`` where X, Y and Out have one shape).
    dims_only : ``{slot: (variable, substitute)}``: the op reads ``variable``
        in ``slot`` for its dims only, and ``substitute`` (another operand of
        the op, same static shape and dtype) can be read instead.
    full_writes : outputs a control-flow op always writes whole after its
        sub-blocks ran, without reading them (``conditional_block_grad``'s
        parent-side gradients).
    sub_outputs : locals of the op's sub-blocks it reads back after they ran
        (a control grad op's inside gradients): never merged.
    aliases : variables whose buffer the kernel may hand to another (an
        einsum's operand its cache may point at, a unary einsum's output):
        never merged.
    overwrites : ``((input, output), ...)``: the op writes ``output`` over
        ``input``'s buffer (an in-place op as it is: ``sgd_``,
        ``batch_norm_``; a stack pop and what was pushed): one buffer.
    no_need_buffer : operands the op reads for their shape only (they keep
        no memory alive for it).
    release : names whose memory the op frees (a release memopt put in).
    loss : the op computes the loss (its outputs are likely fetched).
    synthetic : ``"before"`` / ``"after"``: no op of the program but one the
        adapter put right before / after the op it belongs to (PIR control
        flow's hand-overs); ``""`` for a real op.
    stack_push : variables holding the bytes a ``tuple_push`` saves.
    in_loop : those pushes run once per iteration of an enclosing loop.
    view : the op's result may be a view of an operand (a reshape, a
        slice...): never written over in place.
    variant : the op's :class:`InplaceVariant`, where the runtime has one
        (PIR) and the op is not in place already.
    in_flight : buffers an asynchronous op (a collective or point-to-point
        communication) may still read or write after it returns, until the
        end of the step: never shared, given away, written in place or
        released (:mod:`memopt.paddle.distributed`).
    workspace : bytes the kernel holds while the op runs beyond its outputs
        (scratch memory, symbolic in the batch: ``rnn_grad``'s gate
        gradients); None: none known.
    """

    inplace: Optional[Tuple[str, str]] = None
    inplace_alt: Optional[Tuple[str, str]] = None
    dims_only: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    full_writes: Tuple[str, ...] = ()
    sub_outputs: Tuple[str, ...] = ()
    aliases: Tuple[str, ...] = ()
    overwrites: Tuple[Tuple[str, str], ...] = ()
    no_need_buffer: Tuple[str, ...] = ()
    release: Tuple[str, ...] = ()
    loss: bool = False
    synthetic: str = ""
    stack_push: Tuple[str, ...] = ()
    in_loop: bool = False
    view: bool = False
    variant: Optional[InplaceVariant] = None
    in_flight: Tuple[str, ...] = ()
    workspace: Optional["Size"] = None


@dataclass
class Op:
    """One operation: what it reads, what it writes, which sub-blocks it runs.

    ``reads`` and ``writes`` are variable names in program order (a name may
    appear in both: an in-place op).  ``sub_blocks`` are indices into
    :attr:`Graph.blocks`.  ``role`` is ``"forward"``, ``"backward"``,
    ``"optimize"`` or ``"other"``; ``loop`` says a sub-block is a loop body
    (run zero or more times, values carried from one iteration to the next)
    rather than a branch (run at most once).  ``facts`` are what the adapter
    states about the op's kernel (:class:`OpFacts`); ``attrs`` hold anything
    else (an adapter's own bookkeeping such as ``"index"`` or ``"pir_id"``,
    the reference interpreter's ``"value"``, ``"step"``, ``"cond"``,
    ``"max_trips"``) and mean nothing to the planner.
    """

    type: str
    reads: tuple = ()
    writes: tuple = ()
    sub_blocks: tuple = ()
    role: str = "forward"
    loop: bool = False
    attrs: dict = field(default_factory=dict)
    facts: OpFacts = field(default_factory=OpFacts)

    def __str__(self) -> str:
        """One line as a program reads: ``y, z = matmul(x, w)``, then after
        ``#`` what else is known: the role when not forward, the sub-blocks
        run (``loop``/``branch``), and the facts the adapter stated that
        differ from the defaults (``inplace=('x', 'y')``, ``workspace=...``)."""
        writes = ", ".join(self.writes)
        call = f"{self.type}({', '.join(self.reads)})"
        notes = [] if self.role == "forward" else [self.role]
        if self.sub_blocks:
            kind = "loop" if self.loop else "branch"
            notes.append(f"{kind} blocks {', '.join(str(b) for b in self.sub_blocks)}")
        default = OpFacts()
        notes += [f"{f.name}={getattr(self.facts, f.name)!r}" for f in fields(OpFacts)
                  if getattr(self.facts, f.name) != getattr(default, f.name)]
        line = f"{writes} = {call}" if writes else call
        return line + (f"  # {'; '.join(notes)}" if notes else "")


@dataclass
class Block:
    """A sequence of ops with the variables declared in it.

    ``parent`` is the index of the enclosing block (``-1`` for the global
    block); name lookup walks from a block to its parents.
    """

    idx: int
    parent: int = -1
    ops: list[Op] = field(default_factory=list)
    vars: dict[str, Var] = field(default_factory=dict)

    def add_var(self, var: Var) -> Var:
        self.vars[var.name] = var
        return var

    def add_op(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def __str__(self) -> str:
        """The block as a listing: a header, its variables, then its ops
        numbered in program order."""
        parent = f" (in block {self.parent})" if self.parent >= 0 else ""
        lines = [f"block {self.idx}{parent}: {len(self.ops)} ops, {len(self.vars)} vars"]
        lines += [f"  var {var}" for var in self.vars.values()]
        lines += [f"  {k:>{len(str(len(self.ops)))}}: {op}" for k, op in enumerate(self.ops)]
        return "\n".join(lines)


@dataclass
class Graph:
    """A whole program: blocks, block 0 first.

    Build one by hand (tests), or with an adapter.  ``fetch_names`` are the
    variables the caller reads after the run: they are live at the exit.
    """

    blocks: list[Block] = field(default_factory=list)
    fetch_names: tuple = ()

    def __post_init__(self) -> None:
        if not self.blocks:
            self.blocks.append(Block(0, -1))

    def __str__(self) -> str:
        """The whole program, readable: each block as :meth:`Block.__str__`
        lists it, then what is fetched at the end (what a failing test
        prints, where the dataclass repr would nest every field)."""
        lines = [str(block) for block in self.blocks]
        lines.append(f"fetch: {', '.join(self.fetch_names) if self.fetch_names else '(nothing)'}")
        return "\n".join(lines)

    @property
    def global_block(self) -> Block:
        return self.blocks[0]

    def new_block(self, parent: int) -> Block:
        """Append an empty sub-block whose enclosing block is ``parent``."""
        block = Block(len(self.blocks), parent)
        self.blocks.append(block)
        return block

    def home_of(self, name: str, block_idx: int = 0) -> int:
        """The block declaring the ``name`` that block ``block_idx`` sees:
        that block or the nearest enclosing one declaring it; -1 if none."""
        idx = block_idx
        while idx >= 0 and name not in self.blocks[idx].vars:
            idx = self.blocks[idx].parent
        return idx

    def find_var(self, name: str, block_idx: int = 0) -> Optional[Var]:
        """The variable ``name`` visible from block ``block_idx``, or None."""
        home = self.home_of(name, block_idx)
        return self.blocks[home].vars[name] if home >= 0 else None

    def var(self, name: str, block_idx: int = 0) -> Var:
        """Like :meth:`find_var` but raises :class:`GraphError` if missing."""
        found = self.find_var(name, block_idx)
        if found is None:
            raise GraphError(
                f"variable {name!r} is used in block {block_idx} but declared "
                "in neither it nor an enclosing block"
            )
        return found

    def all_vars(self) -> Iterator[tuple[int, Var]]:
        """Every declared variable with the index of its block, in order."""
        for block in self.blocks:
            for var in block.vars.values():
                yield block.idx, var

    def walk_ops(self, block_idx: int = 0) -> Iterator[tuple[int, Op]]:
        """Ops in execution-text order, sub-block ops right after their owner.

        Yields ``(block index, op)``; this is the linear order in which
        :func:`memopt.liveness.analyze_graph` numbers ops.
        """
        for op in self.blocks[block_idx].ops:
            yield block_idx, op
            for sub in op.sub_blocks:
                yield from self.walk_ops(sub)

    def num_ops(self) -> int:
        return sum(len(b.ops) for b in self.blocks)

    def validate(self) -> None:
        """Raise :class:`GraphError` on a malformed graph.

        Checks block parents and sub-block indices, that each sub-block has
        exactly one owner, and that every name an op uses is declared.
        """
        owners: dict[int, str] = {}
        for block in self.blocks:
            if block.idx != 0 and not (0 <= block.parent < len(self.blocks)):
                raise GraphError(f"block {block.idx} has no valid parent ({block.parent})")
            for op in block.ops:
                for sub in op.sub_blocks:
                    if not (0 < sub < len(self.blocks)) or sub == block.idx:
                        raise GraphError(f"op {op.type!r} in block {block.idx} runs "
                                         f"an invalid sub-block {sub}")
                    if sub in owners:
                        raise GraphError(f"sub-block {sub} is run by both "
                                         f"{owners[sub]!r} and {op.type!r}")
                    owners[sub] = op.type
                for name in (*op.reads, *op.writes):
                    self.var(name, block.idx)


def names(items: Iterable) -> tuple:
    """Deduplicate names keeping their first-seen order."""
    return tuple(dict.fromkeys(items))
