"""Hypothesis strategies for random programs of the neutral graph model.

:func:`programs` draws a :class:`GeneratedProgram`: a :class:`memopt.graph.Graph`
with the arguments ``memory_optimize`` would get (``skip_opt_set``,
``skip_grads``).  The graphs look like what the Paddle adapters produce, and
then some:

- straight-line code of plain ops reading 0-3 defined variables and writing
  1-2 (new ones, redefinitions, the variable it reads -- an op that reads and
  writes the same name, as ``increment`` or an optimizer update does);
- ``while`` loops (``op.loop``) driven by a counter (``fill_constant``,
  ``less_than``, ``increment``, as Paddle's ``while_loop`` lowers) or by a
  value the body recomputes, and ``conditional_block`` branches with one or
  two sub-blocks, nested up to ``max_depth``; a sub-block reads and writes
  variables of its enclosing blocks (the control op lists them, as Paddle's
  ``X`` / ``Out`` slots do) and declares its own;
- variables of random shapes (symbolic batch dimensions ``-1``, sometimes
  two of them, zero-sized ones) and dtypes, drawn mostly from a small pool
  per program so that level 0 (same shape and dtype) finds partners; feeds,
  data, parameters, non-dense kinds (``lod_tensor_array``...), gradients
  (``@GRAD`` names written by backward ops), a loss op, fetched variables;
- declared in-place pairs (``facts.inplace``) on random ops, shaped as
  the legacy adapter makes them (an input only read, an output only written);
- with ``maybe_undefined=True``, reads of variables a branch not taken or a
  loop run zero times left unwritten (the interpreter reads what the scope
  held before the run);
- inputs declared as plain variables (``unmarked_inputs``), not fed
  nor data, as a legacy program read back from a file has them (its
  ``is_data`` flags are lost): values that come from outside all the same.

``repr()`` of a generated program prints it op by op (hypothesis shows it
when a property fails).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence, Tuple

from hypothesis import strategies as st

from memopt.graph import DENSE, DTYPE_BYTES, Graph, Op, OpFacts, Var

DTYPES = tuple(sorted(DTYPE_BYTES))
DIMS = (-1, -1, 1, 2, 3, 4, 8, 16, 64, 1000, 0)
NON_DENSE = ("lod_tensor_array", "step_scopes", "reader", "selected_rows")
PLAIN_TYPES = ("relu", "elementwise_add", "matmul_v2", "scale", "concat", "split",
               "reshape2", "reduce_sum", "softmax", "mix", "my_custom_op")
GRAD_TYPES = ("relu_grad", "elementwise_add_grad", "matmul_v2_grad", "sum")


@dataclass
class GeneratedProgram:
    """A random program and the memory_optimize arguments drawn for it."""

    graph: Graph
    skip_opt_set: frozenset = frozenset()
    skip_grads: bool = True

    def __repr__(self) -> str:
        return (f"GeneratedProgram(skip_opt_set={sorted(self.skip_opt_set)}, "
                f"skip_grads={self.skip_grads})\n{format_graph(self.graph)}")


def format_graph(graph: Graph) -> str:
    """The graph as text: declarations, then ops, sub-blocks indented."""
    lines: List[str] = []

    def var_text(var: Var) -> str:
        flags = [f for f, on in (("feed", var.is_feed), ("data", var.is_data),
                                 ("fetch", var.is_fetch), ("persist", var.persistable)) if on]
        kind = "" if var.kind == DENSE else f" {var.kind}"
        return (f"{var.name}: {var.dtype}{list(var.shape)}{kind}"
                + (f" [{','.join(flags)}]" if flags else ""))

    def block_text(idx: int, indent: str) -> None:
        block = graph.blocks[idx]
        if block.vars:
            lines.append(f"{indent}# block {idx} declares "
                         + "; ".join(var_text(v) for v in block.vars.values()))
        for i, op in enumerate(block.ops):
            extra = {k: v for k, v in op.attrs.items() if k != "index"}
            extra.update((f.name, getattr(op.facts, f.name)) for f in fields(OpFacts)
                         if getattr(op.facts, f.name) != f.default
                         and getattr(op.facts, f.name) != {})
            tags = (f" {op.role}" if op.role != "forward" else "") + (" loop" if op.loop else "")
            lines.append(f"{indent}{i}: {', '.join(op.writes) or '_'} = {op.type}"
                         f"({', '.join(op.reads)}){tags}{' ' + str(extra) if extra else ''}")
            for sub in op.sub_blocks:
                lines.append(f"{indent}  block {sub}:")
                block_text(sub, indent + "    ")

    block_text(0, "")
    lines.append(f"fetch: {list(graph.fetch_names)}")
    return "\n".join(lines)


# -- building blocks --------------------------------------------------------------

@st.composite
def shapes(draw, max_rank: int = 3) -> Tuple[int, ...]:
    """A tensor shape: 0-``max_rank`` dims, ``-1`` for the batch (maybe twice), 0 rarely."""
    return tuple(draw(st.lists(st.sampled_from(DIMS), max_size=max_rank)))


@st.composite
def tensor_types(draw) -> Tuple[Tuple[int, ...], str]:
    return draw(shapes()), draw(st.sampled_from(DTYPES))


@dataclass
class _Scope:
    """What a statement may read: names surely written (``ready``) and names
    perhaps left unwritten by a branch or an empty loop (``maybe``)."""

    ready: List[str] = field(default_factory=list)
    maybe: List[str] = field(default_factory=list)

    def copy(self) -> "_Scope":
        return _Scope(list(self.ready), list(self.maybe))


class _Builder:
    def __init__(self, draw, max_ops: int, max_depth: int, maybe_undefined: bool) -> None:
        self.draw = draw
        self.graph = Graph()
        self.budget = max_ops
        self.max_depth = max_depth
        self.maybe_undefined = maybe_undefined
        self.count = 0
        self.pool = draw(st.lists(tensor_types(), min_size=1, max_size=3))

    # -- variables --------------------------------------------------------------
    def fresh(self, suffix: str = "") -> str:
        self.count += 1
        return f"v{self.count}{suffix}"

    def declare(self, block_idx: int, *, grad: bool = False, **flags) -> str:
        draw = self.draw
        name = self.fresh("@GRAD" if grad else "")
        if not flags.get("persistable") and draw(st.integers(0, 19)) == 0:
            kind, shape, dtype = draw(st.sampled_from(NON_DENSE)), (), "float32"
        elif draw(st.integers(0, 4)):
            kind, (shape, dtype) = DENSE, draw(st.sampled_from(self.pool))
        else:
            kind, (shape, dtype) = DENSE, draw(tensor_types())
        self.graph.blocks[block_idx].add_var(Var(name, shape, dtype, kind, **flags))
        return name

    def declare_counter(self, block_idx: int) -> str:
        name = self.fresh()
        self.graph.blocks[block_idx].add_var(Var(name, (1,), "int64"))
        return name

    def home(self, name: str, block_idx: int) -> int:
        idx = block_idx
        while name not in self.graph.blocks[idx].vars:
            idx = self.graph.blocks[idx].parent
        return idx

    def writable(self, name: str, block_idx: int) -> bool:
        var = self.graph.find_var(name, block_idx)
        return not (var.is_feed or var.is_data or var.persistable)

    # -- statements -------------------------------------------------------------
    def statements(self, block_idx: int, scope: _Scope, depth: int) -> None:
        draw = self.draw
        count = draw(st.integers(1 if block_idx else 0, 6))
        for _ in range(count):
            if self.budget <= 0:
                return
            if depth < self.max_depth and self.budget >= 4 and draw(st.integers(0, 4)) == 0:
                if draw(st.booleans()):
                    self.loop(block_idx, scope, depth)
                else:
                    self.branch(block_idx, scope, depth)
            else:
                self.plain(block_idx, scope)

    def reads(self, scope: _Scope, most: int = 3) -> List[str]:
        draw = self.draw
        pool = list(scope.ready)
        if self.maybe_undefined and scope.maybe and draw(st.integers(0, 3)) == 0:
            pool += scope.maybe
        if not pool:
            return []
        least = 1 if draw(st.integers(0, 5)) else 0
        if len(pool) > 4 and draw(st.integers(0, 2)):
            pool = pool[-4:]                              # mostly the values just made
        return draw(st.lists(st.sampled_from(pool), min_size=least, max_size=most, unique=True))

    def plain(self, block_idx: int, scope: _Scope) -> None:
        draw = self.draw
        self.budget -= 1
        backward = draw(st.integers(0, 4)) == 0
        op_type = draw(st.sampled_from(GRAD_TYPES if backward else PLAIN_TYPES))
        reads = self.reads(scope)
        writes: List[str] = []
        for _ in range(draw(st.integers(1, 2))):
            choice = draw(st.integers(0, 9))
            redefinable = [n for n in scope.ready if self.writable(n, block_idx)]
            if choice == 0 and reads and self.writable(reads[0], block_idx):
                name = reads[0]                       # reads and writes one name
            elif choice == 1 and redefinable:
                name = draw(st.sampled_from(redefinable))  # a redefinition
            elif choice == 2 and block_idx:
                parent = self.graph.blocks[block_idx].parent
                name = self.declare(parent, grad=backward)  # an output of the construct
            else:
                name = self.declare(block_idx, grad=backward)
            if name not in writes:
                writes.append(name)
        facts = OpFacts()
        only_read = [n for n in reads if n not in writes]
        only_written = [n for n in writes if n not in reads]
        if only_read and draw(st.integers(0, 2)) == 0:
            src = draw(st.sampled_from(only_read))
            src_var = self.graph.find_var(src, block_idx)
            if draw(st.integers(0, 3)) and src_var.is_dense:
                # the usual case: a fresh output of the input's type (relu, scale...)
                dst = self.fresh("@GRAD" if backward else "")
                self.graph.blocks[block_idx].add_var(Var(dst, src_var.shape, src_var.dtype))
                writes.insert(0, dst)
            elif only_written:
                dst = draw(st.sampled_from(only_written))
            else:
                dst = None
            if dst is not None:
                facts.inplace = (src, dst)
        if block_idx == 0 and not backward and draw(st.integers(0, 14)) == 0:
            facts.loss = True
        self.graph.blocks[block_idx].add_op(
            Op(op_type, tuple(reads), tuple(writes), role="backward" if backward else "forward",
               facts=facts))
        self.publish(block_idx, scope, writes)

    def publish(self, block_idx: int, scope: _Scope, writes: Sequence[str],
                surely: bool = True) -> None:
        """Make ``writes`` readable by later statements of ``block_idx``."""
        for name in writes:
            if name in scope.ready:
                continue
            if surely:
                scope.ready.append(name)
                if name in scope.maybe:
                    scope.maybe.remove(name)
            elif name not in scope.maybe:
                scope.maybe.append(name)

    def fill(self, block_idx: int, name: str, value: int) -> None:
        self.budget -= 1
        self.graph.blocks[block_idx].add_op(
            Op("fill_constant", (), (name,), attrs={"value": value}))

    def less_than(self, block_idx: int, a: str, b: str, out: str) -> None:
        self.budget -= 1
        self.graph.blocks[block_idx].add_op(Op("less_than", (a, b), (out,)))

    def loop(self, block_idx: int, scope: _Scope, depth: int) -> None:
        draw = self.draw
        trips = draw(st.integers(0, 3))
        body = self.graph.new_block(block_idx)
        inner = scope.copy()
        if draw(st.booleans()):                           # a counter, as while_loop makes
            i, n, cond = (self.declare_counter(block_idx) for _ in range(3))
            self.fill(block_idx, i, 0)
            self.fill(block_idx, n, trips)
            self.less_than(block_idx, i, n, cond)
            self.statements(body.idx, inner, depth + 1)
            self.budget -= 1
            body.add_op(Op("increment", (i,), (i,), attrs={"step": 1}))
            self.less_than(body.idx, i, n, cond)
            attrs = {"cond": cond, "max_trips": trips + 1}
        else:                                             # a condition the body recomputes
            cond = self.declare_counter(block_idx)
            self.budget -= 1
            self.graph.blocks[block_idx].add_op(Op("mix", tuple(self.reads(scope, 2)), (cond,)))
            self.statements(body.idx, inner, depth + 1)
            self.budget -= 1
            body.add_op(Op("mix", tuple(self.reads(inner, 2)), (cond,)))
            attrs = {"cond": cond, "max_trips": max(trips, 1)}
        self.carry(body.idx)
        self.control("while", block_idx, (body.idx,), cond, attrs, loop=True)
        self.after_construct(block_idx, scope, (body.idx,))

    def carry(self, body_idx: int) -> None:
        """Maybe make the body read, first thing, a local it writes later: a
        value carried from one iteration to the next (unwritten in the first)."""
        draw = self.draw
        body = self.graph.blocks[body_idx]
        local = sorted({n for op in body.ops for n in op.writes if n in body.vars},
                       key=_name_order)
        if local and draw(st.booleans()):
            carried = draw(st.sampled_from(local))
            out = self.declare(body_idx)
            self.budget -= 1
            body.ops.insert(0, Op("mix", (carried,), (out,)))

    def branch(self, block_idx: int, scope: _Scope, depth: int) -> None:
        draw = self.draw
        cond = self.declare_counter(block_idx)
        self.budget -= 1
        self.graph.blocks[block_idx].add_op(Op("mix", tuple(self.reads(scope, 2)), (cond,)))
        subs = []
        for _ in range(draw(st.integers(1, 2))):
            sub = self.graph.new_block(block_idx)
            subs.append(sub.idx)
            self.statements(sub.idx, scope.copy(), depth + 1)
        self.control("conditional_block", block_idx, tuple(subs), cond, {"cond": cond},
                     loop=False)
        self.after_construct(block_idx, scope, tuple(subs))

    def outer_uses(self, block_idx: int, subs: Sequence[int]) -> Tuple[List[str], List[str]]:
        """Names the sub-blocks (at any depth) read / write that are declared
        in ``block_idx`` or an enclosing block."""
        reads: Dict[str, None] = {}
        writes: Dict[str, None] = {}
        outer = set()
        idx = block_idx
        while idx >= 0:
            outer.add(idx)
            idx = self.graph.blocks[idx].parent
        for sub in subs:
            for b, op in self.graph.walk_ops(sub):
                for names, into in ((op.reads, reads), (op.writes, writes)):
                    for name in names:
                        if self.home(name, b) in outer:
                            into[name] = None
        return list(reads), list(writes)

    def control(self, op_type: str, block_idx: int, subs: Tuple[int, ...], cond: str,
                attrs: Dict, loop: bool) -> None:
        draw = self.draw
        self.budget -= 1
        reads, writes = self.outer_uses(block_idx, subs)
        if draw(st.integers(0, 4)) == 0:                  # a control op that lists only its condition
            reads, writes = [], []
        reads = [cond] + [n for n in reads if n != cond]
        writes = [n for n in writes if n != cond]
        self.graph.blocks[block_idx].add_op(
            Op(op_type, tuple(reads), tuple(writes), sub_blocks=subs, loop=loop, attrs=attrs))

    def after_construct(self, block_idx: int, scope: _Scope, subs: Sequence[int]) -> None:
        """Outer names first written inside ``subs`` may still be unwritten."""
        _, writes = self.outer_uses(block_idx, subs)
        visible = [n for n in writes if self.graph.find_var(n, block_idx) is not None]
        self.publish(block_idx, scope, visible, surely=False)


@st.composite
def programs(draw, max_ops: int = 24, max_depth: int = 2,
             maybe_undefined: bool = True,
             unmarked_inputs: Optional[bool] = None) -> GeneratedProgram:
    """A random :class:`GeneratedProgram` (see the module docstring).

    Parameters
    ----------
    max_ops : ops in all blocks together, about (control constructs add a few).
    max_depth : how deep loops and branches nest.
    maybe_undefined : let ops read variables a branch may have left unwritten.
    unmarked_inputs : declare the inputs without ``is_feed`` / ``is_data``
        (None: drawn, for a quarter of the programs).
    """
    b = _Builder(draw, max_ops, max_depth, maybe_undefined)
    if unmarked_inputs is None:
        unmarked_inputs = draw(st.integers(0, 3)) == 0
    g = b.graph
    scope = _Scope()
    for _ in range(draw(st.integers(1, 3))):
        if unmarked_inputs:
            scope.ready.append(b.declare(0))
        else:
            scope.ready.append(b.declare(0, is_feed=True, is_data=draw(st.booleans())))
    for _ in range(draw(st.integers(0, 2))):
        scope.ready.append(b.declare(0, persistable=True))
    b.statements(0, scope, 0)
    # optimizer updates of parameters at the end (they read and write one name)
    params = [v.name for v in g.blocks[0].vars.values() if v.persistable]
    for p in params:
        if draw(st.booleans()):  # its "gradient": any value, often one made early
            grad = draw(st.sampled_from(scope.ready))
            g.blocks[0].add_op(Op("sgd", tuple(dict.fromkeys((p, grad))), (p,), role="optimize"))
    written = sorted({n for op in g.blocks[0].ops for n in op.writes
                      if g.blocks[0].vars.get(n) is not None}, key=_name_order)
    fetched = draw(st.lists(st.sampled_from(written), max_size=2, unique=True)) if written else []
    for name in fetched:
        g.blocks[0].vars[name].is_fetch = True
    g.fetch_names = tuple(fetched)
    for block in g.blocks:                 # positions, as the adapters record them
        for index, op in enumerate(block.ops):
            op.attrs["index"] = index
    g.validate()
    names = sorted({v.name for _, v in g.all_vars()}, key=_name_order)
    skip = draw(st.lists(st.sampled_from(names), max_size=3, unique=True)) if names else []
    if draw(st.integers(0, 9)) == 0:
        skip.append("not_a_variable")
    return GeneratedProgram(g, frozenset(skip), draw(st.booleans()))


def _name_order(name: str) -> Tuple[int, str]:
    digits = "".join(ch for ch in name.split("@")[0] if ch.isdigit())
    return (int(digits) if digits else -1, name)


def graphs(**kwargs) -> st.SearchStrategy:
    """Just the graph of :func:`programs`."""
    return programs(**kwargs).map(lambda p: p.graph)


def declared(graph: Graph) -> Dict[str, Var]:
    """Every declared variable by name (the outermost declaration wins)."""
    out: Dict[str, Var] = {}
    for _, var in graph.all_vars():
        out.setdefault(var.name, var)
    return out
