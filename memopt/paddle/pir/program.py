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
  ``facts.synthetic``: ``"before"`` or ``"after"`` the op they belong to.
- ``pd_op.while``: a synthetic ``pd_op.while/in`` before the head reads the
  initial values and writes the body's block arguments; the head (a loop op)
  re-reads the condition every iteration; the body's ``cf.yield`` writes the
  block arguments for the next iteration; a synthetic ``pd_op.while/out``
  after the construct reads them and writes the while's results.
- ``cf.tuple_push`` (a forward region saving values for the backward
  part) moves the pushed tensors into a stack until the matching
  ``cf.tuple_pop``: a synthetic ``cf.tuple_push/stack`` op right after the
  push writes a variable holding their bytes, which the pop reads and its
  results share.  The stack values themselves print as ``%stack_k``,
  ``%inlet_k``, ``%outlet_k`` and are named so.

Roles: PIR keeps no op role, so it is inferred.  The backward part starts at
the first gradient op (a name ending in ``_grad`` or ``_grad_``), together with
the ops just before it whose results only the backward part uses (the
``full_like`` that seeds the loss gradient); from there, an op that updates a
persistable value in place (``sgd_``, ``adam_``, ``momentum_``...) is an
optimizer op.  Values written by backward ops are gradients.

Memory facts the executor needs, stated on the ops'
:class:`~memopt.graph.OpFacts`: ``no_need_buffer`` (operands the op reads
only for their shape, which do not keep memory alive), ``overwrites``
(``(input, output)`` pairs of an op that writes over its operands: ``sgd_``,
``batch_norm_``, ``relu_``), ``release`` (a translated memopt release),
``synthetic`` (above), ``stack_push`` / ``in_loop`` (below); ``attrs``
keeps the PIR op's ``pir_id``.  An ``xshape`` output holds no data (kind
``"shape"``); an einsum's ``inner_cache`` gets the size of the operands the
kernel really caches.

A legacy ``Program`` is read the way Paddle 3 runs it, translated to PIR
(:func:`convert_legacy`), with values named after the legacy variables.

Values are identified by ``Value.id`` (stable while the program lives).

