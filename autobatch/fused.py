"""The fused-loop engine: a program without calls run as structured loops
over compacted lanes, as ``vmap`` runs a ``while_loop``: :func:`fuse`.

The batched VM (:mod:`autobatch.virtual_machine`) keeps a program counter
per thread and, at every step, selects the threads at one block, gathers
their registers, runs the block and scatters the results back.  For a
program whose ``main`` makes no call (no recursion, no stack) that machinery
is not needed: every thread follows the same structured control flow, so the
function can be turned into one piece of generated Python in which

- a *group* of lanes (the indices of the threads it holds, ``g['#']``, and
  one array per leaf of every variable live there, ``g['var#i']``, with one
  row per lane of the group) flows through the blocks;
- a ``while`` loop of the program becomes a Python ``while`` loop that runs
  the loop body on the lanes still in the loop: lanes that leave are moved
  out of the group (compaction) and continue after the loop once every lane
  has left, so each iteration costs what its remaining lanes cost;
- a branch whose condition holds for every lane of the group (or for none)
  sends the whole group on without copying anything; otherwise the group is
  split by the condition and the two parts meet again at the branch's join
  (its nearest post-dominator), where they are concatenated;
- an if/else whose two arms are straight-line code on scalars (per thread)
  runs both arms on the whole group and keeps, lane by lane, the side its
  condition chose (``np.where``), as ``vmap`` does with ``lax.cond``.  The
  arms' primops then also see the other side's lanes: NumPy's floating-point
  warnings are silenced during a fused run (as on the masked backends), and
  where a primop raises on such a lane
  the step is redone by splitting the group (primops are pure and act on
  each thread independently, so computing a lane's value on the wrong side
  and dropping it changes nothing);
- a return writes the group's values into the result at its lanes' rows.

The results are those of the VM and of the one-example reference
(:mod:`autobatch.reference`), bit for bit: every primop is applied to the
same values of the same dtypes; only the grouping of lanes differs.  Values
crossing a block boundary are stored with their variable's dtype, as in the
VM's registers; inside one block a weak (Python scalar) value stays a
Python scalar, as in the VM.

:func:`fuse` returns None where the program is not for this engine: ``main``
calls a function, its control flow is irreducible, or the generated code
would be too large; the VM runs it then.  Only NumPy is generated here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from autobatch.allocation_strategy import function_flow
from autobatch.errors import ProgramError
from autobatch.ir import (
    BranchOp, CopyOp, Function, GotoOp, PrimOp, Program, ReturnOp, Type, as_pattern,
    pattern_leaves, pattern_map, pattern_unflatten, tuple_expr,
)

__all__ = ["FusedProgram", "fuse", "MAX_LINES"]

#: Most lines of generated code before :func:`fuse` gives up (a program whose
#: branches would be copied into many paths).
MAX_LINES = 4000
_EXIT = "<exit>"


class _Unsupported(Exception):
    """The program is not for the fused engine (the VM runs it)."""


# -- run-time helpers (called by the generated code) ----------------------------------------

def _norm(value: Any, dtype: np.dtype, shape: Tuple[int, ...], n: int) -> np.ndarray:
    """``value`` as an array ``[n, *shape]`` of ``dtype`` (a scalar broadcast)."""
    if type(value) is np.ndarray and value.dtype == dtype and value.shape[:1] == (n,) \
            and value.shape[1:] == shape:
        return value
    array = np.asarray(value, dtype=dtype)
    if array.shape != (n,) + shape:
        array = np.broadcast_to(array, (n,) + shape)
    return array


def _mask(cond: Any, n: int) -> np.ndarray:
    """A branch condition as a boolean array ``[n]``."""
    if type(cond) is np.ndarray and cond.dtype == np.bool_ and cond.shape == (n,):
        return cond
    mask = np.asarray(cond, dtype=bool)
    return mask if mask.shape == (n,) else np.broadcast_to(mask, (n,))


def _merge(groups: List[dict], keys: Sequence[str]) -> Optional[dict]:
    """One group of every lane of ``groups`` (None for none)."""
    if not groups:
        return None
    if len(groups) == 1:
        return groups[0]
    out = {k: np.concatenate([g[k] for g in groups]) for k in keys}
    out["#"] = np.concatenate([g["#"] for g in groups])
    return out


# -- structure ---------------------------------------------------------------------------------

@dataclass
class _Shape:
    """The flow graph of one function: successors, loops, liveness."""

    fn: Function
    succ: Dict[str, Tuple[str, ...]]
    headers: Set[str]
    loop_body: Dict[str, FrozenSet[str]]
    live_in: Dict[str, FrozenSet[str]]
    live_out: Dict[str, FrozenSet[str]]


def _dominators(order: List[str], preds: Dict[str, Set[str]], entry: str
                ) -> Dict[str, Set[str]]:
    dom = {b: set(order) for b in order}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in order:
            if b == entry:
                continue
            ps = [dom[p] for p in preds[b] if p in dom]
            new = set.intersection(*ps) | {b} if ps else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def _shape(fn: Function) -> _Shape:
    blocks = {b.name: b for b in fn.blocks}
    succ = {b.name: tuple(dict.fromkeys(b.terminator.targets)) for b in fn.blocks}
    # reachable blocks in depth-first preorder; retreating edges must be back edges
    entry = fn.entry.name
    order: List[str] = []
    seen: Set[str] = set()
    on_path: Set[str] = set()
    retreating: List[Tuple[str, str]] = []

    def dfs(b: str) -> None:
        seen.add(b)
        on_path.add(b)
        order.append(b)
        for s in succ[b]:
            if s in on_path:
                retreating.append((b, s))
            elif s not in seen:
                dfs(s)
        on_path.discard(b)

    dfs(entry)
    preds: Dict[str, Set[str]] = {b: set() for b in order}
    for b in order:
        for s in succ[b]:
            preds[s].add(b)
    dom = _dominators(order, preds, entry)
    headers: Set[str] = set()
    body: Dict[str, Set[str]] = {}
    for src, head in retreating:
        if head not in dom[src]:
            raise _Unsupported("irreducible control flow")
        headers.add(head)
        nodes = body.setdefault(head, {head})
        todo = [src]
        while todo:
            b = todo.pop()
            if b not in nodes:
                nodes.add(b)
                todo.extend(preds[b])
    flow = function_flow(fn)
    live_in = {name: flow.liveness.live_in(flow.block_start[name]) for name in blocks}
    live_out = {name: flow.liveness.live_out(flow.node(name, len(blocks[name].instructions)))
                for name in blocks}
    return _Shape(fn, succ, headers, {h: frozenset(n) for h, n in body.items()},
                  live_in, live_out)


def _join(shape: _Shape, name: str, targets: Dict[str, Any]) -> str:
    """The nearest post-dominator of block ``name`` where blocks of
    ``targets`` and returns lead out (``_EXIT``: none)."""
    nodes: List[str] = []
    todo = [name]
    succ: Dict[str, Tuple[str, ...]] = {}
    while todo:
        b = todo.pop()
        if b in succ:
            continue
        out = tuple(_EXIT if s in targets else s for s in shape.succ[b])
        succ[b] = out or (_EXIT,)
        nodes.append(b)
        todo.extend(s for s in succ[b] if s != _EXIT)
    # post-dominators: dominators of the reversed graph, entered at _EXIT
    reversed_preds: Dict[str, Set[str]] = {b: set(succ[b]) for b in nodes}
    reversed_preds[_EXIT] = set()
    pdom = _dominators(nodes + [_EXIT], reversed_preds, _EXIT)
    strict = pdom[name] - {name}
    if not strict:
        return _EXIT
    return max(strict, key=lambda p: len(pdom[p]))


# -- code generation ---------------------------------------------------------------------------

class _Emitter:
    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.shape = _shape(fn)
        self.blocks = {b.name: b for b in fn.blocks}
        self.lines: List[str] = []
        self.namespace: Dict[str, Any] = {"np": np, "_norm": _norm, "_mask": _mask,
                                          "_merge": _merge,
                                          "_nd": np.ndarray, "_bool": np.dtype(bool),
                                          "_count": np.count_nonzero}
        self.count = 0
        self.indent = 1

    # -- helpers ---------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        if len(self.lines) > MAX_LINES:
            raise _Unsupported("generated code too large")
        self.lines.append("    " * self.indent + line)

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def constant(self, value: Any) -> str:
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def vtype(self, var: str) -> Type:
        return self.fn.var_types[var]

    def keys(self, var: str) -> List[str]:
        return [f"{var}#{i}" for i in range(len(self.vtype(var).leaves()))]

    def group_keys(self, live: FrozenSet[str]) -> str:
        keys = [k for v in sorted(live) for k in self.keys(v)]
        return self.constant(tuple(keys))

    def as_expr(self, pattern: Any) -> str:
        if isinstance(pattern, tuple):
            return tuple_expr(pattern, [self.as_expr(p) for p in pattern], self.constant)
        return pattern

    def scalar_only(self, names: Sequence[str]) -> bool:
        return all(not leaf.shape for v in names for leaf in self.vtype(v).leaves())

    # -- straight-line code ------------------------------------------------------------------
    def read(self, values: Dict[str, Any], var: str) -> Any:
        if var not in values:
            leaves = []
            for key in self.keys(var):
                name = self.fresh("t")
                self.emit(f"{name} = g[{key!r}]")
                leaves.append(name)
            values[var] = pattern_unflatten(self.vtype(var).tensors, leaves)
        return values[var]

    def bind(self, values: Dict[str, Any], dirty: Set[str], pattern: Any, expr: str) -> None:
        if isinstance(pattern, tuple):
            for i, part in enumerate(pattern):
                self.bind(values, dirty, part, f"{expr}[{i}]")
            return
        leaves = []
        paths = _paths(self.vtype(pattern).tensors, ()) if pattern in self.fn.var_types \
            else [()]
        for path in paths:
            if path:
                name = self.fresh("t")
                self.emit(f"{name} = {expr}{''.join(f'[{i}]' for i in path)}")
                leaves.append(name)
            else:
                leaves.append(expr)
        values[pattern] = pattern_unflatten(self.vtype(pattern).tensors, leaves)
        dirty.add(pattern)

    def instructions(self, block: Any, values: Dict[str, Any], dirty: Set[str]) -> None:
        for op in block.instructions:
            if isinstance(op, PrimOp):
                fn = self.constant(op.function)
                args = ", ".join(self.as_expr(self.read(values, v)) for v in op.vars_in)
                out = self.fresh("t")
                self.emit(f"{out} = {fn}({args})")
                self.bind(values, dirty, op.vars_out, out)
            elif isinstance(op, CopyOp):
                value = pattern_map(lambda v: self.read(values, v), op.vars_in)
                self.bind_static(values, dirty, op.vars_out, value)
            else:
                raise _Unsupported(f"{type(op).__name__}")

    def bind_static(self, values: Dict[str, Any], dirty: Set[str], pattern: Any,
                    value: Any) -> None:
        if isinstance(pattern, tuple):
            for part, sub in zip(pattern, value):
                self.bind_static(values, dirty, part, sub)
        else:
            values[pattern] = value
            dirty.add(pattern)

    def normalized(self, values: Dict[str, Any], var: str) -> List[str]:
        """Local names of ``var``'s leaves as stored arrays of its dtype."""
        out = []
        for leaf, typ in zip(pattern_leaves(values[var]), self.vtype(var).leaves()):
            name = self.fresh("t")
            dtype = self.constant(typ.dtype)
            call = f"_norm({leaf}, {dtype}, {typ.shape!r}, g['#'].shape[0])"
            if typ.shape:
                self.emit(f"{name} = {call}")
            else:  # the common case checked inline (no call)
                self.emit(f"{name} = {leaf} if {leaf}.__class__ is _nd and {leaf}.dtype is "
                          f"{dtype} and {leaf}.shape == g['#'].shape else {call}")
            out.append(name)
        return out

    def flush(self, values: Dict[str, Any], dirty: Set[str], live: FrozenSet[str]) -> None:
        """Store the variables written here that are live after the block."""
        for var in sorted(dirty & live):
            for key, name in zip(self.keys(var), self.normalized(values, var)):
                self.emit(f"g[{key!r}] = {name}")

    # -- control -------------------------------------------------------------------------------
    def path(self, name: str, targets: Dict[str, str], active: FrozenSet[str]) -> None:
        """Code for the group ``g`` entering block ``name``, until its lanes
        reach a block of ``targets`` (appended to that block's list) or return."""
        if name in self.shape.headers and name not in active:
            self.loop(name, targets, active)
            return
        self.emit("steps += 1")
        block = self.blocks[name]
        values: Dict[str, Any] = {}
        dirty: Set[str] = set()
        self.instructions(block, values, dirty)
        term = block.terminator
        if isinstance(term, ReturnOp):
            value = pattern_map(lambda v: self.read(values, v), term.vars)
            leaves = pattern_leaves(value)
            for i, leaf in enumerate(leaves):
                self.emit(f"out[{i}][g['#']] = {leaf}")
            return
        if isinstance(term, GotoOp):
            self.flush(values, dirty, self.shape.live_out[name])
            self.route(term.target, targets, active)
            return
        if not isinstance(term, BranchOp):
            raise _Unsupported(type(term).__name__)
        cond = self.as_expr(self.read(values, term.cond))
        self.flush(values, dirty, self.shape.live_out[name])
        mask = self.fresh("m")
        self.emit(f"{mask} = {cond} if {cond}.__class__ is _nd and {cond}.dtype is _bool "
                  f"and {cond}.shape == g['#'].shape else _mask({cond}, g['#'].shape[0])")
        join = self.join(name, targets)
        t, f = term.true_target, term.false_target
        if join != _EXIT and join not in targets and self.select_arms(name, t, f, join):
            self.select(name, mask, t, f, join, targets, active)
            return
        self.split(mask, t, f, join, targets, active)

    def route(self, target: str, targets: Dict[str, str], active: FrozenSet[str]) -> None:
        if target in targets:
            self.emit(f"{targets[target]}.append(g)")
        else:
            self.path(target, targets, active)

    def split(self, mask: str, t: str, f: str, join: str, targets: Dict[str, str],
              active: FrozenSet[str]) -> None:
        live = self.shape.live_in
        gt, gf = self.fresh("gt"), self.fresh("gf")
        self.emit_split(gt, gf, mask, live[t], live[f])
        inner = dict(targets)
        merged = None
        if join != _EXIT and join not in targets:
            merged = self.fresh("J")
            self.emit(f"{merged} = []")
            inner[join] = merged
        for side, target in ((gt, t), (gf, f)):
            self.emit(f"if {side} is not None:")
            self.indent += 1
            self.emit(f"g = {side}")
            self.route(target, inner, active)
            self.indent -= 1
        if merged is not None:
            self.emit(f"g = _merge({merged}, {self.group_keys(live[join])})")
            self.emit("if g is not None:")
            self.indent += 1
            self.path(join, targets, active)
            self.indent -= 1

    def emit_split(self, gt: str, gf: str, mask: str, live_t: FrozenSet[str],
                   live_f: FrozenSet[str]) -> None:
        """``gt, gf``: the groups of the lanes of ``g`` where ``mask`` holds
        and of the others (None for an empty side, ``g`` itself for a full
        one), written out in the generated code (no call; dict literals;
        rows gathered by index with ``take``, cheaper than boolean indexing
        once several arrays are cut the same way)."""
        count, rows, others = self.fresh("k"), self.fresh("r"), self.fresh("o")
        self.emit(f"{count} = _count({mask})")
        self.emit(f"if {count} == {mask}.shape[0]:")
        self.emit(f"    {gt}, {gf} = g, None")
        self.emit(f"elif not {count}:")
        self.emit(f"    {gt}, {gf} = None, g")
        self.emit("else:")
        self.indent += 1
        self.emit(f"{rows} = {mask}.nonzero()[0]")
        self.emit(f"{others} = (~{mask}).nonzero()[0]")
        for side, live, index in ((gt, live_t, rows), (gf, live_f, others)):
            keys = [k for v in sorted(live) for k in self.keys(v)]
            items = [f"'#': g['#'].take({index})"] + [
                f"{k!r}: g[{k!r}].take({index}, axis=0)" for k in keys]
            self.emit(f"{side} = {{{', '.join(items)}}}")
        self.indent -= 1

    def loop(self, head: str, targets: Dict[str, str], active: FrozenSet[str]) -> None:
        body = self.shape.loop_body[head]
        live = self.shape.live_in
        again = self.fresh("L")
        inner = dict(targets)
        inner[head] = again
        exits: Dict[str, str] = {}
        for b in sorted(body):
            for s in self.shape.succ[b]:
                if s not in body and s not in targets and s not in exits:
                    exits[s] = self.fresh("E")
        inner.update(exits)
        self.emit(f"{again} = [g]")
        for name in exits.values():
            self.emit(f"{name} = []")
        self.emit(f"while {again}:")
        self.indent += 1
        self.emit(f"g = {again}[0] if len({again}) == 1 else "
                  f"_merge({again}, {self.group_keys(live[head])})")
        self.emit(f"{again} = []")
        self.path(head, inner, active | {head})
        self.indent -= 1
        for target, name in exits.items():
            self.emit(f"g = _merge({name}, {self.group_keys(live[target])})")
            self.emit("if g is not None:")
            self.indent += 1
            self.path(target, targets, active)
            self.indent -= 1

    def join(self, name: str, targets: Dict[str, Any]) -> str:
        return _join(self.shape, name, targets)

    # -- if/else by selection -------------------------------------------------------------------
    def select_arms(self, name: str, t: str, f: str, join: str) -> bool:
        """Whether the branch ending ``name`` opens an if/else whose arms are
        straight-line primops on scalars that only it enters and that go to
        ``join`` (an absent arm: the branch goes to ``join`` itself)."""
        arms = [a for a in (t, f) if a != join]
        if not arms or t == f:
            return False
        for arm in arms:
            block = self.blocks[arm]
            if (arm in self.shape.headers or not isinstance(block.terminator, GotoOp)
                    or block.terminator.target != join
                    or any(not isinstance(op, (PrimOp, CopyOp)) for op in block.instructions)
                    or sum(arm in self.shape.succ[b] for b in self.blocks) != 1):
                return False
            names = {v for op in block.instructions
                     for v in pattern_leaves(op.vars_in) + pattern_leaves(op.vars_out)}
            if not self.scalar_only(sorted(names)):
                return False
        return True

    def select(self, name: str, mask: str, t: str, f: str, join: str,
               targets: Dict[str, str], active: FrozenSet[str]) -> None:
        live_join = self.shape.live_in[join]
        self.emit("try:")
        self.indent += 1
        sides: Dict[str, Tuple[Dict[str, Any], Set[str]]] = {}
        for arm in (t, f):
            values: Dict[str, Any] = {}
            dirty: Set[str] = set()
            if arm != join:
                self.emit("steps += 1")
                self.instructions(self.blocks[arm], values, dirty)
            sides[arm] = (values, dirty)
        stores = []
        for var in sorted((sides[t][1] | sides[f][1]) & live_join):
            chosen = []
            for arm in (t, f):
                values, dirty = sides[arm]
                if var in dirty:
                    chosen.append(self.normalized(values, var))
                else:
                    chosen.append([f"g[{k!r}]" for k in self.keys(var)])
            for key, a, b in zip(self.keys(var), *chosen):
                name_ = self.fresh("t")
                self.emit(f"{name_} = np.where({mask}, {a}, {b})")
                stores.append((key, name_))
        for key, value in stores:
            self.emit(f"g[{key!r}] = {value}")
        if not stores:
            self.emit("pass")
        self.indent -= 1
        # A primop raised on some lane: run each arm on its own lanes (an
        # error of a lane that takes the arm propagates from here).
        self.emit("except Exception:")
        self.indent += 1
        merged = self.fresh("J")
        self.emit(f"{merged} = []")
        inner = dict(targets)
        inner[join] = merged
        live = self.shape.live_in
        gt, gf = self.fresh("gt"), self.fresh("gf")
        self.emit_split(gt, gf, mask, live[t], live[f])
        for side, target in ((gt, t), (gf, f)):
            self.emit(f"if {side} is not None:")
            self.indent += 1
            self.emit(f"g = {side}")
            self.route(target, inner, active)
            self.indent -= 1
        # every lane of the group reaches the join (the arms are straight-line)
        self.emit(f"g = _merge({merged}, {self.group_keys(live_join)})")
        self.indent -= 1
        self.path(join, targets, active)


