"""A reference interpreter for :class:`memopt.graph.Graph` programs.

It answers one question: does a memory plan change what a program computes?
A plan is an *assignment of storage*: ``renames[block][name] = other`` says
that, in that block, ``name`` lives in the memory of ``other`` (as
:attr:`memopt.plan.Plan.renames` does).  :func:`run` executes a graph
with every variable read and written through the storage it is assigned;
:func:`compare` runs the program with and without the plan and reports the
first difference.

Semantics
---------
Values are 64-bit integers; memory is a map from *slots* to values.  A
variable's slot is ``(b, name)`` where ``b`` is the block that declares it
(found from the op's block through the enclosing blocks, as
:meth:`Graph.find_var` does) and ``name`` its name after renaming; so two
variables share memory exactly when the plan gives them the same slot.

- At the start every variable's own memory holds a value
  (:func:`initial_values`, overridden by the caller's ``inputs``): fed and
  data variables and parameters get their inputs, and any other variable
  what an earlier run left in Paddle's scope.  So a program that reads a
  variable before writing it reads a value from outside, which a plan must
  keep.  A variable the plan stores in another's slot has no memory of its
  own (its initial value is lost); a slot nothing initialised reads
  :data:`UNDEF`.
- A plain op (no sub-blocks) reads all its inputs, then writes every output.
  ``fill_constant`` writes ``attrs["value"]``; ``increment`` writes its first
  input plus ``attrs.get("step", 1)``; ``less_than`` writes 1 if its first
  input is below its second, else 0; every other type writes, to its
  ``k``-th output, a hash mix of the op's identity (block, index, type), ``k``
  and every value read.  So any value an op reads wrongly changes everything
  downstream.
- Kernels are not assumed to read their inputs before writing their outputs:
  where the plan puts an output and a *different* input of one op in the same
  slot, the input is read as clobbered (:data:`POISON` mixed with the op),
  unless the two are the op's declared in-place pair
  (``facts.inplace == (input, output)``), whose kernel is known to run in
  place.  An op that reads and writes the *same* variable (``increment``) is
  fine.
- A release (an op with ``facts.release``: the names it frees) empties those variables' slots -- a later read gets
  :data:`UNDEF` -- and records nothing in the trace (it is not an op of the
  original program).
- A control op (one with sub-blocks) reads its inputs and outputs at its
  head (as :func:`memopt.liveness.analyze_graph` counts them), then:
  a loop op (``op.loop``) runs its one sub-block while its condition is
  true, at most ``attrs.get("max_trips", DEFAULT_MAX_TRIPS)`` times; a branch
  op with ``n`` sub-blocks runs sub-block ``v % (n + 1)`` of its condition's
  value ``v`` (``n`` = none).  The condition is ``attrs["cond"]``, else the
  op's first input, read afresh before every iteration; a value is true when
  odd (``less_than`` gives 1 or 0).  Without a condition a loop runs
  ``max_trips`` times and a branch runs its first sub-block.

An op's identity is its block and ``attrs["index"]`` (its position in the
block as the adapter read it; its position when absent), so a planned graph
whose block 0 ops were reordered (:attr:`memopt.plan.Plan.scheduled`)
can be compared op for op with the original.  Every value every op reads is
recorded (:attr:`Execution.trace`), with the fetched variables' final values
(:attr:`Execution.fetched`) and the persistable ones
(:attr:`Execution.persistable`); two runs compute the same thing when each
op reads the same values, execution for execution, and these agree.

This module imports neither Paddle nor TensorFlow.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from .errors import GraphError
from .graph import Graph, Op

__all__ = [
    "UNDEF",
    "POISON",
    "DEFAULT_MAX_TRIPS",
    "Execution",
    "Difference",
    "initial_values",
    "run",
    "compare",
]

MASK = (1 << 64) - 1
#: The value of a slot nothing has written yet.
UNDEF = 0x5EED_0000_0000_0001
#: Mixed into an input an op's kernel may have overwritten before reading it.
POISON = 0xBAD0_BAD0_BAD0_BAD0
#: Iterations a loop runs at most unless its op says ``attrs["max_trips"]``.
DEFAULT_MAX_TRIPS = 3
#: Op executions a run may take before it is stopped (nested loops multiply).
DEFAULT_MAX_STEPS = 100_000

Renames = Mapping[int, Mapping[str, str]]
Slot = Tuple[int, str]


def mix(*parts: int) -> int:
    """A 64-bit hash of integers (order matters); splitmix64 rounds."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & MASK)) & MASK
        h = (h * 0xBF58476D1CE4E5B9) & MASK
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & MASK
        h ^= h >> 29
    return h