Related modules: :mod:`memopt.paddle.pir.inplace` (Paddle's in-place
variants and a model of the executor's in-place pass) and
:mod:`memopt.paddle.pir.rewrite` (the in-place rewrite); memory_optimize on
PIR is wired in :mod:`memopt.api`.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional

from ...graph import (DENSE, RELEASED_VAR, Block, Graph, Op, OpFacts, Var, unversioned,
                     versioned)
from ..dim_extents import DimExtents, grad_inputs
from ..distributed import mark_in_flight

log = logging.getLogger(__name__)

__all__ = [
    "PirGraph",
    "program_to_graph",
    "convert",
    "convert_legacy",
    "is_pir_program",
    "is_pir_value",
    "value_name",
    "RANDOM_OPS",
    "SIDE_EFFECT_OPS",
    "draws_random",
]

#: PIR op names of the constructs handled specially.
IF_OP, WHILE_OP, YIELD_OP = "pd_op.if", "pd_op.while", "cf.yield"
#: ``pd_op`` control-flow ops Paddle defines without yaml info (its
#: ``control_flow_op.h``): asking one for its output names dereferences a
#: null pointer (Paddle 3.3.1: a legacy ``select_input``, translated,
#: crashed the process with SIGSEGV).
NO_YAML_OPS = frozenset({IF_OP, WHILE_OP, "pd_op.select_input", "pd_op.select_output",
                         "pd_op.has_elements", "pd_op.assert", "pd_op.pylayer"})
COMBINE_OP, SPLIT_OP, SLICE_OP = "builtin.combine", "builtin.split", "builtin.slice"
PARAMETER_OP, DATA_OPS = "builtin.parameter", ("pd_op.data", "pd_op.feed")
FETCH_OPS = ("pd_op.fetch", "builtin.shadow_output")
STACK_OP, PUSH_OP, POP_OP = "cf.stack_create", "cf.tuple_push", "cf.tuple_pop"
RNN_OP, RNN_GRAD_OP = "pd_op.rnn", "pd_op.rnn_grad"
DROPOUT_OP = "pd_op.dropout"

#: Ops drawing from Paddle's random generator (``pd_op.rnn``: its dropout
#: between layers).  Each draw moves the generator on, so such an op may not
#: run twice (a second draw gives other values) and two of them may not
#: swap places (each would get the other's numbers).
RANDOM_OPS = frozenset({
    "pd_op.dropout", "pd_op.uniform", "pd_op.gaussian", "pd_op.randint", "pd_op.randperm",
    "pd_op.bernoulli", "pd_op.multinomial", "pd_op.truncated_gaussian_random",
    "pd_op.uniform_random", "pd_op.gaussian_random", "pd_op.rrelu", "pd_op.exponential_",
    "pd_op.poisson", "pd_op.random_routing", "pd_op.class_center_sample",
    "pd_op.fused_dropout_add", "pd_op.fused_bias_dropout_residual_layer_norm",
    "pd_op.sampling_id", "pd_op.top_p_sampling", "pd_op.randn", "pd_op.rnn",
    "pd_op.uniform_inplace", "pd_op.uniform_inplace_", "pd_op.gaussian_inplace",
    "pd_op.gaussian_inplace_", "pd_op.gumbel_softmax", "pd_op.binomial",
    "pd_op.standard_gamma", "pd_op.dirichlet", "pd_op.fused_attention",
    "pd_op.fused_feedforward"})


#: Ops whose run is seen beyond the values they write: ``pd_op.print``
#: (Paddle's ``static.Print``) writes to stdout, a legacy ``py_func``
#: (``pd_op.`` + its type) runs the user's Python.  Such an op runs as often,
#: and in the order among themselves, as the program says: never recomputed
#: (a ``budget=`` clone of a Print printed it again in the backward: 9 lines
#: for 3 steps where the program prints 6), never moved past another.
SIDE_EFFECT_OPS = frozenset({"pd_op.print", "pd_op.py_func"})


def draws_random(op) -> bool:
    """Whether PIR operation ``op`` draws from the random generator: a
    :data:`RANDOM_OPS` op, or any op with a ``seed`` attribute (random ops
    not listed, custom ones included)."""
    if op.name() in RANDOM_OPS:
        return True
    try:
        return "seed" in op.attrs()
    except Exception:  # an op whose attributes Python cannot read
        return False


ADD_GRAD_OP = "pd_op.add_grad"
DEPEND_OP = "pd_op.depend"
LAYER_NORM_GRAD_OP = "pd_op.layer_norm_grad"
#: the Lamb update, which holds a parameter-sized buffer (kernel_memory.lamb_workspace)
LAMB_OPS = ("pd_op.lamb", "pd_op.lamb_")
#: Rprop's update, whose CPU kernel holds four parameter-sized buffers
RPROP_OPS = ("pd_op.rprop", "pd_op.rprop_")
#: index_put / set_value (a tensor value), whose kernels broadcast to the
#: written region first (kernel_memory)
INDEX_PUT_OPS = ("pd_op.index_put", "pd_op.index_put_")
SET_VALUE_TENSOR_OPS = ("pd_op.set_value_with_tensor", "pd_op.set_value_with_tensor_")
#: how PIR prints a value's missing type
NULL_TYPE = "<<NULL TYPE>>"
#: convolutions whose CPU kernels hold an im2col buffer (kernel_memory.conv_workspace)
CONV_OPS = frozenset({"pd_op.conv2d", "pd_op.conv2d_grad", "pd_op.depthwise_conv2d",
                      "pd_op.depthwise_conv2d_grad"})
#: What a legacy ``share_buffer`` (a memopt release among others) translates to.
SHARE_DATA_OP = "pd_op.share_data_"
#: Ops that make constants; those right before the first gradient op that
#: only gradient ops read belong to the backward part.
_SEED_OPS = ("pd_op.full", "pd_op.full_like", "pd_op.full_int_array", "pd_op.fill_constant")


def is_pir_program(program: Any) -> bool:
    """Whether ``program`` is a ``paddle.pir.Program`` (without importing Paddle
    when it is plainly something else)."""
    cls = type(program)
    return cls.__name__ == "Program" and "pir" in cls.__module__


def is_pir_value(obj: Any) -> bool:
    """Whether ``obj`` is a PIR ``Value`` (an SSA value of a PIR program)."""
    cls = type(obj)
    return cls.__name__ == "Value" and "pir" in cls.__module__


def _dtype_name(value) -> str:
    """``paddle.float32`` -> ``"float32"``."""
    return str(value.dtype).rsplit(".", 1)[-1].lower()


def _constant_ints(value) -> Optional[list]:
    """The ints a ``pd_op.full_int_array`` makes, else None."""
    op = value.get_defining_op() if value is not None and value.initialized() else None
    if op is None or op.name() != "pd_op.full_int_array":
        return None
    return [int(v) for v in op.attrs().get("value", [])]


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
    kept : names the caller keeps exactly as they are (``skip_opt_set``):
        no recomputation drops them.
    """

    graph: Graph
    ops: list = field(default_factory=list)
    name_of: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    defining_op: dict = field(default_factory=dict)
    program: Any = None
    kept: frozenset = frozenset()

    def name(self, value) -> str:
        """The name of a PIR ``Value`` of this program (KeyError if foreign)."""
        return self.name_of[value.id]


def _output_names(pir_op) -> list:
    """Names of an operator's result slots ([] for ops without yaml info:
    builtin, cf and control-flow ops, where asking can crash Paddle)."""
    name = pir_op.name()
    if not name.startswith("pd_op.") or name in NO_YAML_OPS or pir_op.num_regions():
        return []
    known = _OUTPUT_NAMES.get(name)
    if known is None:
        try:
            known = tuple(pir_op.get_output_names())
        except Exception:
            known = ()
        _OUTPUT_NAMES[name] = known
    return list(known)


#: op name -> its result slots' names (the op's yaml info: one per op type)
_OUTPUT_NAMES: Dict[str, tuple] = {}


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


#: PIR's per-op memory rules: op name -> the rule stating what the op's CPU
#: kernel allocates beyond what PIR's types show (``facts.workspace``, the
#: real shapes of results PIR types otherwise), from
#: :mod:`memopt.paddle.kernel_memory`.  A rule is registered beside its
#: definition with :func:`memory_rule` and called by the converter's generic
#: walk as ``rule(converter, pir_op, block, facts)``; an op without a rule
#: holds what its types say.
MEMORY_RULES: Dict[str, Callable[..., None]] = {}


def memory_rule(*names: str):
    """Register the decorated function as the memory rule of the ops
    ``names`` (each op has at most one rule)."""
    def register(rule):
        for name in names:
            if name in MEMORY_RULES:
                raise ValueError(f"{name} has a memory rule already: "
                                 f"{MEMORY_RULES[name].__name__}")
            MEMORY_RULES[name] = rule
        return rule
    return register


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
        self.next_stack = 0
        self.loop_depth = 0  # while bodies around the block being walked
        self.pushed: dict = {}  # stack index -> names of the memory pushed on it
        self.printed: dict = {}  # value id -> "%N" / "%arg_N"
        self.vector_elems: dict = {}  # vector value id -> element names
        self.fetch_ids = {v.id for v in fetch_list if hasattr(v, "id")}
        self.fetch_names = [v for v in fetch_list if isinstance(v, str)]
        self.block_ops: list = []  # (graph block idx, Op) in walk order
        self.extents = DimExtents()  # -1 dims that are not the batch

    # -- names and variables ------------------------------------------------
    def _declare(self, value, name: str, block: Block, shape_only: bool = False,
                 **flags) -> str:
        """Declare ``value`` as variable ``name`` of ``block``.  A
        ``shape_only`` value (an op's ``xshape`` output) never holds data:
        its kind is ``"shape"`` and it costs no memory."""
        if name in self.result.values:  # a duplicate attribute name
            k = 1
            while versioned(name, k) in self.result.values:
                k += 1
            name = versioned(name, k)
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
            if op.name() == STACK_OP:  # printed as %stack_k, %inlet_k, %outlet_k
                for kind, value in zip(("stack", "inlet", "outlet"), op.results()):
                    self.printed[value.id] = f"%{kind}_{self.next_stack}"
                self.next_stack += 1
                continue
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
                out.extend(nm for nm in elems if nm is not None)
            elif v.id in self.result.name_of:
                out.append(self.result.name_of[v.id])
            else:  # a value defined nowhere we walked (should not happen)
                log.debug("operand %s of an op has no name; ignored", v.id)
        return out

    # -- walking ------------------------------------------------------------
    def run(self) -> PirGraph:
        self._number(self.program.global_block())
        self._slice_consumers: dict = {}  # vector value id -> {index: builtin.slice}
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
            elif op.name() == SLICE_OP:
                # a vector unpacked element by element (Paddle's translation
                # of a legacy program: ``concat_grad``'s gradients): its
                # elements are named from the slices
                self._slice_consumers.setdefault(op.operand_source(0).id, {})[
                    int(op.attrs().get("index", 0))] = op
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
                slices = self._slice_consumers.get(value.id)
                if split is None and slices and value.id not in self._split_consumers:
                    # elements no slice takes stay unnamed (nothing reads them)
                    elems = [self._declare(slices[k].result(0),
                                           self.printed[slices[k].result(0).id], block,
                                           shape_only=shape_only) if k in slices else None
                             for k in range(max(slices) + 1)]
                    self.vector_elems[value.id] = elems
                    written.extend(nm for nm in elems if nm is not None)
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
            pairs = [(results[0], elems[index])] if index < len(elems) and elems[index] is not None else []
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
        self._visit_extents(pir_op, block, reads, writes)
        facts = OpFacts()
        is_release = name == SHARE_DATA_OP and set(reads) == {RELEASED_VAR}
        if is_release:
            # a legacy release (memopt.release_memory) as translated: the
            # value written is the legacy variable's next version (``v#k``),
            # holding nothing (not an overwrite of the empty variable)
            facts.release = tuple(sorted({unversioned(w) for w in writes} - {RELEASED_VAR}))
        else:
            facts.overwrites = self._overwritten(pir_op)
        facts.no_need_buffer = tuple(self._no_need_buffer(pir_op))
        rule = MEMORY_RULES.get(name)
        if rule is not None:
            rule(self, pir_op, block, facts)
        if name == POP_OP:
            stack = self._stack_index(pir_op.operand_source(0))
            held = self.pushed.get(stack, [])
            reads = [*reads, *held]
            by_power = {}
            for h in held:
                by_power.setdefault(self.graph.global_block.vars[h].size.power, h)
            pairs = []
            for nm in writes:
                var = self.graph.find_var(nm, block.idx)
                if var.is_dense and var.size.power in by_power:
                    pairs.append((by_power[var.size.power], nm))
            facts.overwrites = tuple(pairs)
        self._add(block, pir_op, Op(name, reads=tuple(reads), writes=tuple(writes),
                                    attrs={"pir_id": pir_op.id()}, facts=facts))
        if name == PUSH_OP:
            self._walk_push(pir_op, block, reads[1:])

    def _visit_extents(self, pir_op, block: Block, reads: list, writes: list) -> None:
        """What the ``-1`` dims of ``pir_op``'s results hold where they are
        not the batch (:mod:`memopt.paddle.dim_extents`)."""
        find = self.graph.find_var
        name = pir_op.name()
        has_yaml = name.startswith("pd_op.") and name not in NO_YAML_OPS \
            and not pir_op.num_regions()  # asking others for slot names can crash Paddle
        grads = grad_inputs(pir_op, lambda v: self.result.name_of.get(v.id)) if has_yaml else {}
        self.extents.visit(name, pir_op.attrs(), [find(nm, block.idx) for nm in reads],
                           [find(nm, block.idx) for nm in writes],
                           {res: find(src, block.idx) for res, src in grads.items()})

    @memory_rule(RNN_OP, RNN_GRAD_OP)
    def _rnn_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """What the rnn kernels allocate beyond PIR's types
        (:mod:`memopt.paddle.kernel_memory`): the real shapes of ``rnn``'s
        ``reserve`` and ``dropout_state_out``; an inference ``rnn``'s and
        ``rnn_grad``'s workspace."""
        from .. import kernel_memory

        op_attrs = pir_op.attrs()
        mode = str(op_attrs.get("mode", ""))
        names = list(pir_op.get_input_names() if pir_op.name() == RNN_GRAD_OP
                     else pir_op.get_output_names())
        if "out" not in names:
            return
        k = names.index("out")
        out = (pir_op.operand_source(k) if pir_op.name() == RNN_GRAD_OP
               else pir_op.result(k))
        if not out.initialized() or not out.is_dense_tensor_type():
            return
        shape, dtype = tuple(int(d) for d in out.shape), _dtype_name(out)
        if pir_op.name() == RNN_GRAD_OP:
            facts.workspace = self._rnn_grad_workspace(pir_op, mode, shape, dtype)
            return
        is_test = bool(op_attrs.get("is_test", False))
        if is_test:
            ins = list(pir_op.get_input_names())
            lengths = pir_op.operand_source(ins.index("sequence_length")) \
                if "sequence_length" in ins else None
            facts.workspace = kernel_memory.rnn_test_workspace(
                mode, shape, dtype, int(op_attrs.get("num_layers", 1)),
                directions=2 if op_attrs.get("is_bidirec", False) else 1,
                sequence_length=lengths is not None and lengths.initialized()
                and lengths.is_dense_tensor_type())
        real = kernel_memory.rnn_outputs(mode, int(op_attrs.get("num_layers", 1)),
                                         is_test, shape, dtype)
        for slot, (real_shape, real_dtype) in real.items():
            value = pir_op.result(names.index(slot)) if slot in names else None
            nm = self.result.name_of.get(value.id) if value is not None else None
            var = block.vars.get(nm) if nm is not None else None
            if var is not None and var.is_dense:
                var.shape, var.dtype = real_shape, real_dtype

    @memory_rule(DROPOUT_OP)
    def _dropout_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """An inference dropout (``is_test``, a model in eval mode) never
        fills its ``mask`` (:mod:`memopt.paddle.kernel_memory`): when nothing
        reads it, it holds no memory (it was counted as the input's shape in
        uint8: with GC off, every eval dropout's mask held to the end)."""
        from .. import kernel_memory

        outs = list(pir_op.get_output_names())
        if "mask" not in outs or not kernel_memory.dropout_mask_unfilled(
                bool(pir_op.attrs().get("is_test", False))):
            return
        mask = pir_op.result(outs.index("mask"))
        if not mask.initialized() or not mask.use_empty():
            return
        nm = self.result.name_of.get(mask.id)
        var = block.vars.get(nm) if nm is not None else None
        if var is not None and var.is_dense:
            var.shape = (0,)

    @staticmethod
    def _rnn_grad_workspace(pir_op, mode: str, shape: tuple, dtype: str):
        """``rnn_grad``'s workspace from the op: whether it has an ``x_grad``
        and which of its ``pre_state_grad`` nothing reads
        (:func:`memopt.paddle.kernel_memory.rnn_grad_workspace`)."""
        from .. import kernel_memory

        attrs = pir_op.attrs()
        outs = list(pir_op.get_output_names())
        x = pir_op.operand_source(list(pir_op.get_input_names()).index("x"))
        x_grad = pir_op.result(outs.index("x_grad")) if "x_grad" in outs else None
        no_x_grad = x_grad is None or not x_grad.initialized() \
            or not x_grad.is_dense_tensor_type()
        states = pir_op.result(outs.index("pre_state_grad")) \
            if "pre_state_grad" in outs else None
        vec = states.type().as_vec_type() if states is not None and states.initialized() \
            and str(states.type()) != NULL_TYPE else None
        # a legacy program translated to PIR may type an element as null: the
        # kernel then gets no such gradient
        elems = [None if str(t) == NULL_TYPE else tuple(int(d) for d in t.shape)
                 for t in (vec.as_list() if vec is not None else [])]
        has_states = bool(elems) and elems[0] is not None
        ins = list(pir_op.get_input_names())
        lengths = pir_op.operand_source(ins.index("sequence_length")) \
            if "sequence_length" in ins else None
        unread = tuple(e for e in elems if e is not None) if states is not None \
            and states.initialized() and states.use_empty() else ()
        known_x = x.initialized() and x.is_dense_tensor_type()
        return kernel_memory.rnn_grad_workspace(
            mode, shape, dtype, int(attrs.get("num_layers", 1)),
            x_shape=tuple(int(d) for d in x.shape) if no_x_grad and known_x else None,
            unread_state_grads=unread, has_state_grads=has_states,
            directions=2 if attrs.get("is_bidirec", False) else 1,
            sequence_length=lengths is not None and lengths.initialized()
            and lengths.is_dense_tensor_type())

    @memory_rule(*sorted(CONV_OPS))
    def _conv_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """A convolution's im2col workspace (:mod:`memopt.paddle.kernel_memory`)."""
        from .. import kernel_memory

        if pir_op.num_operands() < 2:
            return
        x, w = pir_op.operand_source(0), pir_op.operand_source(1)
        out = (pir_op.operand_source(2) if pir_op.name().endswith("_grad")
               and pir_op.num_operands() > 2 else pir_op.result(0))
        if not all(v.initialized() and v.is_dense_tensor_type() for v in (x, w, out)):
            return
        attrs = pir_op.attrs()
        workspace = kernel_memory.conv_workspace(
            tuple(int(d) for d in w.shape), tuple(int(d) for d in out.shape),
            attrs.get("strides", [1, 1]), attrs.get("paddings", [0, 0]),
            attrs.get("dilations", [1, 1]), str(attrs.get("padding_algorithm", "EXPLICIT")),
            str(attrs.get("data_format", "NCHW")), _dtype_name(x))
        if workspace is not None:
            facts.workspace = workspace

    @memory_rule(ADD_GRAD_OP)
    def _add_grad_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """``add_grad``'s workspace (:mod:`memopt.paddle.kernel_memory`)."""
        from .. import kernel_memory

        if pir_op.num_operands() < 3 or pir_op.num_results() < 2:
            return
        y, out_grad = pir_op.operand_source(1), pir_op.operand_source(2)
        y_grad = pir_op.result(1)
        if not (y.initialized() and out_grad.initialized()
                and out_grad.is_dense_tensor_type() and y.is_dense_tensor_type()):
            return
        wanted = y_grad.initialized() and y_grad.is_dense_tensor_type() \
            and not y_grad.use_empty()
        workspace = kernel_memory.add_grad_workspace(
            tuple(int(d) for d in y.shape), tuple(int(d) for d in out_grad.shape),
            _dtype_name(out_grad), wanted)
        if workspace is not None:
            facts.workspace = workspace

    @memory_rule(*LAMB_OPS, *RPROP_OPS)
    def _update_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """A Lamb or Rprop update's workspace, sized by its parameter
        (:mod:`memopt.paddle.kernel_memory`)."""
        from .. import kernel_memory

        param = pir_op.operand_source(0) if pir_op.num_operands() else None
        if param is None or not (param.initialized() and param.is_dense_tensor_type()):
            return
        workspace_of = (kernel_memory.lamb_workspace if pir_op.name() in LAMB_OPS
                        else kernel_memory.rprop_workspace)
        facts.workspace = workspace_of(tuple(int(d) for d in param.shape), _dtype_name(param))

    @memory_rule(*INDEX_PUT_OPS)
    def _index_put_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """index_put's broadcast indices and value (:mod:`memopt.paddle.kernel_memory`);
        integer indices only (a boolean mask takes another path)."""
        from .. import kernel_memory

        if pir_op.num_operands() < 3:
            return
        x, vector, value = (pir_op.operand_source(k) for k in range(3))
        combine = vector.get_defining_op() if vector.initialized() else None
        if combine is None or combine.name() != COMBINE_OP or not all(
                v.initialized() and v.is_dense_tensor_type() for v in (x, value)):
            return
        indices = list(combine.operands_source())
        if not indices or not all(v.initialized() and v.is_dense_tensor_type()
                                  and _dtype_name(v) in ("int64", "int32") for v in indices):
            return
        facts.workspace = kernel_memory.index_put_workspace(
            tuple(int(d) for d in x.shape), [tuple(int(d) for d in v.shape) for v in indices],
            tuple(int(d) for d in value.shape), _dtype_name(value))

    @memory_rule(*SET_VALUE_TENSOR_OPS)
    def _set_value_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """set_value's value broadcast to the slice (:mod:`memopt.paddle.kernel_memory`):
        the slice from constant starts / ends / steps, else all of ``x``."""
        from .. import kernel_memory

        x = pir_op.operand_source(0) if pir_op.num_operands() else None
        if x is None or not (x.initialized() and x.is_dense_tensor_type()):
            return
        shape = [int(d) for d in x.shape]
        bounds = [_constant_ints(pir_op.operand_source(k)) if pir_op.num_operands() > k
                  else None for k in (2, 3, 4)]
        axes = [int(a) for a in pir_op.attrs().get("axes", [])]
        if all(b is not None and len(b) == len(axes) for b in bounds):
            for axis, start, end, step in zip(axes, *bounds):
                dim = shape[axis] if -len(shape) <= axis < len(shape) else -1
                if dim >= 0 and step != 0:
                    shape[axis] = len(range(*slice(start, end, step).indices(dim)))
        facts.workspace = kernel_memory.set_value_workspace(tuple(shape), _dtype_name(x))

    @memory_rule(LAYER_NORM_GRAD_OP)
    def _layer_norm_grad_memory(self, pir_op, block: Block, facts: OpFacts) -> None:
        """``layer_norm_grad``'s workspace (:mod:`memopt.paddle.kernel_memory`)."""
        from .. import kernel_memory

        ins, outs = list(pir_op.get_input_names()), list(pir_op.get_output_names())
        if "x" not in ins or "mean" not in ins:
            return
        x, mean = pir_op.operand_source(ins.index("x")), pir_op.operand_source(ins.index("mean"))
        if not all(v.initialized() and v.is_dense_tensor_type() for v in (x, mean)):
            return

        def made(slot):  # the kernel fills a typed result even if nothing reads it
            if slot not in outs:
                return False
            r = pir_op.result(outs.index(slot))
            return r.initialized() and r.is_dense_tensor_type()

        workspace = kernel_memory.layer_norm_grad_workspace(
            tuple(int(d) for d in x.shape), _dtype_name(x),
            tuple(int(d) for d in mean.shape), _dtype_name(mean),
            made("x_grad") or made("scale_grad"))
        if workspace is not None:
            facts.workspace = workspace

    def _stack_index(self, value) -> int:
        """k of ``%inlet_k`` / ``%outlet_k`` / ``%stack_k``."""
        return int(self.printed.get(value.id, "%x_-1").rsplit("_", 1)[1])

    def _walk_push(self, pir_op, block: Block, pushed: list) -> None:
        """After a ``cf.tuple_push``: the stack now holds the pushed tensors'
        memory until the matching ``cf.tuple_pop`` (in the backward part).

        A synthetic op ``cf.tuple_push/stack`` right after the push writes
        one variable per power of the batch size holding their bytes (kind
        dense, dtype uint8; declared in the global block, as the pop is in
        another region); the pop reads it and its results share it
        (``overwrites``).  A push inside a while body runs once per
        iteration: ``facts.in_loop`` lets the analysis scale it.
        """
        stack = self._stack_index(pir_op.operand_source(0))
        by_power: dict = {}
        for nm in pushed:
            var = self.graph.find_var(nm, block.idx)
            if var is not None and var.is_dense:
                size = var.size
                by_power[size.power] = by_power.get(size.power, 0) + size.coefficient
        names = []
        for power, total in sorted(by_power.items()):
            if not total:
                continue
            name = f"%stack_{stack}.push{len(self.pushed.get(stack, []))}"
            self.graph.global_block.add_var(Var(name, (-1,) * power + (total,), "uint8"))
            self.pushed.setdefault(stack, []).append(name)
            names.append(name)
        if names:
            self._add(block, None, Op(PUSH_OP + "/stack", writes=tuple(names),
                                      facts=OpFacts(synthetic="after", stack_push=tuple(names),
                                                    in_loop=self.loop_depth > 0)))

    def _overwritten(self, pir_op) -> tuple:
        """``((input name, output name), ...)`` for an op that writes results
        over operands (``sgd_``, ``batch_norm_``, ``relu_``)."""
        if pir_op.name() == DEPEND_OP:  # its result is its first operand's buffer
            vin, vout = pir_op.operand_source(0), pir_op.result(0)
            names = self.result.name_of
            return ((names[vin.id], names[vout.id]),) if vin.initialized() and \
                vout.initialized() and vin.id in names and vout.id in names else ()
        if not pir_op.name().endswith("_"):
            return ()
        from paddle.base import core

        pairs = []
        for out_slot, in_slot in sorted(core.pir.get_op_inplace_info(pir_op).items()):
            vin, vout = pir_op.operand_source(in_slot), pir_op.result(out_slot)
            if not (vin.initialized() and vout.initialized()):
                continue
            if vin.id in self.result.name_of and vout.id in self.result.name_of:
                pairs.append((self.result.name_of[vin.id], self.result.name_of[vout.id]))
            elif vin.id in self.vector_elems and vout.id in self.vector_elems:
                # a vector written over a vector (lars_momentum_, merged_adam_,
                # merged_momentum_, check_finite_and_unscale_): element k of
                # the result is element k of the operand's buffer
                pairs.extend((a, b) for a, b in zip(self.vector_elems[vin.id],
                                                    self.vector_elems[vout.id])
                             if a is not None and b is not None)
        return tuple(pairs)

    def _no_need_buffer(self, pir_op) -> list:
        """Operands whose data the op never reads, only their shape (the
        executor does not keep them alive for it)."""
        operands = [v for v in pir_op.operands_source() if v.initialized()]
        shape_only: dict = {}  # Value id -> is_no_need_buffer (asked once per Value)
        out = []
        for v in operands:
            try:
                known = shape_only[v.id] = pir_op.is_no_need_buffer(v)
            except Exception:  # ops without yaml info
                return []
            if known:
                out.extend(self._reads([v]))
        if not out:
            return []
        # a name also read as a real operand is needed after all; so is a
        # Value that is two operands (``is_no_need_buffer`` answers per
        # Value, not per slot: an ``add_grad`` reading its ``out_grad`` as
        # ``x`` too, as memopt's dims-only substitution makes it, would
        # otherwise have its gradient freed before it runs)
        uses: dict = {}
        for v in operands:
            uses[v.id] = uses.get(v.id, 0) + 1
        return [nm for nm in dict.fromkeys(out)
                if sum(1 for v in operands
                       if nm in self._reads([v])
                       and (uses[v.id] > 1 or not shape_only[v.id])) == 0]

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
                                  facts=OpFacts(synthetic="after")))

    def _walk_while(self, pir_op, block: Block) -> None:
        operands = list(pir_op.operands_source())
        cond, inits = operands[:1], operands[1:]
        (body,) = list(pir_op.blocks())
        args = [self._declare(arg, self.printed[arg.id], block) for arg in body.args()]
        position = len(self.block_ops)
        for nm in args:
            self.result.defining_op.setdefault(nm, position)
        self._add(block, None, Op(WHILE_OP + "/in", reads=tuple(self._reads(inits)),
                                  writes=tuple(args), facts=OpFacts(synthetic="before")))
        head = self._add(block, pir_op, Op(WHILE_OP, reads=tuple(self._reads(cond)),
                                           writes=tuple(args), loop=True,
                                           attrs={"pir_id": pir_op.id()}))
        sub = self.graph.new_block(block.idx)
        head.sub_blocks = (sub.idx,)
        self.loop_depth += 1
        self._walk_block(body, sub)
        self.loop_depth -= 1
        # The body's yield writes the carried values for the next iteration.
        body_ops = self.graph.blocks[sub.idx].ops
        if body_ops and body_ops[-1].type == YIELD_OP:
            body_ops[-1].writes = tuple(args)
        position = len(self.block_ops)
        writes = self._name_results(pir_op, block)
        for nm in writes:
            self.result.defining_op.setdefault(nm, position)
        self._add(block, None, Op(WHILE_OP + "/out", reads=tuple(args), writes=tuple(writes),
                                  facts=OpFacts(synthetic="after")))

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