def _paths(pattern: Any, prefix: Tuple[int, ...]) -> List[Tuple[int, ...]]:
    if isinstance(pattern, tuple):
        out: List[Tuple[int, ...]] = []
        for i, part in enumerate(pattern):
            out.extend(_paths(part, prefix + (i,)))
        return out
    return [prefix]


# -- the compiled program ---------------------------------------------------------------------

class FusedProgram:
    """A call-free program compiled to one generated NumPy function.

    Attributes
    ----------
    source : the generated Python source (for reading and debugging).
    steps : after :meth:`run`, the number of block runs (one per group and
        block, the fused counterpart of the VM's steps).
    """

    def __init__(self, program: Program) -> None:
        fn = program.main_function()
        self.program = program
        self.function = fn
        emitter = _Emitter(fn)
        emitter.emit("steps = 0")
        emitter.emit("if g['#'].shape[0]:")
        emitter.indent += 1
        emitter.path(fn.entry.name, {}, frozenset())
        emitter.indent -= 1
        emitter.emit("return steps")
        self.source = "def fused(g, out):\n" + "\n".join(emitter.lines) + "\n"
        namespace = emitter.namespace
        exec(compile(self.source, f"<autobatch fused {fn.name}>", "exec"), namespace)
        self._run = namespace["fused"]
        self._entry_live = emitter.shape.live_in[fn.entry.name]
        self.steps = 0

    def run(self, args: Sequence[Any]) -> Any:
        """main's value per thread for a batch of arguments (as
        :meth:`autobatch.virtual_machine.VirtualMachine.run`)."""
        from autobatch.backends.numpy import NumpyBackend
        from autobatch.arguments import batch_size
        fn = self.function
        if len(args) != len(fn.params):
            raise ProgramError(f"function {fn.name!r} takes {len(fn.params)} argument(s) "
                               f"{fn.params}, got {len(args)}")
        types = [fn.var_types[p] for p in fn.params]
        batch = batch_size(args, types)
        backend = NumpyBackend()
        group: Dict[str, Any] = {"#": np.arange(batch)}
        for param, typ, arg in zip(fn.params, types, args):
            if param not in self._entry_live:
                continue
            leaves = pattern_leaves(as_pattern(arg))
            for i, (leaf, leaf_type) in enumerate(zip(leaves, typ.leaves())):
                group[f"{param}#{i}"] = backend.as_batched(leaf, leaf_type, batch)
        out = [np.zeros((batch,) + t.shape, t.dtype) for t in fn.return_type.leaves()]
        with np.errstate(all="ignore"):  # see the module doc (if/else by selection)
            self.steps = self._run(group, out)
        return pattern_unflatten(fn.return_type.tensors, out)


def fuse(program: Program) -> Optional[FusedProgram]:
    """The fused form of a typed program whose ``main`` makes no call, or None
    where the VM must run it (see the module doc)."""
    fn = program.main_function()
    if fn.return_type is None or not fn.var_types:
        raise ProgramError("fuse() needs a typed program: run type_inference.infer_types")
    if any(not isinstance(op, (PrimOp, CopyOp)) for b in fn.blocks for op in b.instructions):
        return None
    try:
        return FusedProgram(program)
    except _Unsupported:
        return None