def _text_value(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass
class Execution:
    """What a run observed.

    Attributes
    ----------
    trace : one entry per op execution, in order:
        ``(block index, op identity, values read)``.
    fetched : final value of each of the graph's ``fetch_names``.
    persistable : final value of every persistable variable.
    steps : op executions.
    """

    trace: List[Tuple[int, int, Tuple[int, ...]]] = field(default_factory=list)
    fetched: Dict[str, int] = field(default_factory=dict)
    persistable: Dict[str, int] = field(default_factory=dict)
    steps: int = 0


@dataclass(frozen=True)
class Difference:
    """Where two runs first disagree: ``what`` says it in words."""

    what: str

    def __str__(self) -> str:
        return self.what


def initial_values(graph: Graph, seed: int = 0) -> Dict[str, int]:
    """A value for every declared variable, from its name and ``seed``."""
    return {var.name: mix(_text_value(var.name), seed) for _, var in graph.all_vars()}


class _Machine:
    def __init__(self, graph: Graph, renames: Renames, max_steps: int) -> None:
        self.graph = graph
        self.renames = renames
        self.max_steps = max_steps
        self.memory: Dict[Slot, int] = {}
        self.result = Execution()
        self._slots: Dict[Tuple[int, str], Slot] = {}
        self._salt: Dict[Tuple[int, int], int] = {}

    def slot(self, block_idx: int, name: str) -> Slot:
        key = (block_idx, name)
        found = self._slots.get(key)
        if found is None:
            home = self.graph.home_of(name, block_idx)
            if home < 0:
                raise GraphError(f"variable {name!r} is used in block {block_idx} but "
                                 "declared in neither it nor an enclosing block")
            found = self._slots[key] = (home, self.renames.get(home, {}).get(name, name))
        return found

    def load(self, block_idx: int, name: str) -> int:
        return self.memory.get(self.slot(block_idx, name), UNDEF)

    def store(self, block_idx: int, name: str, value: int) -> None:
        self.memory[self.slot(block_idx, name)] = value

    def salt(self, block_idx: int, ident: int, op: Op) -> int:
        key = (block_idx, ident)
        found = self._salt.get(key)
        if found is None:
            found = self._salt[key] = mix(block_idx, ident, _text_value(op.type))
        return found

    def tick(self) -> None:
        self.result.steps += 1
        if self.result.steps > self.max_steps:
            raise RuntimeError(f"the run took more than {self.max_steps} op executions; "
                               "lower the loops' max_trips")

    def run_block(self, block_idx: int) -> None:
        for index, op in enumerate(self.graph.blocks[block_idx].ops):
            self.tick()
            ident = op.attrs.get("index", index)
            if op.facts.release:
                for name in op.facts.release:
                    self.memory.pop(self.slot(block_idx, name), None)
            elif op.sub_blocks:
                self.run_control(block_idx, ident, op)
            else:
                self.run_plain(block_idx, ident, op)

    def run_plain(self, block_idx: int, index: int, op: Op) -> None:
        read_slots = [self.slot(block_idx, n) for n in op.reads]
        values = [self.memory.get(s, UNDEF) for s in read_slots]
        written: Dict[Slot, str] = {}
        for name in op.writes:
            written.setdefault(self.slot(block_idx, name), name)
        pair = op.facts.inplace
        salt = self.salt(block_idx, index, op)
        for k, (name, slot) in enumerate(zip(op.reads, read_slots)):
            out = written.get(slot)
            if out is not None and out != name and (name, out) != tuple(pair or ()):
                values[k] = mix(POISON, salt, k)
        self.result.trace.append((block_idx, index, tuple(values)))
        outputs = self.compute(op, salt, values)
        for name, value in zip(op.writes, outputs):
            self.store(block_idx, name, value)

    @staticmethod
    def compute(op: Op, salt: int, values: List[int]) -> List[int]:
        n = len(op.writes)
        if op.type == "fill_constant":
            return [int(op.attrs.get("value", 0)) & MASK] * n
        if op.type == "increment" and values:
            return [(values[0] + int(op.attrs.get("step", 1))) & MASK] * n
        if op.type == "less_than" and len(values) >= 2:
            return [int(values[0] < values[1])] * n
        return [mix(salt, k, *values) for k in range(n)]

    def run_control(self, block_idx: int, index: int, op: Op) -> None:
        head = [self.load(block_idx, n) for n in (*op.reads, *op.writes)]
        self.result.trace.append((block_idx, index, tuple(head)))
        cond = op.attrs.get("cond") or (op.reads[0] if op.reads else None)
        if op.loop:
            limit = int(op.attrs.get("max_trips", DEFAULT_MAX_TRIPS))
            trips = 0
            while trips < limit and (cond is None or self.load(block_idx, cond) & 1):
                self.tick()
                for sub in op.sub_blocks:
                    self.run_block(sub)
                trips += 1
            return
        if cond is None:
            choice = 0
        else:
            choice = self.load(block_idx, cond) % (len(op.sub_blocks) + 1)
        if choice < len(op.sub_blocks):
            self.run_block(op.sub_blocks[choice])


def run(graph: Graph, renames: Optional[Renames] = None,
        inputs: Optional[Mapping[str, int]] = None, *, seed: int = 0,
        max_steps: int = DEFAULT_MAX_STEPS) -> Execution:
    """Execute ``graph`` with variables stored as ``renames`` assigns them.

    Parameters
    ----------
    graph : the program; not changed.
    renames : ``renames[block][name] = other``: in ``block`` (the block that
        declares ``name``), ``name`` is stored in ``other``'s slot.  None:
        every variable in its own slot (the original program).
    inputs : initial values by variable name, over :func:`initial_values`
        of ``graph`` and ``seed`` (each stored in the variable's own slot,
        unless the plan stores the variable in another's).
    max_steps : op executions before the run is stopped.

    Raises
    ------
    GraphError
        An op uses a name no enclosing block declares.
    RuntimeError
        More than ``max_steps`` op executions.
    """
    machine = _Machine(graph, renames or {}, max_steps)
    values = initial_values(graph, seed)
    values.update(inputs or {})
    for block_idx, var in graph.all_vars():
        if machine.renames.get(block_idx, {}).get(var.name, var.name) == var.name:
            machine.memory[(block_idx, var.name)] = int(values[var.name]) & MASK
    machine.run_block(0)
    result = machine.result
    for name in graph.fetch_names:
        result.fetched[name] = machine.load(0, name) if graph.find_var(name) else UNDEF
    for block_idx, var in graph.all_vars():
        if var.persistable:
            result.persistable.setdefault(var.name, machine.load(block_idx, var.name))
    return result


def _op_of(graph: Graph, block_idx: int, ident: int) -> Op:
    ops = graph.blocks[block_idx].ops
    for index, op in enumerate(ops):
        if op.attrs.get("index", index) == ident:
            return op
    raise KeyError(ident)  # pragma: no cover - identities come from the graph


def _by_op(trace: List[Tuple[int, int, Tuple[int, ...]]]) -> Dict[Tuple[int, int], List[Tuple[int, ...]]]:
    out: Dict[Tuple[int, int], List[Tuple[int, ...]]] = {}
    for block_idx, ident, values in trace:
        out.setdefault((block_idx, ident), []).append(values)
    return out


def _first_trace_difference(graph: Graph, a: Execution, b: Execution) -> Optional[str]:
    """The first op (in the original's order) whose reads differ between runs."""
    got = _by_op(b.trace)
    seen: Dict[Tuple[int, int], int] = {}
    for block_idx, ident, values in a.trace:
        k = seen[(block_idx, ident)] = seen.get((block_idx, ident), -1) + 1
        runs = got.get((block_idx, ident), [])
        if k < len(runs) and runs[k] == values:
            continue
        # only on a mismatch: find the op and say where
        op = _op_of(graph, block_idx, ident)
        where = f"op {ident} ({op.type}) of block {block_idx}"
        if k >= len(runs):
            return f"{where} runs {k} times after the plan, more before"
        names = (*op.reads, *op.writes) if op.sub_blocks else op.reads
        bad = [n for n, u, v in zip(names, values, runs[k]) if u != v]
        return (f"{where}, execution {k}: reads a different value of "
                f"{', '.join(map(repr, bad)) or '?'} after the plan")
    if len(a.trace) != len(b.trace):
        return f"the original runs {len(a.trace)} ops, the planned program {len(b.trace)}"
    return None


def compare(graph: Graph, renames: Renames, *, planned: Optional[Graph] = None,
            seeds: Tuple[int, ...] = (0, 1, 2),
            max_steps: int = DEFAULT_MAX_STEPS) -> Optional[Difference]:
    """Run ``graph`` as it is, and ``planned`` (default ``graph``: the same
    ops, possibly reordered) with ``renames``, for each input seed.

    Returns None when every op reads the same values in every execution and
    the fetched and final persistable values agree; otherwise the first
    :class:`Difference`.
    """
    planned = graph if planned is None else planned
    for seed in seeds:
        want = run(graph, None, seed=seed, max_steps=max_steps)
        got = run(planned, renames, seed=seed, max_steps=max_steps)
        diff = _first_trace_difference(graph, want, got)
        if diff is None and want.fetched != got.fetched:
            bad = sorted(n for n in want.fetched if want.fetched[n] != got.fetched.get(n))
            diff = f"fetched {', '.join(map(repr, bad))} differ"
        if diff is None and want.persistable != got.persistable:
            bad = sorted(n for n in want.persistable
                         if want.persistable[n] != got.persistable.get(n))
            diff = f"persistable {', '.join(map(repr, bad))} differ at the end"
        if diff is not None:
            return Difference(f"seed {seed}: {diff}")
    return None
