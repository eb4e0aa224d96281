"""The batched program-counter VM: :func:`execute`.

Every thread (batch member) has a program counter (``pc``: the index of the
block it will run next; ``halt`` = number of blocks once it has returned from
``main``).  One VM step picks the lowest block index any thread is at, selects
the threads there, and runs that block's code for them (gather their values,
apply the primops, scatter results back), then updates their ``pc``.  The run
ends when every thread has halted.

Storage (per :class:`~autobatch.instructions.VariableAllocation`):

- NULL: none; a write is dropped, a read raises NullVariableError.
- TEMPORARY: none; the value lives in a Python local of the block's code.
- REGISTER: one array ``[batch, ...]`` per leaf of the variable's type;
  leaves related by a copy that never hold different live values share one
  (:mod:`autobatch.register_sharing`), so such a copy moves nothing.
- FULL: a register plus a stack ``[max_stack_depth + 1, batch, ...]``.

Calls: with a stacked program counter (``pc_alloc`` FULL) each thread has a
call depth ``depth`` (starting at 1: frame 0 holds ``halt``, the return
address of ``main``).  A call saves the return address and the FULL variables
to keep into frame ``depth`` and increments it; a return decrements it and
jumps to the saved address; the continuation restores the variables from the
same frame.  Each push or pop is one gather or scatter of the selected
threads: O(selected threads), never O(batch^2).  A thread whose depth would
exceed ``max_stack_depth`` pending calls raises
:class:`~autobatch.errors.StackOverflowError` naming the called function.

On a backend that allows it (NumPy), threads that have halted are dropped
from every array once at most half the threads still run, so a long tail of
slow threads does not pay for the whole batch at every step.

Block code is generated Python (see :meth:`VirtualMachine.block_source`),
straight-line calls to the :class:`~autobatch.backends.base.Backend`: each
variable is read from its register at most once per block run, and written
back only where it is live after the block (``LoweredProgram.live_out``) and
changed (a value read from the same register is not written back).  A
primop that only picks tuple components of its inputs
(:mod:`autobatch.projection`) is not called: its outputs are bound to the
inputs' values.
"""
from __future__ import annotations

import contextlib
import logging
import numbers
import re
import threading
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from autobatch.errors import NullVariableError, ProgramError, StackOverflowError
from autobatch.ir import (
    BranchOp, CopyOp, GotoOp, IndirectGotoOp, PopOp, PrimOp, Program, PushGotoOp, PushOp,
    TensorType, VariableAllocation, as_pattern, pattern_leaves, pattern_map,
    pattern_unflatten, tuple_expr,
)
from autobatch.backends.base import MAX_CHAIN
from autobatch.lowering import LoweredProgram
from autobatch.projection import apply as apply_projection, projection
from autobatch.register_sharing import register_names
from autobatch.pipeline import DEFAULT_MAX_STACK_DEPTH, argument_types, batch_size, prepare
from autobatch.arguments import lists_as_arrays

__all__ = ["VirtualMachine", "execute", "is_staging", "prepare", "argument_types", "batch_size",
           "DEFAULT_MAX_STACK_DEPTH", "MAX_CHAIN"]

log = logging.getLogger(__name__)


_PC_TYPE = TensorType(np.int32, ())
#: Backends with ``compaction``: steps between checks, and the smallest
#: batch worth compacting.
COMPACT_EVERY = 64
MIN_COMPACT = 256
NULL = VariableAllocation.NULL
TEMPORARY = VariableAllocation.TEMPORARY
FULL = VariableAllocation.FULL


_PURE = re.compile(r"^    (t\d+) = B\.(read|read_frame|part|narrow|merge)\(")


def _drop_unused(lines: List[str]) -> List[str]:
    """Remove assignments of backend reads whose result nothing uses (a
    selection part no arm reads from, say)."""
    while True:
        used = Counter(re.findall(r"\bt\d+\b", "\n".join(lines)))
        kept = [line for line in lines
                if not ((m := _PURE.match(line)) and used[m.group(1)] == 1)]
        if len(kept) == len(lines):
            return kept
        lines = kept