def convert(program, fetch_list: Iterable = (), value_names: Optional[dict] = None, *,
            labels: bool = True) -> PirGraph:
    """Read a PIR program into a :class:`PirGraph` (the program is not changed).

    Parameters
    ----------
    program : a ``paddle.pir.Program``.
    fetch_list : Values (or names) the caller will fetch; they are live at the
        exit and marked ``is_fetch``.  Operands of ``pd_op.fetch`` /
        ``builtin.shadow_output`` ops already in the program are fetched too.
    value_names : ``Value.id`` -> name, overriding the generated names.
    labels : give the values the labels messages name them by
        (:func:`label_values`); ``False`` for a read only measured (a
        throwaway clone's), which is then never kept for a later read
        (:mod:`memopt.paddle.pir.convert_cache`).
    """
    if not is_pir_program(program):
        from ...errors import UnsupportedProgramError
        raise UnsupportedProgramError(
            f"expected a paddle.pir.Program, got {type(program).__name__}; "
            "build the program in Paddle's static mode with PIR on (the default)")
    fetch_list = list(fetch_list)
    if value_names or not labels:
        return _read(program, fetch_list, value_names, labels)
    from . import convert_cache as pir_convert_cache

    return pir_convert_cache.cached(program, fetch_list,
                                    lambda: _read(program, fetch_list, value_names, labels))


