"""The batched run of a program lowered by hand in TFP's IR.

:func:`execute` runs a :class:`~autobatch.hand_lowered.HandLowered` program
(per-variable stacks; see that module for the semantics) for a whole batch,
on any :class:`~autobatch.backends.base.Backend`.  Each variable is one of
the backend's variable objects (``create_variable``: NULL, TEMPORARY,
REGISTER or FULL, :mod:`autobatch.backends.variables`), the program counter
included.  One step picks the lowest block index any thread is at, runs that
block on the whole batch under the mask of the threads there (writes and
pushes only touch those threads: ``update(value, mask)``, ``push(mask)``),
and moves their program counters.  The run ends when every thread has
halted.

This is the direct form TFP's own VM has; autobatch's compiled VM
(:mod:`autobatch.virtual_machine`) runs programs it lowers itself, whose
stack frames follow call depth.  Programs lowered by hand come here because
their stacks need not: a variable may be pushed twice in one block.

Eagerly (NumPy, eager TensorFlow) the loop runs in Python, block by block.
Inside a graph being built (the user's ``tf.function``, with or without
``jit_compile``, or a TF1 graph) it is the backend's ``while_loop`` around
its ``switch_case`` over the blocks, the state every variable's arrays (as
TFP's VM stages it); stack checks are then graph assertions
(``tf.errors.InvalidArgumentError`` when one fails; dropped under XLA, and
with ``TensorFlowBackend(safety_checks=False)``).

Stack depth: as in TFP, ``max_stack_depth`` counts the current value, so a
variable (or the program counter, which starts with two values: halt and the
entry) holds at most ``max_stack_depth - 1`` pushed values per thread; one
more push raises :class:`~autobatch.backends.variables.VariableStackOverflow`
(a StackOverflowError and a ValueError) naming the variable.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from autobatch.errors import ProgramError
from autobatch.hand_lowered import PC_VAR, HandLowered
from autobatch.ir import (
    BranchOp, GotoOp, IndirectGotoOp, PopOp, PrimOp, PushGotoOp, TensorType,
    VariableAllocation, as_pattern, bind_pattern, pattern_leaves, pattern_map,
    pattern_unflatten,
)

__all__ = ["execute"]


def _parts(value: Any, typ: Any) -> List[Any]:
    """The leaves of an input ``value`` of Type ``typ``: a value of a single
    tensor type is one leaf even when given as a list (TFP's tests pass
    batches as lists)."""
    if isinstance(typ.tensors, TensorType):
        return [value]
    return pattern_leaves(as_pattern(value))


def _batch_size(program: HandLowered, args: Sequence[Any], backend: Any) -> Any:
    """The leading dimension shared by the inputs that have one beyond their
    Type's shape (1 when none has): an int, or (TensorFlow, a shape not
    known while tracing) the backend's ``batch_size`` tensor."""
    sizes = set()
    unknown = None
    for var, value in zip(program.vars_in, args):
        typ = program.var_defs[var]
        for leaf, tt in zip(_parts(value, typ), typ.leaves()):
            shape = getattr(leaf, "shape", None)
            rank = getattr(shape, "rank", None) if shape is not None else None
            if shape is None:
                shape = np.shape(leaf)
            elif rank is None and not isinstance(shape, tuple):
                unknown = leaf  # a tensor of unknown rank
                continue
            if len(shape) > len(tt.shape):
                if shape[0] is None:
                    unknown = leaf
                else:
                    sizes.add(int(shape[0]))
    if len(sizes) > 1:
        raise ProgramError(f"the inputs have different batch sizes {sorted(sizes)}; give "
                           f"every input the same leading dimension")
    if sizes:
        return sizes.pop()
    return backend.batch_size(unknown) if unknown is not None else 1


class _Env:
    """The variables of one run: per name, the list of variable objects of
    its Type's leaves (the objects are NamedTuples: kept flat, never walked
    as patterns)."""

    def __init__(self, program: HandLowered, backend: Any, max_stack_depth: int,
                 batch: int) -> None:
        self.types = program.var_defs
        self.vars: Dict[str, List[Any]] = {}
        for name, typ in program.var_defs.items():
            alloc = program.var_alloc[name]
            if alloc == VariableAllocation.TEMPORARY:
                # A temporary is emptied between block runs in TFP's VM; one
                # register per thread holds the same values across them.
                alloc = VariableAllocation.REGISTER
            self.vars[name] = [backend.create_variable(name, alloc, t, max_stack_depth, batch)
                               for t in typ.leaves()]

    def read(self, name: str) -> Any:
        return pattern_unflatten(self.types[name].tensors, [v.read() for v in self._get(name)])

    def write(self, name: str, value: Any, mask: Any, push: bool) -> None:
        leaves = self._get(name)
        values = _parts(value, self.types[name])
        if len(values) != len(leaves):
            raise ProgramError(f"a value with {len(values)} part(s) is written to variable "
                               f"{name!r}, whose type {self.types[name]} has {len(leaves)}")
        self.vars[name] = [(v.push(mask) if push else v).update(x, mask)
                           for v, x in zip(leaves, values)]

    def pop(self, name: str, mask: Any) -> None:
        self.vars[name] = [v.pop(mask) for v in self._get(name)]

    @staticmethod
    def _arrays(variable: Any) -> List[str]:
        return [f for f in variable._fields if f not in ("backend", "name")]

    def dump(self) -> List[Any]:
        """Every variable's arrays, flat (a graph loop's state)."""
        return [getattr(v, f) for leaves in self.vars.values() for v in leaves
                for f in self._arrays(v)]

    def load(self, flat: Any) -> None:
        """The variables holding the arrays of ``flat`` (from :meth:`dump`)."""
        flat = iter(flat)
        for name, leaves in self.vars.items():
            self.vars[name] = [v._replace(**{f: next(flat) for f in self._arrays(v)})
                               for v in leaves]

    def _get(self, name: str) -> List[Any]:
        try:
            return self.vars[name]
        except KeyError:
            raise ProgramError(f"variable {name!r} has no Type in the program's var_defs; "
                               f"add one (instructions.single_type(dtype, shape))") from None