class _BlockCompiler:
    """Generates the Python source of one block's step function."""

    def __init__(self, vm: "VirtualMachine", index: int) -> None:
        self.vm = vm
        self.lowered = vm.lowered
        self.block = vm.lowered.blocks[index]
        self.index = index
        self.lines: List[str] = []
        self.namespace: Dict[str, Any] = {"B": vm.backend}
        self.values: Dict[str, Any] = {}   # var -> pattern of local names
        self.in_frame: set = set()         # popped, not yet gathered, unchanged
        self.dirty: set = set()
        #: local name -> the register key it was read from under ``sel``
        #: (unchanged: writing it back there would change nothing)
        self.clean: Dict[str, str] = {}
        self.count = 0
        self.sel = "sel"                   # the selection the code runs under
        self.arm: Optional[Tuple[str, bool, Dict[str, Any]]] = None  # (split, side, outer values)

    # -- helpers --------------------------------------------------------------
    def local(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def constant(self, value: Any) -> str:
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def alloc(self, var: str) -> VariableAllocation:
        return self.lowered.var_alloc[var]

    def leaf_paths(self, var: str) -> List[Tuple[int, ...]]:
        """Index paths of the leaves of ``var``'s type (``[()]`` for a tensor)."""
        def paths(pattern: Any, prefix: Tuple[int, ...]) -> List[Tuple[int, ...]]:
            if isinstance(pattern, tuple):
                out = []
                for i, part in enumerate(pattern):
                    out.extend(paths(part, prefix + (i,)))
                return out
            return [prefix]
        return paths(self.lowered.var_types[var].tensors, ())

    def keyed(self, var: str) -> List[str]:
        return [repr(k) for k in self.vm.register_keys[var]]

    def skeleton(self, var: str, leaves: Sequence[str]) -> Any:
        return pattern_unflatten(self.lowered.var_types[var].tensors, list(leaves))

    def as_expr(self, pattern: Any) -> str:
        if isinstance(pattern, tuple):
            return tuple_expr(pattern, [self.as_expr(p) for p in pattern], self.constant)
        return pattern

    # -- reads and writes ---------------------------------------------------------
    def read(self, var: str) -> Any:
        """A pattern of local names holding ``var``'s value for the selection."""
        if var in self.values:
            return self.values[var]
        alloc = self.alloc(var)
        if self.arm is not None and var in self.arm[2]:
            split, side, outer = self.arm
            leaves = []
            for leaf in pattern_leaves(outer[var]):
                name = self.local()
                self.emit(f"{name} = B.narrow({leaf}, {split}, {side})")
                leaves.append(name)
        elif var in self.in_frame:
            leaves = []
            for key in self.vm.stack_keys[var]:
                name = self.local()
                self.emit(f"{name} = B.read_frame(state[{key!r}], sel, d)")
                leaves.append(name)
            self.in_frame.discard(var)
        elif alloc == NULL:
            self.emit(f"{self.constant(self.vm.null_reader(var))}()")
            leaves = ["None"] * len(self.leaf_paths(var))
        elif alloc == TEMPORARY:
            raise ProgramError(f"block {self.block.name!r} reads TEMPORARY variable "
                               f"{var!r} before writing it; the allocation is wrong")
        else:
            leaves = []
            for key in self.keyed(var):
                name = self.local()
                self.emit(f"{name} = B.read(state[{key}], {self.sel})")
                if self.sel == "sel":
                    self.clean[name] = key
                leaves.append(name)
        value = self.skeleton(var, leaves)
        self.values[var] = value
        return value

    def assign(self, var: str, value: Any) -> None:
        """Bind ``var`` to a pattern of local names (compile time)."""
        self.in_frame.discard(var)
        if self.alloc(var) == NULL:
            self.values.pop(var, None)
            return
        self.values[var] = value
        self.dirty.add(var)

    def bind_static(self, pattern: Any, value: Any) -> None:
        if isinstance(pattern, tuple):
            for part, sub in zip(pattern, value):
                self.bind_static(part, sub)
        else:
            self.assign(pattern, value)

    def bind_runtime(self, pattern: Any, expr: str) -> None:
        """Bind a pattern of variables to the runtime value ``expr``."""
        if isinstance(pattern, tuple):
            for i, part in enumerate(pattern):
                self.bind_runtime(part, f"{expr}[{i}]")
            return
        if self.alloc(pattern) == NULL:
            return
        leaves = []
        for path in self.leaf_paths(pattern):
            if path:
                name = self.local()
                self.emit(f"{name} = {expr}{''.join(f'[{i}]' for i in path)}")
                leaves.append(name)
            else:
                leaves.append(expr)
        self.assign(pattern, self.skeleton(pattern, leaves))

    # -- code -----------------------------------------------------------------------
    def depth(self) -> str:
        """The local holding the selected threads' call depth (read once)."""
        if not self.have_depth:
            self.emit("d = B.read(state['depth'], sel)")
            self.have_depth = True
        return "d"

    def next_in_chain(self, term: Any, chain: List[int]) -> Optional[int]:
        """The block to run right after this one in the same step, if any.

        The scheduler runs the lowest block index any thread is at, so no
        thread is at a block below ``self.index``.  An unconditional jump
        (goto, or the jump of a call) to such a block would be the next step,
        for exactly these threads: run it now instead (jump threading).
        """
        if not isinstance(term, (GotoOp, PushGotoOp)):
            return None
        target = self.vm.index[term.target]
        if target < self.index and target not in chain and len(chain) < MAX_CHAIN:
            return target
        return None

    def compile(self) -> Tuple[str, Dict[str, Any]]:
        """The source of ``block_<index>(state) -> state`` and its namespace.

        One step runs a *chain*: the scheduled block, then (jump threading)
        blocks it jumps to unconditionally that no other thread can be at,
        and whole if/else regions (:meth:`diamond`)."""
        self.have_depth = False
        self.depth_changed = False
        #: Whether the step computes on or moves per-thread vectors or
        #: matrices (a backend may then pack the selected threads first).
        self.vector_work = False
        self.emit(f"sel = B.select(state['pc'], {self.index})")
        chain = [self.index]
        while True:
            block = self.lowered.blocks[chain[-1]]
            self.instructions(block)
            term = block.terminator
            diamond = self.diamond(chain) if isinstance(term, BranchOp) else None
            if diamond is not None:
                self.run_arms(block, *diamond)
                chain.extend(i for i in diamond if i is not None)
                continue
            nxt = self.next_in_chain(term, chain)
            if nxt is None:
                self.write_back(self.lowered.live_out.get(block.name, frozenset()))
                self.terminator(block)
                break
            if isinstance(term, PushGotoOp):
                self.call_frame(block)
                self.emit("d = d + 1")
                self.depth_changed = True
                self.settle_frame(self.lowered.live_out.get(block.name, frozenset()))
            chain.append(nxt)
        self.emit("return state")
        self.chain = chain
        name = f"block_{self.index}"
        source = f"def {name}(state):\n" + "\n".join(_drop_unused(self.lines)) + "\n"
        return source, self.namespace

    def diamond(self, chain: List[int]) -> Optional[Tuple[Optional[int], Optional[int], int]]:
        """``(true arm, false arm, join)`` where the branch ending the last
        block of ``chain`` opens an if/else whose arms are straight-line
        blocks that only this branch enters and that both go to one join
        block only they (and the branch) enter; an absent arm (an ``if``
        without ``else``) is None.  Such a region runs in this step: each arm
        on its part of the selection, then the join on all of it."""
        vm = self.vm
        if len(chain) + 3 > MAX_CHAIN:
            return None
        here = chain[-1]
        term = self.lowered.blocks[here].terminator
        t, f = vm.index[term.true_target], vm.index[term.false_target]

        def arm(i: int) -> Optional[int]:
            """The block ``i`` jumps to, if ``i`` can be an arm."""
            block = self.lowered.blocks[i]
            if (vm.predecessors[i] != {here} or i in chain
                    or not isinstance(block.terminator, GotoOp)
                    or any(isinstance(op, (PushOp, PopOp)) for op in block.instructions)):
                return None
            return vm.index[block.terminator.target]

        join_t, join_f = arm(t), arm(f)
        if join_t is not None and join_t == join_f:
            shape = (t, f, join_t)
        elif join_t is not None and join_t == f:
            shape = (t, None, f)
        elif join_f is not None and join_f == t:
            shape = (None, f, t)
        else:
            return None
        join = shape[2]
        if join in chain or not vm.predecessors[join] <= {here, t, f}:
            return None
        return shape

    def run_arms(self, block: Any, true_arm: Optional[int], false_arm: Optional[int],
                 join: int) -> None:
        """Code for an if/else region found by :meth:`diamond`."""
        live_after = self.lowered.live_out.get(block.name, frozenset())
        for var in sorted(self.in_frame):  # gather what the arms may need
            if var in live_after:
                self.read(var)
            else:
                self.dirty.discard(var)
        self.in_frame.clear()
        cond = self.as_expr(self.read(block.terminator.cond))
        split = self.local()
        self.emit(f"{split} = B.split(sel, {cond})")
        outer = self.values
        results: Dict[bool, Dict[str, Any]] = {True: {}, False: {}}
        written: Dict[bool, set] = {True: set(), False: set()}
        parts: Dict[bool, str] = {}
        live_join: frozenset = frozenset()  # live on entry to the join block
        for side, index in ((True, true_arm), (False, false_arm)):
            parts[side] = part = self.local()
            self.emit(f"{part} = B.part({split}, {side})")
            if index is None:
                continue
            arm_block = self.lowered.blocks[index]
            live_join = live_join | self.lowered.live_out.get(arm_block.name, frozenset())
            self.values, self.sel, self.arm = {}, part, (split, side, outer)
            dirty_before = set(self.dirty)
            self.dirty = set()
            self.instructions(arm_block)
            written[side] = self.dirty
            results[side] = self.values
            self.values, self.sel, self.arm = outer, "sel", None
            self.dirty = dirty_before
        for var in sorted(written[True] | written[False]):
            if var not in live_join:
                self.values.pop(var, None)  # dead after the region
                self.dirty.discard(var)
                continue
            sides = {}
            for side in (True, False):
                if var in written[side]:
                    sides[side] = pattern_leaves(results[side][var])
                    continue
                self.values, self.sel = results[side], parts[side]
                self.arm = (split, side, outer)
                sides[side] = pattern_leaves(self.read(var))
                self.values, self.sel, self.arm = outer, "sel", None
            leaves = []
            for a, b, typ in zip(sides[True], sides[False],
                                 self.lowered.var_types[var].leaves()):
                name = self.local()
                self.emit(f"{name} = B.merge({split}, {a}, {b}, {self.constant(typ)})")
                leaves.append(name)
            self.assign(var, self.skeleton(var, leaves))

    def instructions(self, block: Any) -> None:
        vm = self.vm
        if isinstance(block.terminator, PushGotoOp) and vm.pc_full:
            error = self.constant(vm.overflow_error(self.lowered.callee[block.name]))
            self.emit(f"B.check({self.depth()} <= {vm.max_stack_depth}, sel, {error})")
        for op in block.instructions:
            if not self.vector_work:
                self.vector_work = self.touches_vectors(op)
            if isinstance(op, PrimOp) and self.project(op):
                continue
            if isinstance(op, PrimOp):
                fn = self.constant(op.function)
                args = ", ".join(self.as_expr(self.read(v)) for v in op.vars_in)
                out = self.local()
                self.emit(f"{out} = {fn}({args})")
                self.bind_runtime(op.vars_out, out)
            elif isinstance(op, CopyOp):
                value = pattern_map(self.read, op.vars_in)
                self.bind_static(op.vars_out, value)
            elif isinstance(op, PushOp):
                for var in op.vars:
                    if var in self.in_frame:  # frame slot already holds it
                        continue
                    leaves = pattern_leaves(self.read(var))
                    d = self.depth()
                    for key, leaf in zip(vm.stack_keys[var], leaves):
                        self.emit(f"state[{key!r}] = B.write_frame(state[{key!r}], sel, {d}, "
                                  f"{leaf})")
            elif isinstance(op, PopOp):
                self.depth()
                for var in op.vars:
                    self.values.pop(var, None)
                    self.in_frame.add(var)
                    self.dirty.add(var)
            else:
                raise ProgramError(f"block {block.name!r}: the VM cannot run "
                                   f"{type(op).__name__}; lower the program first")

    def project(self, op: PrimOp) -> bool:
        """Bind the outputs of a primop that only picks tuple components of
        its inputs (:mod:`autobatch.projection`) to those inputs' locals,
        without calling it; False (nothing bound) for any other primop."""
        recipe = projection(op.function, len(op.vars_in))
        if recipe is None:
            return False
        value = apply_projection(recipe, [self.read(v) for v in op.vars_in])
        if value is None or not self.fits(op.vars_out, value):
            return False
        self.bind_picked(op.vars_out, value)
        return True

    def fits(self, pattern: Any, value: Any) -> bool:
        """Whether ``value`` (a pattern of locals) has the structure of the
        output ``pattern`` and its variables' types."""
        if isinstance(pattern, tuple):
            return isinstance(value, tuple) and len(value) == len(pattern) and all(
                self.fits(p, v) for p, v in zip(pattern, value))

        def same_shape(tensors: Any, v: Any) -> bool:
            if isinstance(tensors, tuple):
                return isinstance(v, tuple) and len(v) == len(tensors) and all(
                    same_shape(t, w) for t, w in zip(tensors, v))
            return not isinstance(v, tuple)
        return same_shape(self.lowered.var_types[pattern].tensors, value)

    def bind_picked(self, pattern: Any, value: Any) -> None:
        if isinstance(pattern, tuple):
            for part, sub in zip(pattern, value):
                self.bind_picked(part, sub)
        else:
            self.assign(pattern, self.skeleton(pattern, pattern_leaves(value)))

    def touches_vectors(self, op: Any) -> bool:
        """Whether ``op`` reads or writes a variable with a non-scalar leaf."""
        if isinstance(op, (PushOp, PopOp)):
            names = list(op.vars)
        else:
            names = list(pattern_leaves(op.vars_in)) + list(pattern_leaves(op.vars_out))
        types = self.lowered.var_types
        return any(leaf.shape for name in names if isinstance(name, str) and name in types
                   for leaf in types[name].leaves())

    def settle_frame(self, live: frozenset) -> None:
        """Before the call depth changes: gather popped variables still needed."""
        for var in sorted(self.in_frame):
            if var in live:
                self.read(var)
            else:
                self.dirty.discard(var)
        self.in_frame.clear()

    def write_back(self, live: frozenset) -> None:
        """Store the variables written in this step that are live after it."""
        for var in sorted(self.dirty & live):
            if self.alloc(var) == TEMPORARY:
                raise ProgramError(f"TEMPORARY variable {var!r} is live after block "
                                   f"{self.block.name!r}; the allocation is wrong")
            leaves = pattern_leaves(self.read(var))
            for key, leaf in zip(self.keyed(var), leaves):
                if self.clean.get(leaf) == key:
                    continue  # read from this very register, unchanged
                self.emit(f"state[{key}] = B.write(state[{key}], sel, {leaf})")

    def call_frame(self, block: Any) -> None:
        """Save the return address of the call that ends ``block``."""
        ret = self.vm.index[block.terminator.return_target]
        self.emit(f"state['pc@stack'] = B.write_frame(state['pc@stack'], sel, "
                  f"{self.depth()}, {ret})")

    def terminator(self, block: Any) -> None:
        term = block.terminator
        index = self.vm.index
        if isinstance(term, (GotoOp, BranchOp)) and self.depth_changed:
            self.emit("state['depth'] = B.write(state['depth'], sel, d)")
        if isinstance(term, GotoOp):
            target = index[term.target]
            if target != self.index:
                self.emit(f"state['pc'] = B.write(state['pc'], sel, {target})")
        elif isinstance(term, BranchOp):
            cond = self.as_expr(self.read(term.cond))
            self.emit(f"state['pc'] = B.write(state['pc'], sel, B.where({cond}, "
                      f"{index[term.true_target]}, {index[term.false_target]}))")
        elif isinstance(term, PushGotoOp):
            self.call_frame(block)
            self.emit("state['depth'] = B.write(state['depth'], sel, d + 1)")
            self.emit(f"state['pc'] = B.write(state['pc'], sel, {index[term.target]})")
        elif isinstance(term, IndirectGotoOp):
            if self.vm.pc_full:
                self.emit(f"d1 = {self.depth()} - 1")
                self.emit("state['depth'] = B.write(state['depth'], sel, d1)")
                self.emit("state['pc'] = B.write(state['pc'], sel, "
                          "B.read_frame(state['pc@stack'], sel, d1))")
            else:
                self.emit(f"state['pc'] = B.write(state['pc'], sel, {self.vm.halt})")
        else:
            raise ProgramError(f"block {block.name!r}: the VM cannot run "
                               f"{type(term).__name__}; lower the program first")


class VirtualMachine:
    """Runs one :class:`~autobatch.lowering.LoweredProgram` on a backend.

    Parameters
    ----------
    lowered : the program (see :func:`prepare`).
    backend : a :class:`~autobatch.backends.base.Backend`.
    max_stack_depth : the most calls pending at once per thread.
    block_code_cache : optional dict shared across VMs; compiled block
        functions are kept there under ``(lowered, block index,
        max_stack_depth, backend)``.

    After :meth:`run`, ``steps`` is the number of blocks run (VM steps).
    """

    def __init__(self, lowered: LoweredProgram, backend: Any = None,
                 max_stack_depth: int = DEFAULT_MAX_STACK_DEPTH,
                 block_code_cache: Optional[dict] = None) -> None:
        if backend is None:
            from autobatch.backends.numpy import NumpyBackend
            backend = NumpyBackend()
        if not isinstance(max_stack_depth, (int, np.integer)) or max_stack_depth < 1:
            raise ValueError(f"max_stack_depth must be a positive int, got {max_stack_depth!r}")
        self.lowered = lowered
        self.backend = backend
        self.max_stack_depth = int(max_stack_depth)
        self.index = lowered.block_index()
        self.halt = len(lowered.blocks)
        self.pc_full = lowered.pc_alloc == FULL
        #: storage key of each leaf of a REGISTER or FULL variable; REGISTER
        #: leaves that never hold different live values share one
        #: (:mod:`autobatch.register_sharing`)
        self.register_keys: Dict[str, List[str]] = register_names(lowered)
        self.stack_keys: Dict[str, List[str]] = {}
        for var in sorted(lowered.var_types):
            alloc = lowered.var_alloc[var]
            n = len(lowered.var_types[var].leaves())
            if alloc == FULL:
                self.stack_keys[var] = [f"{var}#{i}@stack" for i in range(n)]
        #: block index -> indices of the blocks that may run right before it
        #: (-1: a return lands there).
        self.predecessors: Dict[int, set] = {i: set() for i in range(self.halt)}
        for i, block in enumerate(lowered.blocks):
            term = block.terminator
            for target in term.targets:
                self.predecessors[self.index[target]].add(i)
            if isinstance(term, PushGotoOp):
                self.predecessors[self.index[term.return_target]].add(-1)
        self.predecessors[self.index[lowered.entry]].add(-1)
        self.steps = 0
        self._sources: Dict[int, str] = {}
        self.block_functions: List[Callable[[dict], dict]] = [
            self._block_function(i, block_code_cache) for i in range(self.halt)]

    # -- code ------------------------------------------------------------------------
    def block_source(self, index: int) -> str:
        """The generated Python source of block ``index``'s step function."""
        if index not in self._sources:
            self._sources[index] = _BlockCompiler(self, index).compile()[0]
        return self._sources[index]

    def _block_function(self, index: int, cache: Optional[dict]) -> Callable[[dict], dict]:
        key = (self.lowered, index, self.max_stack_depth, self.backend)
        if cache is not None and key in cache:
            return cache[key]
        compiler = _BlockCompiler(self, index)
        source, namespace = compiler.compile()
        self._sources[index] = source
        code = compile(source, f"<autobatch block {index}: "
                               f"{self.lowered.blocks[index].name}>", "exec")
        exec(code, namespace)
        step = namespace[f"block_{index}"]
        step.vector_work = compiler.vector_work
        function = self.backend.wrap_block(step, self.lowered.blocks[index].name)
        if cache is not None:
            cache[key] = function
        return function

    def null_reader(self, var: str) -> Callable[[], None]:
        def read_null() -> None:
            raise NullVariableError(f"variable {var!r} is allocated NULL (holds nothing) "
                                    f"but is read; re-run allocation_strategy.optimize "
                                    f"instead of editing var_alloc by hand")
        return read_null

    def overflow_error(self, function: str) -> Callable[[], Exception]:
        depth = self.max_stack_depth
        return lambda: StackOverflowError(function, depth)

    # -- running -----------------------------------------------------------------------
    def initial_state(self, args: Sequence[Any]) -> Tuple[dict, int]:
        """Storage for a run over ``args``: ``(state, batch size)``."""
        lowered, backend = self.lowered, self.backend
        if len(args) != len(lowered.inputs):
            raise ProgramError(f"the program takes {len(lowered.inputs)} argument(s) "
                               f"{lowered.inputs}, got {len(args)}")
        batch = batch_size(args, [lowered.var_types[v] for v in lowered.inputs], backend)
        leaves_per_input = [pattern_leaves(as_pattern(a)) for a in args]
        frames = self.max_stack_depth + 1
        state: Dict[str, Any] = {}
        for var, leaves in zip(lowered.inputs, leaves_per_input):
            if var in self.register_keys:
                for key, leaf, typ in zip(self.register_keys[var], leaves,
                                          lowered.var_types[var].leaves()):
                    state[key] = backend.as_batched(leaf, typ, batch)
        for var, keys in self.register_keys.items():
            for key, typ in zip(keys, lowered.var_types[var].leaves()):
                if key not in state:  # not an input's, nor filled for another variable
                    state[key] = backend.fill(typ, batch)
        for var, keys in self.stack_keys.items():
            for key, typ in zip(keys, lowered.var_types[var].leaves()):
                state[key] = backend.stack(typ, batch, frames)
        main_entry = self.index[lowered.entry]
        state["pc"] = backend.fill(_PC_TYPE, batch, main_entry)
        if self.pc_full:
            state["depth"] = backend.fill(_PC_TYPE, batch, 1)
            state["pc@stack"] = backend.stack(_PC_TYPE, batch, frames, self.halt)
        state["steps"] = 0
        return state, batch

    def run(self, args: Sequence[Any]) -> Any:
        """Run every thread to completion; returns main's value per thread
        (arrays with a leading batch dimension; tuples for tuple values)."""
        backend = self.backend
        state, batch = self.initial_state(args)
        out_keys = self.register_keys[self.lowered.output]
        # A batch size not known while tracing (a tensor) is taken as nonzero.
        static = isinstance(batch, numbers.Integral)
        running = batch > 0 if static else True
        phases = backend.phase_sizes(batch, self.lowered) if static and batch else []
        if running and backend.compaction:
            state, outputs = self._run_compacting(state)
        elif phases:
            state, outputs = self._run_phases(state, batch, phases)
        else:
            if running:
                state = self._run_loop(state)
            outputs = [state[k] for k in out_keys]
        self.steps = state["steps"]
        leaves = [backend.to_numpy(v) for v in outputs]
        return pattern_unflatten(self.lowered.var_types[self.lowered.output].tensors, leaves)

    def _run_loop(self, state: dict, max_steps: Optional[int] = None,
                  running_above: Optional[int] = None) -> dict:
        """Steps until every thread halted (or ``max_steps`` more steps, or
        at most ``running_above`` threads still run)."""
        backend = self.backend
        blocks = self.block_functions
        halt = self.halt
        stop = None if max_steps is None else state["steps"] + max_steps

        def cond(s: dict) -> Any:
            if stop is not None and s["steps"] >= stop:
                return False
            if running_above is not None:
                return backend.more_running(s["next"] < halt, s["pc"], halt, running_above)
            return s["next"] < halt

        def body(s: dict) -> dict:
            s = backend.switch_case(s["next"], blocks, s)
            s["next"] = backend.reduce_min(s["pc"])
            s["steps"] = s["steps"] + 1
            return s

        state["next"] = backend.reduce_min(state["pc"])
        return backend.while_loop(cond, body, state)

    def _run_phases(self, state: dict, batch: int,
                    sizes: Sequence[int]) -> Tuple[dict, List[Any]]:
        """:meth:`_run_loop` for backends of static shapes (XLA) that offer
        ``phase_sizes``: run until at most ``sizes[0]`` threads still run,
        pack the running ones into arrays of that many rows, go on, and so
        on; the last phase runs to the end.  Each step's whole-batch work
        then shrinks with the threads still running.  Every thread's result
        is written back to its original row after each phase (a halted
        thread's is final)."""
        backend, halt = self.backend, self.halt
        out_keys = self.register_keys[self.lowered.output]
        results: Optional[List[Any]] = None
        origin = None  # original row of each row (None: the identity)
        for size in sizes:
            state = self._run_loop(state, running_above=size)
            rows, valid = backend.pack_running(state["pc"], halt, size)
            if origin is None:
                results = [state[k] for k in out_keys]
                origin = backend.inert_rows(rows, valid, batch)
            else:
                results = [backend.put_rows(r, origin, state[k])
                           for r, k in zip(results, out_keys)]
                origin = backend.inert_rows(backend.take_rows(origin, rows), valid, batch)
            for key, value in list(state.items()):
                if key not in ("next", "steps") and backend.is_storage(value):
                    state[key] = backend.take_rows(value, rows)
            state["pc"] = backend.where(valid, state["pc"], halt)
        state = self._run_loop(state)
        return state, [backend.put_rows(r, origin, state[k]) for r, k in zip(results, out_keys)]

    def _run_compacting(self, state: dict) -> Tuple[dict, List[Any]]:
        """:meth:`_run_loop` for backends with ``compaction``: every
        ``COMPACT_EVERY`` steps, once at most half the threads still run,
        drop the halted ones from every array, so that each step's selection
        and scheduling passes cost O(running threads), not O(batch).  Halted
        threads' results are kept in batch order first."""
        backend, halt = self.backend, self.halt
        out_keys = self.register_keys[self.lowered.output]
        out_types = self.lowered.var_types[self.lowered.output].leaves()
        stacks = {k for keys in self.stack_keys.values() for k in keys} | {"pc@stack"}
        rows = None      # original index of each row kept (None: all, in order)
        results = None   # the output in original order, for the halted threads
        while True:
            state = self._run_loop(state, COMPACT_EVERY)
            if not state["next"] < halt:
                break
            running, count = backend.running_threads(state["pc"], halt)
            size = backend.size(state["pc"])
            if count * 2 > size or size < MIN_COMPACT:
                continue
            if results is None:
                results = [backend.as_batched(state[k], t, size)
                           for k, t in zip(out_keys, out_types)]
            else:
                results = [backend.write(r, rows, state[k]) for r, k in zip(results, out_keys)]
            rows = running if rows is None else backend.read(rows, running)
            for key, value in list(state.items()):
                if key in stacks:
                    state[key] = backend.take_threads(value, running, axis=1)
                elif key not in ("next", "steps"):
                    state[key] = backend.take_threads(value, running, axis=0)
        if results is None:
            return state, [state[k] for k in out_keys]
        return state, [backend.write(r, rows, state[k]) for r, k in zip(results, out_keys)]


def _as_declared(program: Any, args: Sequence[Any]) -> List[Any]:
    """``args`` with each list given for a parameter whose type is known to be
    a single tensor (declared in a TFP-style ``var_defs``, or a lowered
    program's input) made an array of that dtype (TFP's tests pass batches
    as lists; a list is otherwise a tuple value)."""
    if isinstance(program, LoweredProgram):
        types = [program.var_types.get(v) for v in program.inputs]
    else:
        declared = program.given_var_defs or {}
        types = [declared.get(p) for p in program.main_function().params]
    return lists_as_arrays(args, types)


def _settings(settings: Sequence[Any], backend: Any, max_stack_depth: Optional[int],
              block_code_cache: Optional[dict]) -> Tuple[Any, int, Optional[dict]]:
    """:func:`execute`'s positional settings sorted out: an int is the depth,
    a dict the block code cache, anything else the backend."""
    if len(settings) > 3:
        raise TypeError(f"execute takes at most 3 settings after args (backend, "
                        f"max_stack_depth, block_code_cache), got {len(settings)}")
    for value in settings:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            slot = "max_stack_depth"
        elif isinstance(value, dict) or value is None:
            slot = "block_code_cache" if isinstance(value, dict) else None
        else:
            slot = "backend"
        if slot is None:
            continue
        given = {"backend": backend, "max_stack_depth": max_stack_depth,
                 "block_code_cache": block_code_cache}[slot]
        if given is not None:
            raise TypeError(f"execute got {slot} twice (by position and by keyword)")
        if slot == "backend":
            backend = value
        elif slot == "max_stack_depth":
            max_stack_depth = int(value)
        else:
            block_code_cache = value
    if max_stack_depth is None:
        max_stack_depth = DEFAULT_MAX_STACK_DEPTH
    return backend, max_stack_depth, block_code_cache


def execute(program: Any, args: Sequence[Any], *settings: Any, backend: Any = None,
            max_stack_depth: Optional[int] = None,
            block_code_cache: Optional[dict] = None) -> Any:
    """Run ``program`` for a batch of inputs.

    Parameters
    ----------
    program : a :class:`~autobatch.instructions.Program` (typed, allocated and
        lowered here for the types of ``args``) or a
        :class:`~autobatch.lowering.LoweredProgram`.
    args : one value per parameter of main, each with a leading batch
        dimension (all the same size); a leaf without it, or with size 1, is
        broadcast to every thread.  Tuples for tuple-typed parameters.
    backend : default :func:`autobatch.backends.default.default_backend` (TensorFlow's
        where an argument is a TensorFlow tensor, else NumPy's).
    max_stack_depth : the most calls pending at once per thread.
    block_code_cache : see :class:`VirtualMachine`.

    Given by position after ``args``, ``backend`` and ``max_stack_depth``
    may come in either order (an int is the depth), then
    ``block_code_cache``: autobatch's ``execute(program, args, backend,
    max_stack_depth)`` and TFP's ``execute(program, args, max_stack_depth,
    backend)`` or ``execute(program, args, 15, backend=b)`` all work.
    A program lowered by hand in TFP's IR (``program.lowered_by_hand``:
    push-goto, indirect goto, pops) runs with TFP's per-variable stacks
    (:mod:`autobatch.stack_vm`).

    Returns
    -------
    main's return value per thread, batch dimension first.

    Raises
    ------
    StackOverflowError : a thread needs more than ``max_stack_depth`` pending calls.
    """
    backend, max_stack_depth, block_code_cache = _settings(
        settings, backend, max_stack_depth, block_code_cache)
    if backend is None:
        from autobatch.backends.default import default_backend
        backend = default_backend(args)
    if isinstance(program, Program) and program.lowered_by_hand is not None:
        from autobatch import stack_vm
        with _vm_staging():
            return stack_vm.execute(program.lowered_by_hand, args, max_stack_depth, backend)
    args = _as_declared(program, args)
    if isinstance(program, Program):
        program = prepare(program, argument_types(args, backend), backend)
    vm = VirtualMachine(program, backend, max_stack_depth, block_code_cache)
    with _vm_staging():
        return backend.run_vm(vm, args, block_code_cache)


_staging = threading.local()


def is_staging() -> bool:
    """TFP's ``virtual_machine.is_staging``: True when called in the dynamic
    scope of the VM running (or staging, on a deferred backend such as
    TensorFlow's graph mode) a program in :func:`execute`, e.g. from a
    primitive's function; False elsewhere (type inference, dry runs, plain
    Python).  Per thread."""
    return getattr(_staging, "depth", 0) > 0


@contextlib.contextmanager
def _vm_staging() -> Iterator[None]:
    _staging.depth = getattr(_staging, "depth", 0) + 1
    try:
        yield
    finally:
        _staging.depth -= 1


def select_block_priority(program: Program) -> Program:
    """TFP's ``select_block_priority``: ``program`` (one graph, no functions
    besides the entry: TFP's form) with its blocks reordered so that those
    running no primitive or call come first after the entry block (which
    stays first); the order is otherwise kept.  The VM runs the lowest
    block first, so this lets threads gather before user code runs.
    ValueError for a program with functions."""
    from autobatch.ir import ControlFlowGraph, FunctionCallOp
    if program.lowered_by_hand is None and len(program.functions) > 1:
        raise ValueError("select_block_priority takes a program of one graph (TFP: no "
                         "functions); lower its calls first")
    blocks = list(program.graph.blocks)

    def runs_user_code(block: Any) -> int:
        return int(any(isinstance(op, (PrimOp, FunctionCallOp)) for op in block.instructions))
    ordered = blocks[:1] + sorted(blocks[1:], key=runs_user_code)
    return Program(ControlFlowGraph(ordered), [], dict(program.var_defs), program.vars_in,
                   program.vars_out, dict(program.var_alloc))