def _read(program, fetch_list: list, value_names: Optional[dict], labels: bool) -> PirGraph:
    """:func:`convert`'s read of ``program`` (always afresh)."""
    result = _Converter(program, fetch_list, value_names).run()
    result.program = program
    if labels and not value_names:  # (a translated legacy program's ops are not the user's)
        label_values(result)
    fetched = [nm for _, var in result.graph.all_vars() if var.is_fetch
               for nm in [var.name]]
    result.graph.fetch_names = tuple(dict.fromkeys((*result.graph.fetch_names, *fetched)))
    mark_in_flight(result.graph)
    return result


# -- how a user knows a value ---------------------------------------------------

_FRAME_LINE = re.compile(r'", line (\d+)')
#: ``name="..."`` in a line of Python.
_NAME_ARG = re.compile(r"""\bname\s*=\s*(['"])([^'"]+)\1""")


def _paddle_dir() -> str:
    import paddle

    return os.path.dirname(os.path.abspath(paddle.__file__)) + os.sep


def _user_frame(op, paddle_dir: str) -> Optional[tuple]:
    """``(file, line, code)`` of the innermost frame of ``op``'s call stack
    (``op.callstack``: the Python that built it, as ``File "f", line n, in
    g`` / code pairs, outermost first) outside Paddle's own package -- the
    line that called Paddle -- or None (no call stack kept, e.g. most
    backward ops)."""
    try:
        stack = list(op.callstack or ())
    except Exception:  # pragma: no cover - ops without one
        return None
    for k in range(len(stack) - 1, -1, -1):
        entry = str(stack[k])
        if not entry.lstrip().startswith('File "'):
            continue
        path = entry.split('"', 2)[1]
        if path.startswith(paddle_dir):
            continue
        m = _FRAME_LINE.search(entry)
        code = str(stack[k + 1]).strip() if k + 1 < len(stack) else ""
        return path, int(m.group(1)) if m else 0, code
    return None


