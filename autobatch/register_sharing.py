"""Which REGISTER variables may share one storage array: :func:`register_names`.

The batched VM keeps one array ``[batch, ...]`` per leaf of every REGISTER
variable.  Lowering makes many copies: arguments into a callee's parameters,
a return value into the return register and out of it, a tuple unpacked by a
projection primop (``first[0]``).  Each copy of a vector value moves every
selected thread's row twice (a gather, a scatter).  Two leaves that never
hold different values while both are live can live in one array; the copy
between them then changes nothing, and the VM drops it (it does not write a
value back to the array it was just read from).

The analysis is the classic one of register coalescing, on values:

- *Value numbers*, per block: a copy or a projection primop
  (:mod:`autobatch.projection`) gives its output leaves its input leaves'
  value numbers; any other write a new one; every leaf starts a block with
  a number of its own (nothing is assumed across blocks).
- *Interference*: where a leaf is written, it interferes with every leaf
  live after the instruction (per variable, from
  :attr:`~autobatch.lowering.LoweredProgram.live_out` and each instruction's
  reads and writes) that holds a different value number.  The leaves of one
  variable interfere with each other; main's parameters with each other and
  with every variable live where main starts (read before written).
- *Coalescing*: leaves related by a copy (same value number right after a
  write), both REGISTER and of the same :class:`~autobatch.ir.TensorType`,
  are merged greedily in program order where no leaf of one class
  interferes with a leaf of the other.

Liveness is over the lowered flow graph, where a return goes to every
continuation of a call, so it covers every path a thread can take (more
than it can take: a safe over-approximation).  A variable live at main's
entry that is not a parameter is never merged (it would read another
variable's value instead of its zeros).
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Set, Tuple

from autobatch.ir import CopyOp, PrimOp, VariableAllocation, pattern_leaves
from autobatch.lowering import LoweredProgram, terminator_of
from autobatch.projection import apply as apply_projection, projection

__all__ = ["register_names"]

Leaf = Tuple[str, int]  # (variable, leaf index)


def register_names(lowered: LoweredProgram) -> Dict[str, List[str]]:
    """The storage key of each leaf of every REGISTER or FULL variable
    (``"var#i"``; leaves of REGISTER variables that may share an array get
    the key of the first leaf of their class)."""
    names = {var: [f"{var}#{i}" for i in range(len(lowered.var_types[var].leaves()))]
             for var in sorted(lowered.var_types)
             if lowered.var_alloc[var] > VariableAllocation.TEMPORARY}
    for leaf, root in _classes(lowered).items():
        var, i = leaf
        names[var][i] = f"{root[0]}#{root[1]}"
    return names


def _leaves(lowered: LoweredProgram, var: str) -> List[Leaf]:
    return [(var, i) for i in range(len(lowered.var_types[var].leaves()))]


def _pattern_leaves(lowered: LoweredProgram, pattern: Any) -> List[Leaf]:
    return [leaf for var in pattern_leaves(pattern) for leaf in _leaves(lowered, var)]


def _same_values(lowered: LoweredProgram, op: Any) -> List[Tuple[Leaf, Leaf]]:
    """``(output leaf, input leaf)`` pairs ``op`` makes equal: a copy, or a
    projection primop (:mod:`autobatch.projection`) whose picks fit its
    outputs' types."""
    if isinstance(op, CopyOp):
        outs, ins = _pattern_leaves(lowered, op.vars_out), _pattern_leaves(lowered, op.vars_in)
        return list(zip(outs, ins)) if len(outs) == len(ins) else []
    if not isinstance(op, PrimOp):
        return []
    recipe = projection(op.function, len(op.vars_in))
    if recipe is None:
        return []
    # _value's patterns are lists (its leaves are (var, index) tuples)
    picked = apply_projection(recipe, [_value(lowered, var) for var in op.vars_in], list)
    if picked is None or not _fits(lowered, op.vars_out, picked):
        return []
    return list(zip(_pattern_leaves(lowered, op.vars_out), _flat(picked)))


def _value(lowered: LoweredProgram, var: str) -> Any:
    """``var``'s value as nested lists (tuple values) of its leaves."""
    counter = itertools.count()

    def walk(t: Any) -> Any:
        if isinstance(t, tuple):
            return [walk(p) for p in t]
        return (var, next(counter))
    return walk(lowered.var_types[var].tensors)


def _flat(value: Any) -> List[Leaf]:
    if isinstance(value, list):
        return [leaf for part in value for leaf in _flat(part)]
    return [value]