def _run_block(program: HandLowered, index: int, env: _Env, mask: Any, backend: Any) -> None:
    block = program.blocks[index]
    where = f"block {block.name!r}"
    for op in block.instructions:
        if isinstance(op, PopOp):
            for var in op.vars:
                env.pop(var, mask)
        elif isinstance(op, PrimOp):
            if PC_VAR in pattern_leaves(tuple(op.vars_in)) + pattern_leaves(op.vars_out):
                raise ProgramError(f"{where}: a PrimOp reads or writes the program counter "
                                   f"{PC_VAR!r}; only the jumps may")
            out = op.function(*[pattern_map(env.read, v) for v in op.vars_in])
            for var, part in bind_pattern(op.vars_out, out, where, op):
                env.write(var, part, mask, push=var not in op.skip_push_mask)
        else:
            raise ProgramError(f"{where}: {type(op).__name__} is not an instruction of a "
                               f"program lowered by hand (PrimOp and PopOp are)")
    term = block.terminator
    if isinstance(term, BranchOp):
        if term.cond == PC_VAR:
            raise ProgramError(f"{where} branches on the program counter")
        target = backend.where(env.read(term.cond),
                               np.int32(program.block_index(term.true_target)),
                               np.int32(program.block_index(term.false_target)))
        env.write(PC_VAR, target, mask, push=False)
    elif isinstance(term, GotoOp):
        env.write(PC_VAR, np.int32(program.block_index(term.target)), mask, push=False)
    elif isinstance(term, PushGotoOp):
        env.write(PC_VAR, np.int32(program.block_index(term.return_target)), mask, push=False)
        env.write(PC_VAR, np.int32(program.block_index(term.target)), mask, push=True)
    elif isinstance(term, IndirectGotoOp):
        env.pop(PC_VAR, mask)
    else:
        raise ProgramError(f"{where} ends in {term!r}, not a jump of a program lowered "
                           f"by hand (GotoOp, BranchOp, PushGotoOp, IndirectGotoOp)")


def _run_staged(program: HandLowered, env: _Env, backend: Any) -> None:
    """The loop of :func:`execute` built into the graph being traced: the
    backend's ``while_loop`` over every variable's arrays, its
    ``switch_case`` over the blocks (TFP's argument lists, see
    :mod:`autobatch.backends.tfp_api`)."""
    halt = len(program.blocks)

    def cond(*flat: Any) -> Any:
        env.load(flat)
        return backend.reduce_min(env.read(PC_VAR)) < halt

    def body(*flat: Any) -> Any:
        env.load(flat)
        pc = env.read(PC_VAR)
        index = backend.reduce_min(pc)
        mask = backend.equal(pc, index)

        def branch(i: int) -> Any:
            def run() -> Any:
                env.load(flat)
                _run_block(program, i, env, mask, backend)
                return env.dump()
            return run
        return backend.switch_case(index, [branch(i) for i in range(halt)])

    env.load(backend.while_loop(cond, body, env.dump()))


def execute(program: HandLowered, args: Sequence[Any], max_stack_depth: int,
            backend: Any) -> Any:
    """Run ``program`` over a batch: ``args`` one value per input variable,
    batch dimension first (a value without it is given to every thread).
    Returns the value of ``vars_out`` per thread, as the backend hands
    results to the user (arrays, or tensors on TensorFlow)."""
    if backend.compiles_programs:
        raise ProgramError(f"{backend!r} compiles whole programs from FunctionCallOp "
                           f"code; a program lowered by hand runs on the NumPy or "
                           f"TensorFlow backend")
    program.check_types()
    eager = backend.executes_eagerly()
    if len(args) != len(program.vars_in):
        raise ProgramError(f"the program takes {len(program.vars_in)} input(s) "
                           f"{program.vars_in}, got {len(args)}")
    batch = _batch_size(program, args, backend)
    env = _Env(program, backend, max_stack_depth, batch)
    everyone = backend.full_mask(batch)
    for var, value in zip(program.vars_in, args):
        typ = program.var_defs[var]
        parts = _parts(value, typ)
        if len(parts) != len(typ.leaves()):
            raise ProgramError(f"input {var!r} has {len(parts)} part(s), its Type {typ} "
                               f"{len(typ.leaves())}")
        if eager:  # (in a graph, update() casts and broadcasts)
            parts = [backend.as_batched(v, TensorType(t.dtype, t.shape), batch)
                     for v, t in zip(parts, typ.leaves())]
        env.write(var, pattern_unflatten(typ.tensors, parts), everyone, push=True)
    halt = len(program.blocks)
    # As TFP's VM: the counter starts two deep, halt under the entry, so an
    # IndirectGotoOp with nothing pushed halts the thread.
    env.write(PC_VAR, np.int32(halt), everyone, push=True)
    env.write(PC_VAR, np.int32(0), everyone, push=True)
    if eager:
        while True:
            pc = env.read(PC_VAR)
            index = backend.reduce_min(pc)
            if index >= halt:
                break
            _run_block(program, index, env, backend.equal(pc, index), backend)
    else:
        _run_staged(program, env, backend)
    return pattern_map(lambda name: pattern_map(backend.to_numpy, env.read(name)),
                       program.vars_out)