def _op_places(pir_block, where: str, out: dict) -> None:
    """``op.id()`` -> where the op is: ``"op 6"`` (index in the top-level
    block) or ``"op 2 in pd_op.while at op 40"``."""
    for k, op in enumerate(pir_block.ops):
        place = f"op {k}" + where
        out[op.id()] = place
        for sub in op.blocks():
            _op_places(sub, f" in {op.name()} at {place}", out)


def label_values(result: PirGraph) -> None:
    """Set :attr:`memopt.graph.Var.label` of every ``%N`` value of
    ``result`` to how the user knows it:

    - ``'my_sum' (%7)`` when the Python line that built the value's op passed
      ``name="my_sum"`` and this op makes what that line returns (the last of
      the ops built in a row from the same call; PIR keeps no ``name=``
      itself, but every op keeps the call stack that built it);
    - ``pd_op.add at op 6, model.py:12 (%7)`` otherwise: the op that makes it
      (and which output slot, when it has several:
      ``pd_op.matmul_grad(...).y_grad at op 9``), its position in the program
      (``print(program)`` order), and the line of Python that built it when
      Paddle kept one.

    Each op of the graph gets ``attrs["place"]``, that position (``"op 6"``,
    ``"op 2 in pd_op.while at op 40"``): what an analysis report names it by;
    and ``attrs["source"]``, the line of Python that built it
    (``"model.py:12"``), where Paddle kept one.
    """
    if result.program is None:
        return
    paddle_dir = _paddle_dir()
    places: dict = {}
    _op_places(result.program.global_block(), "", places)
    frames: dict = {}   # op id -> user frame
    last_of_run: set = set()  # ops that end a run of ops built by one call

    def scan(pir_block) -> None:
        previous = None
        for op in pir_block.ops:
            frame = _user_frame(op, paddle_dir)
            frames[op.id()] = frame
            if previous is not None and (frame is None or frame != frames[previous.id()]):
                last_of_run.add(previous.id())
            previous = op
            for sub in op.blocks():
                scan(sub)
        if previous is not None:
            last_of_run.add(previous.id())

    scan(result.program.global_block())
    for _, graph_op in result.graph.walk_ops():   # where reports say an op is
        place = places.get(graph_op.attrs.get("pir_id"))
        if place is not None:
            graph_op.attrs["place"] = place
        frame = frames.get(graph_op.attrs.get("pir_id"))
        if frame is not None:  # the line of Python that built it
            graph_op.attrs["source"] = f"{os.path.basename(frame[0])}:{frame[1]}"
    for _, var in result.graph.all_vars():
        name = var.name
        value = result.values.get(name)
        if not name.startswith("%") or value is None or name.startswith(("%arg_", "%stack_",
                                                                        "%inlet_", "%outlet_")):
            continue
        op = value.get_defining_op()
        if op is None:
            continue
        frame = frames.get(op.id())
        if frame is not None and op.id() in last_of_run and op.num_results() == 1:
            m = _NAME_ARG.search(frame[2])
            if m:
                var.label = f"{m.group(2)!r} ({name})"
                continue
        # an op with several results: which one, as ``pd_op.matmul_grad(...).y_grad``
        # (an op's output slot, never to be read as a variable the user named y_grad)
        text = op.name()
        if op.num_results() > 1:
            slots = _output_names(op)
            index = next((k for k, r in enumerate(op.results()) if r.id == value.id), None)
            if index is not None:
                text += f"(...).{slots[index] if index < len(slots) else index}"
        text += f" at {places.get(op.id(), '?')}"
        if frame is not None:
            text += f", {os.path.basename(frame[0])}:{frame[1]}"
        var.label = f"{text} ({name})"