def _fits(lowered: LoweredProgram, pattern: Any, value: Any) -> bool:
    """Whether ``value`` (nested lists) has the structure of the output
    ``pattern`` and its variables' types."""
    if isinstance(pattern, tuple):
        return isinstance(value, list) and len(value) == len(pattern) and all(
            _fits(lowered, p, v) for p, v in zip(pattern, value))
    return _fits_type(lowered.var_types[pattern].tensors, value)


def _fits_type(tensors: Any, value: Any) -> bool:
    if isinstance(tensors, tuple):
        return isinstance(value, list) and len(value) == len(tensors) and all(
            _fits_type(t, v) for t, v in zip(tensors, value))
    return not isinstance(value, list)


def _classes(lowered: LoweredProgram) -> Dict[Leaf, Leaf]:
    """Leaf -> the first leaf of its class, for every leaf merged with another."""
    alloc, types = lowered.var_alloc, lowered.var_types

    def storable(leaf: Leaf) -> bool:
        return alloc[leaf[0]] == VariableAllocation.REGISTER

    interferes: Dict[Leaf, Set[Leaf]] = {}

    def interfere(a: Leaf, b: Leaf) -> None:
        if a != b and storable(a) and storable(b):
            interferes.setdefault(a, set()).add(b)
            interferes.setdefault(b, set()).add(a)

    candidates: List[Tuple[Leaf, Leaf]] = []
    fresh = itertools.count()
    for var in types:
        leaves = _leaves(lowered, var)
        for a in leaves:
            for b in leaves:
                interfere(a, b)
    for block in lowered.blocks:
        # live after each instruction, backwards from the block's end
        live = set(lowered.live_out.get(block.name, frozenset()))
        live |= set(terminator_of(block).reads)
        live_after: List[Set[str]] = []
        for op in reversed(block.instructions):
            live_after.append(set(live))
            live = (live - set(op.writes)) | set(op.reads)
        live_after.reverse()
        number: Dict[Leaf, Any] = {}  # leaf -> value number (absent: its own)
        origin: Dict[Leaf, Leaf] = {}  # leaf -> the REGISTER leaf it was copied from
        for op, after in zip(block.instructions, live_after):
            same = dict(_same_values(lowered, op))
            written = [leaf for var in op.writes for leaf in _leaves(lowered, var)]
            new = {leaf: number.get(same[leaf], same[leaf]) if leaf in same else next(fresh)
                   for leaf in written}
            came = {leaf: same[leaf] if storable(same[leaf]) else origin.get(same[leaf])
                    for leaf in written if leaf in same}
            number.update(new)
            for leaf in written:
                origin.pop(leaf, None)
                source = came.get(leaf)
                if source is not None and number.get(source, source) == new[leaf]:
                    origin[leaf] = source
                    if storable(leaf):
                        candidates.append((leaf, source))
                for var in after:
                    for other in _leaves(lowered, var):
                        if number.get(other, other) != new[leaf]:
                            interfere(leaf, other)
    entry = next(b for b in lowered.blocks if b.name == lowered.entry)
    live = set(lowered.live_out.get(entry.name, frozenset())) | set(terminator_of(entry).reads)
    for op in reversed(entry.instructions):
        live = (live - set(op.writes)) | set(op.reads)
    inputs = [leaf for var in lowered.inputs for leaf in _leaves(lowered, var)]
    never = {leaf for var in live - set(lowered.inputs) for leaf in _leaves(lowered, var)}
    for a in inputs:
        for var in live | set(lowered.inputs):
            for b in _leaves(lowered, var):
                interfere(a, b)

    root: Dict[Leaf, Leaf] = {}
    members: Dict[Leaf, List[Leaf]] = {}

    def find(leaf: Leaf) -> Leaf:
        while root.get(leaf, leaf) != leaf:
            leaf = root[leaf]
        return leaf

    def leaf_type(leaf: Leaf) -> Any:
        return types[leaf[0]].leaves()[leaf[1]]

    for a, b in candidates:
        if a in never or b in never or leaf_type(a) != leaf_type(b):
            continue
        ra, rb = find(a), find(b)
        if ra == rb:
            continue
        group_a, group_b = members.get(ra, [ra]), members.get(rb, [rb])
        if any(interferes.get(x, set()) & set(group_b) for x in group_a):
            continue
        first, second = sorted((ra, rb))
        root[second] = first
        members[first] = sorted(group_a + group_b)
        members.pop(second, None)
    return {leaf: find(leaf) for group in members.values() for leaf in group}
