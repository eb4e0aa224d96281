"""PIR programs (``paddle.pir.Program``) as memopt graphs, and their in-place rewrite.

Reading a program
-----------------
:func:`program_to_graph` turns a PIR program into a :class:`memopt.graph.Graph`
without touching it.  Every PIR operation becomes one :class:`~memopt.graph.Op`
at the same place; ``pd_op.if`` and ``pd_op.while`` become control ops whose
regions are sub-blocks (``loop=True`` for a while).  PIR values are SSA and
have no names, so each gets one:

- a parameter (``builtin.parameter``) or a data input (``pd_op.data``) is
  named by the op's ``parameter_name`` / ``name`` attribute;
- any other op result is ``%N``, where ``N`` counts op results in program
  text order, nested regions included -- the numbering ``print(program)``
  shows, so a name can be found in the printed program;
- a block argument (a while loop's carried value inside the body) is
  ``%arg_N``, counted in the same order.

How values flow through the constructs, as the executor runs them:

- ``builtin.combine`` packs tensors into a vector and ``builtin.split`` /
  ``builtin.slice`` unpack one; vectors own no memory, so a read of a vector
  is a read of its elements, and an op that makes a vector that is later
  split writes the elements.
- ``pd_op.if``: the head reads the condition; each branch ends in
  ``cf.yield``, which reads the branch's results; the if's own results are
  written by a synthetic op ``pd_op.if/out`` right after the construct (the
  executor hands the yielded buffers over to them there).  Synthetic ops
  have no PIR op (``PirGraph.ops`` holds None for them) and carry
  ``attrs["synthetic"]``: ``"before"`` or ``"after"`` the op they belong to.
- ``pd_op.while``: a synthetic ``pd_op.while/in`` before the head reads the
  initial values and writes the body's block arguments; the head (a loop op)
  re-reads the condition every iteration; the body's ``cf.yield`` writes the
  block arguments for the next iteration; a synthetic ``pd_op.while/out``
  after the construct reads them and writes the while's results.

Roles: PIR keeps no op role, so it is inferred.  The backward part starts at
the first gradient op (a name ending in ``_grad`` or ``_grad_``), together with
the ops just before it whose results only the backward part uses (the
``full_like`` that seeds the loss gradient); from there, an op that updates a
persistable value in place (``sgd_``, ``adam_``, ``momentum_``...) is an
optimizer op.  Values written by backward ops are gradients.

Values are identified by ``Value.id`` (stable while the program lives).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ..errors import PlanError
from ..graph import DENSE, Block, Graph, Op, Var

log = logging.getLogger(__name__)

__all__ = [
    "PirGraph",
    "program_to_graph",
    "convert",
    "is_pir_program",
    "convert_legacy",
    "executor_inplace",
    "plan_inplace",
    "apply_inplace",
    "value_name",
    "memory_optimize",
    "release_memory",
]

#: PIR op names of the constructs handled specially.
IF_OP, WHILE_OP, YIELD_OP = "pd_op.if", "pd_op.while", "cf.yield"
COMBINE_OP, SPLIT_OP, SLICE_OP = "builtin.combine", "builtin.split", "builtin.slice"
PARAMETER_OP, DATA_OPS = "builtin.parameter", ("pd_op.data", "pd_op.feed")
FETCH_OPS = ("pd_op.fetch", "builtin.shadow_output")
#: Ops that make constants; those right before the first gradient op that
#: only gradient ops read belong to the backward part.
_SEED_OPS = ("pd_op.full", "pd_op.full_like", "pd_op.full_int_array", "pd_op.fill_constant")


def is_pir_program(program: Any) -> bool:
    """Whether ``program`` is a ``paddle.pir.Program`` (without importing Paddle
    when it is plainly something else)."""
    cls = type(program)
    return cls.__name__ == "Program" and "pir" in cls.__module__


def _dtype_name(value) -> str:
    """``paddle.float32`` -> ``"float32"``."""
    return str(value.dtype).rsplit(".", 1)[-1].lower()


def _is_grad_op(name: str) -> bool:
    return name.endswith("_grad") or name.endswith("_grad_")


@dataclass
class PirGraph:
    """A PIR program read as a :class:`Graph`, with the way back to PIR.

    Attributes
    ----------
    graph : the neutral model (names as described in the module docstring).
    ops : ``ops[i]`` is the PIR ``Operation`` at flat position ``i`` (the
        order of :meth:`Graph.walk_ops`), ``None`` for a synthetic op.
    name_of : ``Value.id`` -> name.
    values : name -> the PIR ``Value`` (the first one, for a vector's element).
    defining_op : name -> flat position of the op that writes it first.
    program : the PIR program read (for a legacy program, its translation).
    """

    graph: Graph
    ops: list = field(default_factory=list)
    name_of: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    defining_op: dict = field(default_factory=dict)
    program: Any = None

    def name(self, value) -> str:
        """The name of a PIR ``Value`` of this program (KeyError if foreign)."""
        return self.name_of[value.id]


def _output_names(pir_op) -> list:
    """Names of an operator's result slots ([] for ops without yaml info:
    builtin, cf and control-flow ops, where asking can crash Paddle)."""
    name = pir_op.name()
    if not name.startswith("pd_op.") or name in (IF_OP, WHILE_OP) or pir_op.num_regions():
        return []
    try:
        return list(pir_op.get_output_names())
    except Exception:
        return []


def _einsum_cache(pir_op) -> list:
    """``[(shape, dtype) or None]`` per operand: the memory ``pd_op.einsum``
    keeps in its ``inner_cache`` output for the backward pass.

    Paddle's einsum kernel transposes each operand into the layout of a
    batched matmul -- batch labels (in both operands and the output, in
    output order), then the operand's own kept labels, then the contracted
    labels (for the second operand: contracted labels before its own) -- and
    caches a transposed copy of every operand it had to transpose (None: not
    transposed, nothing cached).  PIR types the cache as empty tensors.
    """
    equation = str(pir_op.attrs().get("equation", ""))
    lhs, _, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    inputs = _combine_inputs(pir_op.operand_source(0))
    if len(terms) != 2 or len(inputs) != 2 or "." in equation:
        return [None] * len(inputs)
    a, b = terms
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    expected = ("".join(batch + [c for c in a if c not in b] + contracted),
                "".join(batch + contracted + [c for c in b if c not in a]))
    return [None if term == want else (tuple(int(d) for d in value.shape), _dtype_name(value))
            for term, want, value in zip(terms, expected, inputs)]


def _combine_inputs(vector) -> list:
    """The tensors packed into ``vector`` by a ``builtin.combine``."""
    op = vector.get_defining_op()
    if op is None or op.name() != COMBINE_OP:
        return []
    return list(op.operands_source())


class _Converter:
    """One walk over a PIR program, building a :class:`PirGraph`."""

    def __init__(self, program, fetch_list: Iterable = (),
                 value_names: Optional[dict] = None) -> None:
        self.program = program
        self.value_names = value_names or {}
        self.graph = Graph()
        self.result = PirGraph(self.graph)
        self.next_result = 0
        self.next_arg = 0
        self.printed: dict = {}  # value id -> "%N" / "%arg_N"
        self.vector_elems: dict = {}  # vector value id -> element names
        self.fetch_ids = {v.id for v in fetch_list if hasattr(v, "id")}
        self.fetch_names = [v for v in fetch_list if isinstance(v, str)]
        self.block_ops: list = []  # (graph block idx, Op) in walk order

    # -- names and variables ------------------------------------------------
    def _declare(self, value, name: str, block: Block, shape_only: bool = False,
                 **flags) -> str:
        """Declare ``value`` as variable ``name`` of ``block``.  A
        ``shape_only`` value (an op's ``xshape`` output) never holds data:
        its kind is ``"shape"`` and it costs no memory."""
        if name in self.result.values:  # a duplicate attribute name
            k = 1
            while f"{name}#{k}" in self.result.values:
                k += 1
            name = f"{name}#{k}"
        self.result.name_of[value.id] = name
        self.result.values[name] = value
        if value.is_dense_tensor_type() or value.is_selected_row_type():
            kind = DENSE if value.is_dense_tensor_type() else "selected_rows"
            shape, dtype = tuple(int(d) for d in value.shape), _dtype_name(value)
        elif value.is_dense_tensor_array_type():
            kind, shape, dtype = "tensor_array", (), "float32"
        else:
            kind, shape, dtype = "other", (), "float32"
        if shape_only:
            kind = "shape"
        try:
            persistable = bool(value.persistable)
        except Exception:  # pragma: no cover - values without the attribute
            persistable = False
        block.add_var(Var(name, shape=shape, dtype=dtype, kind=kind,
                          persistable=persistable,
                          is_fetch=value.id in self.fetch_ids, **flags))
        return name

    def _number(self, pir_block) -> None:
        """Give every op result its ``%N`` and every block argument its
        ``%arg_N``, in the order ``print(program)`` uses."""
        for op in pir_block.ops:
            for value in op.results():
                self.printed[value.id] = f"%{self.next_result}"
                self.next_result += 1
            for sub in op.blocks():
                for arg in sub.args():
                    self.printed[arg.id] = f"%arg_{self.next_arg}"
                    self.next_arg += 1
                self._number(sub)

    def _result_name(self, op, value) -> str:
        """The name of ``value``, a result of ``op``, by the rules above."""
        if value.id in self.value_names:
            return self.value_names[value.id]
        op_name = op.name()
        if op_name == PARAMETER_OP:
            return str(op.attrs().get("parameter_name"))
        if op_name in DATA_OPS:
            attrs = op.attrs()
            return str(attrs.get("name") or self.printed[value.id])
        return self.printed[value.id]

    def _reads(self, values) -> list:
        """Names read when ``values`` are operands (vectors expanded)."""
        out = []
        for v in values:
            if not v.initialized():
                continue
            elems = self.vector_elems.get(v.id)
            if elems is not None:
                out.extend(elems)
            elif v.id in self.result.name_of:
                out.append(self.result.name_of[v.id])
            else:  # a value defined nowhere we walked (should not happen)
                log.debug("operand %s of an op has no name; ignored", v.id)
        return out

    # -- walking ------------------------------------------------------------
    def run(self) -> PirGraph:
        self._number(self.program.global_block())
        self._split_consumers = self._find_split_consumers(self.program.global_block())
        self._walk_block(self.program.global_block(), self.graph.global_block)
        self.graph.fetch_names = tuple(dict.fromkeys(
            [name for name, v in self.result.values.items() if v.id in self.fetch_ids]
            + [n for n in self.fetch_names if n in self.result.values]))
        self._assign_roles()
        return self.result

    def _find_split_consumers(self, block) -> dict:
        """vector value id -> the ``builtin.split`` op unpacking it (whole program)."""
        found = {}
        for op in block.ops:
            if op.name() == SPLIT_OP:
                found[op.operand_source(0).id] = op
            for sub in op.blocks():
                found.update(self._find_split_consumers(sub))
        return found

    def _add(self, block: Block, pir_op, op: Op) -> Op:
        block.add_op(op)
        self.block_ops.append((block.idx, op, pir_op))
        return op

    def _walk_block(self, pir_block, block: Block) -> None:
        for pir_op in pir_block.ops:
            name = pir_op.name()
            if name == IF_OP:
                self._walk_if(pir_op, block)
            elif name == WHILE_OP:
                self._walk_while(pir_op, block)
            else:
                self._walk_plain(pir_op, block)

    def _name_results(self, pir_op, block: Block, **flags) -> list:
        """Declare (or alias) every result of ``pir_op``; return written names."""
        written = []
        op_name = pir_op.name()
        slots = _output_names(pir_op)
        for slot, value in enumerate(pir_op.results()):
            if not value.initialized():
                continue
            shape_only = slot < len(slots) and slots[slot].lower() == "xshape"
            if op_name in (SPLIT_OP, SLICE_OP):
                continue  # elements were named where the vector was made
            if not (value.is_dense_tensor_type() or value.is_selected_row_type()
                    or value.is_dense_tensor_array_type()):
                # A vector: name its elements now, from the split that unpacks it.
                split = self._split_consumers.get(value.id)
                if split is not None:
                    elems = []
                    for elem in split.results():
                        elems.append(self._declare(elem, self.printed[elem.id], block,
                                                   shape_only=shape_only))
                    if op_name == "pd_op.einsum" and slot < len(slots) \
                            and slots[slot] == "inner_cache":
                        for nm, cached in zip(elems, _einsum_cache(pir_op)):
                            var = block.vars[nm]
                            var.kind = DENSE if cached else "shape"
                            var.shape, var.dtype = cached or ((), var.dtype)
                    self.vector_elems[value.id] = elems
                    written.extend(elems)
                    continue
                if op_name == COMBINE_OP:
                    self.vector_elems[value.id] = self._reads(pir_op.operands_source())
                    continue
            extra = dict(flags)
            if op_name in DATA_OPS:
                extra.update(is_data=True, is_feed=True)
            written.append(self._declare(value, self._result_name(pir_op, value), block,
                                         shape_only=shape_only, **extra))
        if op_name in (SPLIT_OP, SLICE_OP):
            self._alias_unpacked(pir_op)
        return written

    def _alias_unpacked(self, pir_op) -> None:
        """Give a split/slice's results the names of the vector's elements."""
        vec = pir_op.operand_source(0)
        elems = self.vector_elems.get(vec.id)
        if elems is None:
            return
        results = pir_op.results()
        if pir_op.name() == SLICE_OP:
            index = int(pir_op.attrs().get("index", 0))
            pairs = [(results[0], elems[index])] if index < len(elems) else []
        else:
            pairs = list(zip(results, elems))
        for value, nm in pairs:
            if value.id not in self.result.name_of:
                self.result.name_of[value.id] = nm

    def _walk_plain(self, pir_op, block: Block) -> None:
        name = pir_op.name()
        reads = self._reads(pir_op.operands_source())
        position = len(self.block_ops)
        writes = self._name_results(pir_op, block)
        if name in FETCH_OPS:
            for nm in reads:
                self.graph.var(nm, block.idx).is_fetch = True
        if name in (COMBINE_OP, SPLIT_OP, SLICE_OP):
            reads = []  # no memory moves: readers of the vector read the elements
        for nm in writes:
            self.result.defining_op.setdefault(nm, position)
        attrs = {"pir_id": pir_op.id()}
        overwritten = self._overwritten(pir_op)
        if overwritten:
            attrs["overwrites"] = overwritten
        shape_only = self._no_need_buffer(pir_op)
        if shape_only:
            attrs["no_need_buffer"] = tuple(shape_only)
        self._add(block, pir_op, Op(name, reads=tuple(reads), writes=tuple(writes),
                                    attrs=attrs))

    def _overwritten(self, pir_op) -> tuple:
        """``((input name, output name), ...)`` for an op that writes results
        over operands (``sgd_``, ``batch_norm_``, ``relu_``)."""
        if not pir_op.name().endswith("_"):
            return ()
        from paddle.base import core

        pairs = []
        for out_slot, in_slot in sorted(core.pir.get_op_inplace_info(pir_op).items()):
            vin, vout = pir_op.operand_source(in_slot), pir_op.result(out_slot)
            if vin.initialized() and vout.initialized() \
                    and vin.id in self.result.name_of and vout.id in self.result.name_of:
                pairs.append((self.result.name_of[vin.id], self.result.name_of[vout.id]))
        return tuple(pairs)

    def _no_need_buffer(self, pir_op) -> list:
        """Operands whose data the op never reads, only their shape (the
        executor does not keep them alive for it)."""
        out = []
        for v in pir_op.operands_source():
            if not v.initialized():
                continue
            try:
                if pir_op.is_no_need_buffer(v):
                    out.extend(self._reads([v]))
            except Exception:  # ops without yaml info
                return []
        # a name also read as a real operand is needed after all
        return [nm for nm in dict.fromkeys(out)
                if sum(1 for v in pir_op.operands_source() if v.initialized()
                       and nm in self._reads([v]) and not pir_op.is_no_need_buffer(v)) == 0]

    def _walk_if(self, pir_op, block: Block) -> None:
        cond = self._reads(pir_op.operands_source())
        head = self._add(block, pir_op, Op(IF_OP, reads=tuple(cond),
                                           attrs={"pir_id": pir_op.id()}))
        subs = []
        for region_block in pir_op.blocks():
            sub = self.graph.new_block(block.idx)
            subs.append(sub.idx)
            self._walk_block(region_block, sub)
        head.sub_blocks = tuple(subs)
        position = len(self.block_ops)
        writes = self._name_results(pir_op, block)
        for nm in writes:
            self.result.defining_op.setdefault(nm, position)
        self._add(block, None, Op(IF_OP + "/out", writes=tuple(writes),
                                  attrs={"synthetic": "after"}))

    def _walk_while(self, pir_op, block: Block) -> None:
        operands = list(pir_op.operands_source())
        cond, inits = operands[:1], operands[1:]
        (body,) = list(pir_op.blocks())
        args = [self._declare(arg, self.printed[arg.id], block) for arg in body.args()]
        position = len(self.block_ops)
        for nm in args:
            self.result.defining_op.setdefault(nm, position)
        self._add(block, None, Op(WHILE_OP + "/in", reads=tuple(self._reads(inits)),
                                  writes=tuple(args), attrs={"synthetic": "before"}))
        head = self._add(block, pir_op, Op(WHILE_OP, reads=tuple(self._reads(cond)),
                                           writes=tuple(args), loop=True,
                                           attrs={"pir_id": pir_op.id()}))
        sub = self.graph.new_block(block.idx)
        head.sub_blocks = (sub.idx,)
        self._walk_block(body, sub)
        # The body's yield writes the carried values for the next iteration.
        body_ops = self.graph.blocks[sub.idx].ops
        if body_ops and body_ops[-1].type == YIELD_OP:
            body_ops[-1].writes = tuple(args)
        position = len(self.block_ops)
        writes = self._name_results(pir_op, block)
        for nm in writes:
            self.result.defining_op.setdefault(nm, position)
        self._add(block, None, Op(WHILE_OP + "/out", reads=tuple(args), writes=tuple(writes),
                                  attrs={"synthetic": "after"}))

    # -- roles ----------------------------------------------------------------
    def _assign_roles(self) -> None:
        """Infer forward / backward / optimize roles (see the module docstring).

        Only the global block decides; ops in sub-blocks take their owner's role.
        """
        order = self.block_ops
        result = self.result
        result.ops = [pir_op for _, _, pir_op in order]
        top = [i for i, (b, _, _) in enumerate(order) if b == 0]
        first_grad = next((i for i in top if _is_grad_op(order[i][1].type)), None)
        roles = ["forward"] * len(order)
        if first_grad is not None:
            backward_start = self._backward_start(top, first_grad)
            for i in range(backward_start, len(order)):
                roles[i] = "backward"
            for i in top:
                if i >= backward_start and self._is_optimizer_op(order[i][1]):
                    roles[i] = "optimize"
            # sub-block ops inherit the role of the top-level op before them
            current = "forward"
            for i, (b, _, _) in enumerate(order):
                if b == 0:
                    current = roles[i]
                else:
                    roles[i] = current
        for (_, op, _), role in zip(order, roles):
            op.role = role

    def _backward_start(self, top: list, first_grad: int) -> int:
        """The first grad op, moved back over the constants right before it
        that only the backward part reads (the loss gradient's seed:
        ``full`` + ``full_like``)."""
        order = self.block_ops
        readers: dict = {}
        for i, (_, op, _) in enumerate(order):
            for nm in op.reads:
                readers.setdefault(nm, []).append(i)
        start = first_grad
        k = top.index(first_grad)
        while k > 0:
            i = top[k - 1]
            op = order[i][1]
            if op.type not in _SEED_OPS or not op.writes:
                break
            users = [u for nm in op.writes for u in readers.get(nm, [])]
            if not users or min(users) < start:
                break
            start = i
            k -= 1
        return start

    def _is_optimizer_op(self, op: Op) -> bool:
        """An in-place update (``name_``) of a persistable value."""
        if not op.type.endswith("_") or _is_grad_op(op.type):
            return False
        return any(getattr(self.graph.find_var(nm), "persistable", False) for nm in op.reads)


def convert(program, fetch_list: Iterable = (), value_names: Optional[dict] = None) -> PirGraph:
    """Read a PIR program into a :class:`PirGraph` (the program is not changed).

    Parameters
    ----------
    program : a ``paddle.pir.Program``.
    fetch_list : Values (or names) the caller will fetch; they are live at the
        exit and marked ``is_fetch``.  Operands of ``pd_op.fetch`` /
        ``builtin.shadow_output`` ops already in the program are fetched too.
    value_names : ``Value.id`` -> name, overriding the generated names.
    """
    if not is_pir_program(program):
        from ..errors import UnsupportedProgramError
        raise UnsupportedProgramError(
            f"expected a paddle.pir.Program, got {type(program).__name__}; "
            "build the program in Paddle's static mode with PIR on (the default)")
    result = _Converter(program, list(fetch_list), value_names).run()
    result.program = program
    fetched = [nm for _, var in result.graph.all_vars() if var.is_fetch
               for nm in [var.name]]
    result.graph.fetch_names = tuple(dict.fromkeys((*result.graph.fetch_names, *fetched)))
    return result


def convert_legacy(program, fetch_list: Iterable = ()) -> PirGraph:
    """Read a legacy program the way Paddle 3 runs it: translated to PIR.

    Paddle 3's executor translates a legacy ``Program`` to PIR before it runs
    it (``FLAGS_enable_pir_in_executor``, on by default) and so applies PIR's
    in-place pass and garbage collection to it.  This translates it the same
    way and names every value after the legacy variable it came from (a
    variable written again, as an in-place update of a parameter, gives
    ``name#1``, ``name#2``...).  ``fetch_list`` holds legacy Variables or
    names; the last value of each is fetched.
    """
    import paddle

    translated, by_name = paddle.pir.translate_to_pir_with_param_map(program.desc)
    value_names: dict = {}
    last_value: dict = {}
    for name in sorted(by_name):
        for k, value in enumerate(by_name[name]):
            if value.initialized() and value.id not in value_names:
                value_names[value.id] = name if k == 0 else f"{name}#{k}"
                last_value[name] = value
    fetch_values = []
    for item in fetch_list:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if name in last_value:
            fetch_values.append(last_value[name])
    return convert(translated, fetch_values, value_names)


def program_to_graph(program, fetch_list: Iterable = ()) -> Graph:
    """The :class:`Graph` of a PIR program (read-only; see the module docstring).

    Example
    -------
    >>> graph = program_to_graph(main_program)        # doctest: +SKIP
    >>> [op.type for op in graph.global_block.ops][:3]  # doctest: +SKIP
    ['builtin.parameter', 'pd_op.data', 'pd_op.matmul']
    """
    return convert(program, fetch_list).graph


# -- in-place variants -------------------------------------------------------

#: name -> {result slot: operand slot} of in-place variants, probed once per op name.
_INPLACE_MAPS: dict = {}

#: Ops whose result may differ in shape from the input they overwrite.
_RESHAPE_LIKE = ("pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze")
#: Ops for which the executor's pass compares element counts loosely.
_RELAXED_NUMEL = ("pd_op.reshape_grad", "pd_op.add_grad")
#: Ops the executor's pass never makes in-place on CPU (their CPU kernels
#: cannot write over an input, see Paddle's inplace_pass.cc).
_CPU_NO_INPLACE = ("pd_op.add_grad", "pd_op.subtract_grad")
#: Ops with a registered ``name_`` that is not an in-place version of them.
_NOT_INPLACE_VARIANT = ("pd_op.transpose",)


def _ops_module():
    from paddle.base import core

    return core.pir.ops


def has_inplace_variant(op_name: str) -> bool:
    """Whether Paddle registers ``op_name + "_"`` (e.g. ``pd_op.relu_``)."""
    dialect, _, short = op_name.partition(".")
    return (dialect == "pd_op" and not short.endswith("_")
            and op_name not in _NOT_INPLACE_VARIANT
            and hasattr(_ops_module(), short + "_"))


def is_inplace_op(pir_op) -> bool:
    """Whether ``pir_op`` already writes over one of its operands (``sgd_``,
    ``batch_norm_``, an op a previous rewrite made in-place)."""
    from paddle.base import core

    return pir_op.name().endswith("_") and bool(core.pir.get_op_inplace_info(pir_op))


def _build_inplace(pir_op):
    """Insert ``pir_op``'s in-place variant right before it, with the same
    operands and attributes; return the new operation."""
    import paddle

    short = pir_op.name().partition(".")[2]
    attrs = pir_op.attrs()
    args = [pir_op.operand_source(i) for i in range(pir_op.num_operands())]
    args += [attrs[a] for a in pir_op.get_attr_names()]
    paddle.pir.set_insertion_point(pir_op)
    try:
        out = getattr(_ops_module(), short + "_")(*args)
    finally:
        paddle.pir.reset_insertion_point_to_end()
    first = out[0] if isinstance(out, (list, tuple)) else out
    return first.get_defining_op()


def inplace_map(pir_op, program=None) -> dict:
    """``{result slot: operand slot}`` of the in-place variant of ``pir_op``'s
    type ({} when there is none or it cannot be built).

    An op that is already in-place answers its own map.  Otherwise the
    variant is built once per op name in a throwaway clone of ``program``
    (the op's own program when None) and its map is cached.
    """
    from paddle.base import core

    if is_inplace_op(pir_op):
        return dict(core.pir.get_op_inplace_info(pir_op))
    name = pir_op.name()
    if name in _INPLACE_MAPS:
        return _INPLACE_MAPS[name]
    if not has_inplace_variant(name):
        _INPLACE_MAPS[name] = {}
        return {}
    try:
        program = program or _program_of(pir_op)
        index = _flat_index(program, pir_op)
        scratch = program.clone()
        target = _walk(scratch.global_block())[index] if index is not None else None
        if target is None or target.name() != name:
            return {}  # not found: try again with another op, do not cache
        found = dict(core.pir.get_op_inplace_info(_build_inplace(target)))
        found = {k: v for k, v in found.items()
                 if v < pir_op.num_operands() and k < pir_op.num_results()}
    except Exception as exc:  # a variant whose builder needs other arguments
        log.debug("no usable in-place variant for %s: %s", name, exc)
        found = {}
    _INPLACE_MAPS[name] = found
    return found


def _walk(block) -> list:
    """Every op of ``block`` and its regions, in program text order."""
    out = []
    for op in block.ops:
        out.append(op)
        for sub in op.blocks():
            out.extend(_walk(sub))
    return out


def _program_of(pir_op):
    block = pir_op.get_parent_block()
    while not (block.parent_op is None or block.parent_op.name() == "builtin.module"):
        block = block.parent_op.get_parent_block()
    return block.program


def _flat_index(program, pir_op) -> Optional[int]:
    target = pir_op.id()
    for k, op in enumerate(_walk(program.global_block())):
        if op.id() == target:
            return k
    return None


def is_top_level(pir_op) -> bool:
    """Whether ``pir_op`` sits in its program's global block (not in a region)."""
    parent = pir_op.get_parent_block().parent_op
    return parent is None or parent.name() == "builtin.module"


def _ids(values) -> set:
    """``Value.id`` of the non-null values among ``values``."""
    return {v.id for v in values if v.initialized()}


def _deletable(value) -> bool:
    """What Paddle's pass may free early: a non-persistable dense tensor
    (or selected rows)."""
    if value is None or not value.initialized():
        return False
    if not (value.is_dense_tensor_type() or value.is_selected_row_type()):
        return False
    try:
        return not value.persistable
    except Exception:  # pragma: no cover
        return True


def _numel_fits(value_in, value_out, relaxed: bool) -> bool:
    """The element-count test of Paddle's in-place pass (``-1`` allowed in
    dimension 0 of a tensor of rank 2 or more only, unless relaxed)."""
    def count(shape):
        total = 1
        for k, dim in enumerate(shape):
            if not relaxed and dim == -1 and (len(shape) == 1 or k != 0):
                return None
            total *= dim
        return total

    a, b = count(list(value_in.shape)), count(list(value_out.shape))
    return a is not None and b is not None and a == b


def executor_inplace(pg: "PirGraph", fetch_list=(), device: str = "cpu",
                     blacklist: Iterable[str] = ()) -> list:
    """The ops Paddle's executor turns in-place when it runs the program.

    Paddle 3's PIR executor (``FLAGS_pir_apply_inplace_pass``, on by default)
    rewrites ops of the program's top-level block to their in-place variants
    where the input dies at the op; this predicts its choices by its rules
    (Paddle's ``inplace_pass.cc``): the variant must be registered, the input
    must be a deletable dense tensor whose last use in the block is this op,
    not fed, fetched, persistable, used inside a control-flow region or
    already reused; dtypes and element counts must match.  Ops inside
    ``if``/``while`` regions are never rewritten by the executor.

    Returns ``[(position, input name, output name)]`` in program order, the
    position being the op's flat position in ``pg.graph``.
    """
    from paddle.base import core

    program_block = None
    top = [(i, op) for i, op in enumerate(pg.ops) if op is not None and is_top_level(op)]
    if not top:
        return []
    program_block = top[0][1].get_parent_block()
    fetch_ids = {v.id for v in fetch_list if hasattr(v, "id")}
    fetch_ids |= {pg.values[n].id for n in pg.graph.fetch_names if n in pg.values}
    skip = set(fetch_ids)
    for _, op in top:
        name = op.name()
        if name in DATA_OPS or name == "pd_op.shadow_feed":
            skip.add(op.result(0).id)
        elif name in FETCH_OPS:
            skip.add(op.operand_source(0).id)
    last_op: dict = {}

    def scan(block) -> None:
        for op in block.ops:
            for v in op.operands_source():
                if v.initialized() and v.id not in skip and _deletable(v):
                    last_op[v.id] = op.id()
            for v in op.results():
                if _deletable(v):
                    last_op[v.id] = op.id()
            for sub in op.blocks():
                scan(sub)

    scan(program_block)
    dies_at: dict = {}
    for vid, oid in last_op.items():
        dies_at.setdefault(oid, set()).add(vid)
    external = _ids(core.pir.get_used_external_value(program_block))
    for _, op in top:
        if op.num_regions():
            external |= _ids(core.pir.get_used_external_value(op))
    blacklist = set(blacklist)
    visited: set = set()
    reused_in: set = set()
    reused_out: set = set()
    chosen = []
    for position, op in top:
        name = op.name()
        operands = list(op.operands_source())
        results = list(op.results())
        visited |= _ids(operands)
        result_ids = _ids(results)
        if not name.startswith("pd_op.") or op.num_regions():
            visited |= result_ids
            continue
        if device == "cpu" and name in _CPU_NO_INPLACE:
            visited |= result_ids
            continue
        if is_inplace_op(op):
            reused_in |= _ids(operands)
            reused_out |= result_ids
            visited |= result_ids
            continue
        dying = dies_at.get(op.id())
        if name in blacklist or not dying or not has_inplace_variant(name):
            visited |= result_ids
            continue
        pairs = inplace_map(op, program_block.program).items()
        ok = bool(pairs)
        for out_slot, in_slot in pairs:
            vin, vout = operands[in_slot], results[out_slot]
            if not _inplace_allowed(name, vin, vout, dying) or vout.id in visited \
                    or not _deletable(vout) or vin.id in reused_in \
                    or vout.id in reused_out or vin.id in external or vout.id in external:
                ok = False
                break
        if ok:
            for out_slot, in_slot in pairs:
                vin, vout = operands[in_slot], results[out_slot]
                reused_in.add(vin.id)
                reused_out.add(vout.id)
                if vin.id in pg.name_of and vout.id in pg.name_of:
                    chosen.append((position, pg.name_of[vin.id], pg.name_of[vout.id]))
        visited |= result_ids
    return chosen


def _inplace_allowed(op_name: str, vin, vout, dying: set) -> bool:
    """``CanDoInplace`` of Paddle's pass: may ``vout`` be written over ``vin``?"""
    if not vin.initialized() or not vout.initialized():
        return False
    if vin.is_dense_tensor_type() and vout.is_dense_tensor_type():
        if vin.dtype != vout.dtype:
            return False
        if op_name in _RESHAPE_LIKE and vin.id in dying:
            return True
        if not _numel_fits(vin, vout, op_name in _RELAXED_NUMEL):
            return False
    elif str(vin.type()) != str(vout.type()):
        return False
    return vin.id in dying


# -- memory_optimize on PIR ----------------------------------------------------

#: Ops whose result may be a view of an operand: never overwrite such a result
#: in place (the viewed tensor may still be live).
_VIEW_OPS = frozenset({
    "pd_op.split", "pd_op.split_with_num", "pd_op.slice", "pd_op.strided_slice",
    "pd_op.transpose", "pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze",
    "pd_op.flatten", "pd_op.view_dtype", "pd_op.view_shape", "pd_op.as_strided",
    "pd_op.unbind", "pd_op.diagonal", "pd_op.expand", "pd_op.share_data",
    "pd_op.assign", "builtin.split", "builtin.slice", "pd_op.while", "pd_op.if"})

#: memory_optimize's reasons for leaving an op as it is (Report.not_merged).
R_GRAD = "gradient (skip_grads=True)"
R_PROTECTED = "input or output protected (persistable, fed, fetched, skip_opt_set)"
R_ALIVE = "input still used later"
R_SHAPE = "input and output differ in shape or dtype"
R_OUTSIDE = "input from outside the op's block, carried by a loop, or a view"
R_KERNEL = "CPU kernel cannot run in place"

#: program -> {"replaced": {old value id: new Value}, "overwritten": {value id: name}}
_REWRITES: dict = {}


@dataclass
class InplaceRewrite:
    """One op to turn into its in-place variant (pure data, before the rewrite).

    ``position`` is the op's flat position in the :class:`PirGraph`; ``pairs``
    the ``(input name, output name)`` the variant writes over.
    """

    position: int
    op_name: str
    pairs: tuple
    block: int = 0


def value_name(value) -> str:
    """The name :func:`program_to_graph` gives ``value`` (a parameter's or
    data's name, ``%N`` otherwise), found from the value's own program."""
    op = value.get_defining_op()
    if op is not None and op.name() == PARAMETER_OP:
        return str(op.attrs().get("parameter_name"))
    if op is not None and op.name() in DATA_OPS:
        name = op.attrs().get("name")
        if name:
            return str(name)
    block = op.get_parent_block() if op is not None else None
    while block is not None and block.parent_op is not None \
            and block.parent_op.name() != "builtin.module":
        block = block.parent_op.get_parent_block()
    if block is None:
        raise ValueError("the Value belongs to no program")
    converter = _Converter(block.program)
    converter._number(block.program.global_block())
    try:
        return converter.printed[value.id]
    except KeyError:
        raise ValueError("the Value belongs to no program") from None


def plan_inplace(pg: PirGraph, options, device: str = "cpu") -> tuple:
    """Which ops of ``pg`` may soundly run in place (pure data; nothing changes).

    An op qualifies when Paddle registers its in-place variant and, for each
    (input, output) pair of that variant: the input dies at the op (no later
    read anywhere, loops included), is defined in the op's own block by an op
    that cannot return a view, and is not persistable, fed, fetched, in
    ``skip_opt_set`` or a loop-carried value; the output is not fetched or in
    ``skip_opt_set``; the input is read by no other operand of the op; both
    have the same dtype and, at level 0, the same shape (level 1: the same
    size in bytes for every batch size).  With ``skip_grads``, backward and
    optimizer ops are left alone.

    Returns ``(rewrites, reasons)``: the :class:`InplaceRewrite` list in
    program order and ``{reason: ops left alone for it}``.
    """
    from ..liveness import analyze_graph

    graph = pg.graph
    positions = list(graph.walk_ops())
    live = analyze_graph(graph)
    skip = set(options.skip_opt_set)
    var_block: dict = {}
    for block_idx, var in graph.all_vars():
        var_block.setdefault(var.name, block_idx)
    owners = {sub: pos for pos, (_, op) in enumerate(positions) for sub in op.sub_blocks}
    overwritten_persistable = set()
    for _, op in positions:
        for src, dst in op.attrs.get("overwrites", ()) if op.attrs else ():
            overwritten_persistable.add(dst)
    rewrites, reasons = [], {}

    def refuse(reason: str) -> None:
        reasons[reason] = reasons.get(reason, 0) + 1

    for pos, (block_idx, op) in enumerate(positions):
        pir_op = pg.ops[pos]
        if pir_op is None or not has_inplace_variant(op.type) or is_inplace_op(pir_op):
            continue
        if device == "cpu" and op.type in _CPU_NO_INPLACE:
            refuse(R_KERNEL)
            continue
        if options.skip_grads and op.role in ("backward", "optimize"):
            refuse(R_GRAD)
            continue
        pairs_slots = inplace_map(pir_op, pg.program).items()
        if not pairs_slots:
            continue
        operands = list(pir_op.operands_source())
        results = list(pir_op.results())
        pairs, reason = [], None
        for out_slot, in_slot in sorted(pairs_slots):
            vin, vout = operands[in_slot], results[out_slot]
            if not (vin.initialized() and vout.initialized()) \
                    or vin.id not in pg.name_of or vout.id not in pg.name_of:
                reason = R_SHAPE
                break
            nin, nout = pg.name_of[vin.id], pg.name_of[vout.id]
            var_in, var_out = graph.find_var(nin, block_idx), graph.find_var(nout, block_idx)
            if var_in is None or var_out is None or not var_in.is_dense or not var_out.is_dense:
                reason = R_SHAPE
                break
            if (var_in.persistable or var_in.is_data or var_in.is_feed or var_in.is_fetch
                    or var_out.persistable or var_out.is_fetch or nin in skip or nout in skip
                    or nin in overwritten_persistable or nin in graph.fetch_names
                    or nout in graph.fetch_names):
                reason = R_PROTECTED
                break
            maker = pg.defining_op.get(nin)
            maker_op = positions[maker][1] if maker is not None else None
            if (var_block.get(nin) != block_idx or maker is None or maker_op.type in _VIEW_OPS
                    or maker_op.attrs.get("synthetic") or nin.startswith("%arg_")):
                reason = R_OUTSIDE
                break
            if sum(1 for v in operands if v.initialized() and v.id == vin.id) != 1:
                reason = R_ALIVE
                break
            if live.liveness.is_live_out(pos, nin) or _read_later_in_loop(
                    graph, positions, owners, block_idx, pos, nin):
                reason = R_ALIVE
                break
            if var_in.dtype != var_out.dtype or (
                    tuple(var_in.shape) != tuple(var_out.shape) if options.level == 0
                    else var_in.size != var_out.size):
                reason = R_SHAPE
                break
            pairs.append((nin, nout))
        if reason:
            refuse(reason)
            continue
        rewrites.append(InplaceRewrite(pos, op.type, tuple(pairs), block_idx))
    return rewrites, reasons


def _read_later_in_loop(graph, positions, owners, block_idx, pos, name) -> bool:
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


def apply_inplace(pg: PirGraph, rewrites) -> dict:
    """Turn each planned op into its in-place variant, all or nothing.

    Every new op is built first, right before its original (which keeps its
    uses); if any build fails, the new ops are erased and the program is as
    it was.  Then each original's uses move to the new op and it is erased.
    Returns ``{old result Value id: new result Value}``.
    """
    built = []
    try:
        for rw in rewrites:
            old = pg.ops[rw.position]
            new = _build_inplace(old)
            if new.name() != old.name() + "_" or new.num_results() != old.num_results() \
                    or [str(r.type()) for r in new.results()] != \
                    [str(r.type()) for r in old.results()]:
                new.erase()
                raise PlanError(f"the in-place variant of {old.name()} does not "
                                "match the op it replaces")
            built.append((old, new))
    except Exception:
        for _, new in built:
            new.erase()
        raise
    replaced = {}
    for old, new in built:
        for a, b in zip(old.results(), new.results()):
            if a.initialized():
                replaced[a.id] = b
        old.replace_all_uses_with(new.results())
        old.erase()
    return replaced


def _record(program, replaced: dict, overwritten: dict) -> None:
    """Remember what the rewrite replaced so fetches stay right (the guard)."""
    key = id(program)
    entry = _REWRITES.setdefault(key, {"program": program, "replaced": {}, "overwritten": {}})
    entry["replaced"].update(replaced)
    entry["overwritten"].update(overwritten)
    install_fetch_guard()


def resolve_fetch_list(program, fetch_list):
    """``fetch_list`` with Values replaced by memory_optimize swapped for their
    replacements; raises :class:`MergedVariableError` for a Value an in-place
    op now overwrites (fetching it would return another value's data)."""
    entry = _REWRITES.get(id(program))
    if not entry or entry["program"] is not program or fetch_list is None:
        return fetch_list
    single = not isinstance(fetch_list, (list, tuple))
    items = [fetch_list] if single else list(fetch_list)
    out = []
    for item in items:
        vid = getattr(item, "id", None) if not isinstance(item, str) else None
        if isinstance(vid, str) and vid in entry["overwritten"]:
            from ..errors import MergedVariableError

            name = entry["overwritten"][vid]
            raise MergedVariableError(
                f"cannot fetch {name}: memopt.memory_optimize made an op write over it "
                "in place, so after the run it holds another value. Rebuild the program "
                f"and pass the Value (or {name!r}) in skip_opt_set to keep it")
        out.append(entry["replaced"].get(vid, item) if isinstance(vid, str) else item)
    return out[0] if single else type(fetch_list)(out)


_GUARD = False


def install_fetch_guard() -> None:
    """Wrap ``Executor.run`` once so fetches of rewritten PIR programs go
    through :func:`resolve_fetch_list`."""
    global _GUARD
    if _GUARD:
        return
    from paddle.base.executor import Executor

    original = Executor.run

    @functools.wraps(original)
    def run(self, program=None, feed=None, fetch_list=None, *args, **kwargs):
        target = program
        if target is None:
            import paddle

            target = paddle.static.default_main_program()
        if _REWRITES and is_pir_program(target):
            fetch_list = resolve_fetch_list(target, fetch_list)
        return original(self, program, feed, fetch_list, *args, **kwargs)

    Executor.run = run
    _GUARD = True


def _runtime_text() -> tuple:
    """``(gc on?, executor in-place on?, text)`` from Paddle's flags."""
    import paddle

    flags = paddle.get_flags(["FLAGS_eager_delete_tensor_gb", "FLAGS_pir_apply_inplace_pass"])
    gc = float(flags["FLAGS_eager_delete_tensor_gb"]) >= 0
    inplace = bool(flags["FLAGS_pir_apply_inplace_pass"])
    text = (f"garbage collection {'on' if gc else 'off'} (FLAGS_eager_delete_tensor_gb="
            f"{float(flags['FLAGS_eager_delete_tensor_gb']):g}), executor in-place pass "
            f"{'on' if inplace else 'off'} (FLAGS_pir_apply_inplace_pass)")
    return gc, inplace, text


def memory_optimize(program, options, batch_size: Optional[int] = None):
    """memory_optimize for a PIR program (see :mod:`memopt.optimize`).

    On PIR, values are SSA and Paddle's executor already frees each one
    after its last use (GC on) and already runs some ops of the top-level
    block in place (``FLAGS_pir_apply_inplace_pass``).  What is left to do
    soundly is to turn ops into their in-place variants wherever the input
    dies at the op (:func:`plan_inplace`): inside ``if``/``while`` regions
    (which the executor's pass never touches), where that pass is off, with
    GC off, and for shapes the pass refuses (a ``-1`` past the first
    dimension).  The Report estimates the peak before and after with
    :mod:`memopt.analysis`, i.e. with what the executor does anyway.

    Replaced ops' result Values are new objects; ``Executor.run`` is wrapped
    so that fetching an old one fetches its replacement, and fetching a
    Value that an in-place op now overwrites raises
    :class:`~memopt.errors.MergedVariableError`.
    """
    import time

    from .. import analysis
    from ..report import REFERENCE_BATCH, Bytes, Holder, Report, Reuse

    start = time.perf_counter()
    batch = batch_size or REFERENCE_BATCH
    gc, executor_inplace_on, runtime = _runtime_text()
    model = analysis.RuntimeModel(gc=gc, inplace=executor_inplace_on)
    pg = convert(program)
    before = analysis.from_graph(
        pg.graph, batch, model, executor_inplace(pg) if executor_inplace_on else [])
    rewrites, reasons = plan_inplace(pg, options)
    reuses, overwritten = [], {}
    for rw in rewrites:
        for nin, nout in rw.pairs:
            var = pg.graph.find_var(nout, rw.block)
            reuses.append(Reuse(var=nout, takes=nin, renamed_to=nin, shape=tuple(var.shape),
                                dtype=var.dtype, size=var.size, block=rw.block,
                                how="in-place", op=f"{rw.op_name} -> {rw.op_name}_"))
            overwritten[pg.values[nin].id] = nin
    replaced = apply_inplace(pg, rewrites) if rewrites else {}
    if rewrites:
        _record(program, replaced, overwritten)
        after_pg = convert(program)
        after = analysis.from_graph(
            after_pg.graph, batch, model,
            executor_inplace(after_pg) if executor_inplace_on else [])
    else:
        after = before
    temps = {var.name: var.size for _, var in pg.graph.all_vars()
             if var.is_dense and not var.persistable}
    shared = {r.var for r in reuses}
    holders = [Holder(h.name, h.bytes(batch), tuple(h.names)) for h in after.held_at()[:5]]
    ours = len(rewrites)
    notes = [f"{len(before.inplace)} ops of the top-level block already run in place "
             "by Paddle's executor (its in-place pass); memopt changed "
             f"{ours} op{'s' if ours != 1 else ''} to in-place variants"]
    report = Report(
        program_type="pir", level=options.level, skip_grads=options.skip_grads, gc=gc,
        runtime=runtime, reuses=reuses,
        temporaries_before=Bytes.total(temps.values()),
        temporaries_after=Bytes.total(s for n, s in temps.items() if n not in shared),
        batch_size=batch, persistable_bytes=before.persistable_bytes(batch),
        peak_before=before.total_peak(batch), peak_after=after.total_peak(batch),
        top_holders=holders,
        release=("Paddle's garbage collector frees each value right after its last use"
                 if gc else "garbage collection is off: values are held until the run "
                 "ends; set FLAGS_eager_delete_tensor_gb=0 to free them after their "
                 "last use"),
        not_merged=reasons, seconds=time.perf_counter() - start, notes=notes)
    log.debug("PIR memory_optimize: %d ops in place in %.3f s", ours, report.seconds)
    return report


def release_memory(program, options):
    """release_memory for a PIR program: nothing to insert (Paddle's garbage
    collector frees each value after its last use); the Report says how
    memory is released and what the analysis estimates.  The program is not
    changed."""
    import time

    from .. import analysis
    from ..report import REFERENCE_BATCH, Bytes, Report

    start = time.perf_counter()
    gc, inplace_on, runtime = _runtime_text()
    pg = convert(program)
    an = analysis.from_graph(pg.graph, REFERENCE_BATCH,
                             analysis.RuntimeModel(gc=gc, inplace=inplace_on),
                             executor_inplace(pg) if inplace_on else [])
    temps = Bytes.total(var.size for _, var in pg.graph.all_vars()
                        if var.is_dense and not var.persistable)
    kept = sorted(set(options.skip_opt_set) & set(pg.values))
    return Report(program_type="pir", gc=gc, runtime=runtime, temporaries_before=temps,
                  temporaries_after=temps, batch_size=REFERENCE_BATCH,
                  persistable_bytes=an.persistable_bytes(), peak_before=an.total_peak(),
                  peak_after=an.total_peak(),
                  release=("Paddle's garbage collector frees each value right after its "
                           "last use; nothing to insert" if gc else
                           "garbage collection is off: set FLAGS_eager_delete_tensor_gb=0 "
                           "to free each value after its last use"),
                  seconds=time.perf_counter() - start,
                  notes=[f"kept by skip_opt_set: {', '.join(kept)}"] if kept else [])