def label(result: PirGraph, name: str) -> str:
    """How messages name value ``name`` of ``result`` (see :func:`label_values`)."""
    for block in result.graph.blocks:
        if name in block.vars:
            return block.vars[name].display
    return name


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

    from ..legacy.depend import translatable_desc
    _refuse_crashing_ops(program)
    _init_pir_context()
    desc = translatable_desc(program)  # in-place depend ops: a copy the translator takes
    try:
        translated, by_name = _unguarded("translate_to_pir_with_param_map")(
            program.desc if desc is None else desc)
    except Exception as exc:  # Paddle's translator raises SystemError, ValueError...
        raise untranslatable(program, exc) from None
    value_names: dict = {}
    last_value: dict = {}
    for name in sorted(by_name):
        for k, value in enumerate(by_name[name]):
            if value.initialized() and value.id not in value_names:
                value_names[value.id] = name if k == 0 else versioned(name, k)
                last_value[name] = value
    fetch_names = [item if isinstance(item, str) else getattr(item, "name", None)
                   for item in fetch_list]
    fetch_values = [last_value[name] for name in fetch_names if name in last_value]
    # (a depend's result is its input's buffer: PirConverter._overwritten)
    result = convert(translated, fetch_values, value_names)
    _declare_fetched_inputs(program, [n for n in fetch_names if n not in last_value], result)
    legacy_places(program, result)
    return result


def _declare_fetched_inputs(program, untranslated: Iterable, result: PirGraph) -> None:
    """Declare in ``result``'s top block, as a fed input, each fetched
    legacy variable of ``untranslated`` (fetched names the translation made
    no value of) that is a dense temporary of ``program``: no op makes or
    reads it, so only a feed fills it.  Paddle's translator makes values of
    ops only, so a fed input fetched straight back had no value, and its
    memory was counted as 0 B (a ``budget=1`` was accepted on a program
    that holds the feed)."""
    from paddle.base import core
    from paddle.base.data_feeder import convert_dtype

    block = program.global_block()
    top = result.graph.blocks[0]
    added = []
    for name in untranslated:
        if name is None or name in top.vars or not block.has_var(name):
            continue
        pvar = block.var(name)
        if pvar.persistable or pvar.desc.type() != core.VarDesc.VarType.DENSE_TENSOR:
            continue
        top.add_var(Var(name, tuple(pvar.shape), convert_dtype(pvar.dtype), DENSE,
                        is_data=True, is_feed=True, is_fetch=True))
        added.append(name)
    if added:
        result.graph.fetch_names = tuple(dict.fromkeys((*result.graph.fetch_names, *added)))


#: Ops of a translated legacy program that declare what the legacy program
#: has before its first op (parameters, feeds): no legacy op of their own.
_DECLARATIONS = frozenset({"builtin.parameter", "pd_op.data", "builtin.split",
                           "builtin.slice", "builtin.combine"})


def _legacy_source(op, paddle_dir: str) -> str:
    """``"model.py:12"``: the line of Python outside Paddle that built the
    legacy ``op`` (its ``op_callstack`` attribute), or ''."""
    try:
        stack = list(op.desc.attr("op_callstack")) if op.desc.has_attr("op_callstack") else []
    except Exception:  # pragma: no cover - an op without a readable call stack
        return ""
    for entry in reversed(stack):
        entry = str(entry).strip()
        if entry.startswith('File "'):
            path = entry.split('"', 2)[1]
            if not path.startswith(paddle_dir):
                m = _FRAME_LINE.search(entry)
                return f"{os.path.basename(path)}:{m.group(1) if m else 0}"
    return ""


def legacy_places(program, result: PirGraph) -> None:
    """Name the top-level ops of a translated legacy program by the legacy op
    they come from, the numbering the user's program has: ``attrs["place"]``
    ``"op 23 (mul_grad)"`` (what analysis reports print), and label the
    values the translation made up (``%107``, no legacy variable) as
    ``pd_op.reshape at op 23 (mul_grad) (%107)``.

    The translator emits each legacy op's PIR ops in program order, the op
    writing the legacy op's outputs last or among them; an op writing no
    legacy variable (a reshape around ``mul_grad``'s ``matmul_grad``)
    belongs to the next one that does.  Ops after the last such op keep no
    place.  Each placed op also gets ``attrs["origin"]``, the legacy op's
    ``original_id`` (which memopt's rewrites keep: :mod:`memopt.alignment`
    finds the op again after them), and ``attrs["source"]``, the line of
    Python that built it where Paddle kept one."""
    legacy_ops = list(program.global_block().ops)
    paddle_dir = _paddle_dir()
    writers: dict = {}
    for i, op in enumerate(legacy_ops):
        for nm in op.output_arg_names:
            writers.setdefault(nm, []).append(i)
    cursor, pending = 0, []
    for block_idx, op in result.graph.walk_ops():
        if block_idx != 0 or "pir_id" not in op.attrs or op.type in _DECLARATIONS:
            continue
        pending.append(op)
        hits = [i for nm in op.writes for i in writers.get(unversioned(nm), ()) if i >= cursor]
        if not hits:
            continue
        cursor = min(hits)
        place = f"op {cursor} ({legacy_ops[cursor].type})"
        origin = f"legacy op {legacy_ops[cursor].desc.original_id()}"
        source = _legacy_source(legacy_ops[cursor], paddle_dir)
        for member in pending:
            member.attrs["place"] = place
            member.attrs["origin"] = origin  # which op it is, through memopt's rewrites
            if source:
                member.attrs["source"] = source
            for nm in member.writes:
                var = result.graph.find_var(nm)
                if nm.startswith("%") and var is not None and not var.label:
                    var.label = f"{member.type} at {place} ({nm})"
        pending = []


#: ``[set_value][ValueTensor] should only have 1 variable, but got 0``: the
#: translator wants that input slot filled (legacy ``x[:, 0] = 0.0`` leaves
#: set_value's ValueTensor empty, its value an attribute).
_EMPTY_SLOT = re.compile(r"\[(\w+)\]\[(\w+)\] should only have 1 variable, but got 0")

#: How Paddle 3.3.1's translator names the op it refuses: ``[op:rnn_grad]``
#: (a translation rule failed), ``Op auc should have corresponding OpInfo``
#: (no PIR op of that type) or an empty input slot (:data:`_EMPTY_SLOT`).
_REFUSED_OP = (re.compile(r"\[op:([\w.]+)\]"), re.compile(r"\bOp ([\w.]+) should have corresponding OpInfo"),
               _EMPTY_SLOT)


#: Legacy op types Paddle 3.3.1's translator to PIR crashes on (SIGSEGV in
#: ``OpTranscriber``, measured: ``paddle.static.nn.static_pylayer``'s
#: ``pylayer``, in a forward-only program too): never handed to it.
TRANSLATOR_CRASHES = frozenset({"pylayer", "pylayer_grad"})


#: Legacy ops of a non-iterable DataLoader (no PIR op to translate them to).
READER_OPS = frozenset({"create_py_reader", "create_double_buffer_reader", "read"})


def _refuse_crashing_ops(program) -> None:
    """Raise :func:`untranslatable`'s error for a ``program`` holding an op
    of :data:`TRANSLATOR_CRASHES` before the translator takes the process
    down."""
    for block in program.blocks:
        for op in block.ops:
            if op.type in TRANSLATOR_CRASHES:
                raise untranslatable(program, RuntimeError(
                    f"[op:{op.type}] Paddle's translator crashes the process (SIGSEGV) on it"))


def untranslatable(program, exc: BaseException):
    """The :class:`~memopt.errors.UnsupportedProgramError` for a legacy
    ``program`` Paddle's translator to PIR refused with ``exc``: it names the
    op (its type and first position in the program, when the message says
    which) and the ways around."""
    from ...errors import UnsupportedProgramError

    text = str(exc)
    reason = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    op_type = next((m.group(1) for rx in _REFUSED_OP for m in [rx.search(text)] if m), None)
    where = ""
    empty = _EMPTY_SLOT.search(text)
    if op_type is not None:
        def refused(op):
            if op.type != op_type:
                return False
            slot = empty.group(2) if empty else None
            return slot is None or slot not in op.input_names or not op.input(slot)

        for b, block in enumerate(program.blocks):
            hit = next((i for i, op in enumerate(block.ops) if refused(op)), None)
            if hit is not None:
                where = f" (first at op {hit} of block {b})"
                break
        culprit = f"op {op_type!r}{where}"
    else:
        culprit = "one of its ops"
    sparse = _sparse_lookup(program) if "selectedrows" in text.lower() else None
    if sparse is not None:  # the message names a type, not the op
        op_type, where = sparse
        culprit = (f"the SelectedRows gradient of op {op_type!r} (is_sparse=True, first "
                   f"at op {where[1]} of block {where[0]}) where an op reads it")
    forward = op_type.endswith("_grad") if op_type else False
    ways = ["build the program in PIR (Paddle 3's default static mode, "
            "FLAGS_enable_pir_api=1), where it is read without translation"]
    if sparse is not None:
        ways.append("a dense gradient: nn.Embedding(..., sparse=False) (or "
                    "F.embedding(..., sparse=False))")
    elif op_type in TRANSLATOR_CRASHES:
        ways.append("write that layer with ordinary ops (not paddle.static.nn.static_pylayer)")
    elif empty is not None and op_type == "set_value":
        ways.append("give the value as a tensor (paddle.static.setitem(x, index, "
                    "paddle.full(shape, value, dtype)) rather than x[index] = 0.0)")
    elif op_type in READER_OPS:
        ways.append("feed the program instead of reading in it (DataLoader.from_generator("
                    "iterable=True) and Executor.run(feed=...))")
    elif forward:
        ways.append("analyse the forward program (before minimize(), or "
                    "clone(for_test=True)) if only its memory matters")
    elif op_type is not None:
        ways.append(f"leave {op_type!r} out of the program you analyse (e.g. compute the "
                    "metric in a separate program)")
    return UnsupportedProgramError(
        f"memopt reads a legacy program through Paddle's translation to PIR, which "
        f"refused {culprit}: {reason}. Ways around: " + "; or ".join(ways) + ".")


def _sparse_lookup(program):
    """``(op type, (block, position))`` of the first sparse lookup
    (``lookup_table`` / ``lookup_table_v2`` with ``is_sparse``: its gradient is
    SelectedRows, which Paddle's translator to PIR refuses where an
    optimizer or ``sum`` reads it) in a legacy ``program``, or None."""
    for b, block in enumerate(program.blocks):
        for i, op in enumerate(block.ops):
            if op.type in ("lookup_table", "lookup_table_v2") and op.has_attr("is_sparse") \
                    and op.attr("is_sparse"):
                return op.type, (b, i)
    return None


_pir_context_ready = False


def _init_pir_context() -> None:
    """Make sure PIR is initialised in this process, once.

    In a process started with ``FLAGS_enable_pir_api=0`` nothing has set
    up PIR's context, and ``paddle.pir.translate_to_pir_with_param_map``
    fails ("input data pointer is null") until something has; a
    ``translate_to_pir`` of an empty ``ProgramDesc`` does it (measured on
    Paddle 3.3.1) and changes nothing the user holds.
    """
    global _pir_context_ready
    if not _pir_context_ready:
        import paddle
        from paddle.base import core

        paddle.pir.translate_to_pir(core.ProgramDesc())
        _pir_context_ready = True


def program_to_graph(program, fetch_list: Iterable = ()) -> Graph:
    """The :class:`Graph` of a PIR program (read-only; see the module docstring).

    Example
    -------
    >>> graph = program_to_graph(main_program)        # doctest: +SKIP
    >>> [op.type for op in graph.global_block.ops][:3]  # doctest: +SKIP
    ['builtin.parameter', 'pd_op.data', 'pd_op.matmul']
    """
    return convert(program, fetch_list).graph


def owning_program(value):
    """The program whose top-level block (through any nesting of sub-blocks)
    holds the op that defines ``value``; ValueError for a free value."""
    op = value.get_defining_op()
    block = op.get_parent_block() if op is not None else None
    while block is not None and block.parent_op is not None \
            and block.parent_op.name() != "builtin.module":
        block = block.parent_op.get_parent_block()
    if block is None:
        raise ValueError("the Value belongs to no program")
    return block.program


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
    try:
        return value_names(owning_program(value))[value.id]
    except KeyError:
        raise ValueError("the Value belongs to no program") from None


def value_names(program) -> dict:
    """``Value.id`` -> the name :func:`value_name` gives it, for every op
    result and block argument of ``program`` (regions included)."""
    converter = _Converter(program)
    converter._number(program.global_block())
    names = dict(converter.printed)
    for op in all_ops(program.global_block()):
        if op.name() == PARAMETER_OP:
            names[op.result(0).id] = str(op.attrs().get("parameter_name"))
        elif op.name() in DATA_OPS and op.attrs().get("name"):
            names[op.result(0).id] = str(op.attrs().get("name"))
    return names


def all_ops(block):
    """Every op of ``block``, each followed by the ops of its regions (depth first)."""
    for op in block.ops:
        yield op
        for sub in op.blocks():
            yield from all_ops(sub)


def value_label(value) -> str:
    """How messages name ``value``: its :func:`label` in its own program
    (``'my_sum' (%7)``, ``pd_op.add at op 6, model.py:12 (%7)``)."""
    pg = convert(owning_program(value))
    return label(pg, pg.name(value))


def _unguarded(name: str):
    """``paddle.pir.<name>`` without memopt's guard
    (:mod:`memopt.paddle.guards.translate` keeps the function it wraps as
    ``__memopt_original__``): memopt's own analysis of a rewritten legacy
    program translates it to read its liveness, not to run it."""
    import paddle.pir

    fn = getattr(paddle.pir, name)
    return getattr(fn, "__memopt_original__", fn)
