"""Programs lowered by hand in TFP's IR, and what they mean.

TFP's ``auto_batching`` lets a user write a program already in its lowered
form: one control-flow graph, no functions, explicit stack traffic.  Its
semantics differ from autobatch's own IR (where variables are local to a
function and calls are :class:`~autobatch.instructions.FunctionCallOp`):

- every variable has its own stack: a :class:`~autobatch.instructions.PrimOp`
  *pushes* each variable it writes (the old value is saved, the new one is
  the top), unless the variable is in the op's ``skip_push_mask`` (then
  the top is overwritten); :class:`~autobatch.instructions.PopOp` restores
  the saved value;
- the program counter is the variable :data:`PC_VAR`
  (``"__program_counter__"``, TFP's ``instructions.pc_var``):
  :class:`~autobatch.instructions.PushGotoOp` ``(return_block, block)``
  pushes ``return_block`` on it and jumps to ``block``;
  :class:`~autobatch.instructions.IndirectGotoOp` pops it and jumps there;
  a jump to ``None`` (``halt_op()``, ``halt()``) ends the thread, and so
  does an ``IndirectGotoOp`` with nothing pushed;
- ``var_defs`` gives every variable's :class:`~autobatch.instructions.Type`
  (needed: the batched run allocates stacks before it starts), ``var_alloc``
  its allocation (default FULL: a stack each).

:class:`HandLowered` holds such a program (a
:class:`~autobatch.instructions.Program` built TFP's way from a graph with
a ``PushGotoOp``, ``IndirectGotoOp`` or ``PopOp`` and no functions keeps
one in ``program.lowered_by_hand``); :func:`interpret` runs it for one
example (the definition); :mod:`autobatch.stack_vm` runs it batched.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from autobatch.errors import ProgramError
from autobatch.ir import (
    PC_VAR, BranchOp, GotoOp, HandLowered, IndirectGotoOp, PopOp, PrimOp, PushGotoOp,
    bind_pattern, is_hand_lowered, pattern_leaves, pattern_map,
)

__all__ = ["PC_VAR", "HandLowered", "is_hand_lowered", "interpret"]


class _Stacks:
    """One example's variables: a list of values per variable, the last the
    current one (TFP's per-variable stacks)."""

    def __init__(self) -> None:
        self.stacks: Dict[str, List[Any]] = {}

    def read(self, var: str) -> Any:
        stack = self.stacks.get(var)
        if not stack:
            raise ProgramError(f"variable {var!r} is read before it is written (or "
                               f"after its last value was popped)")
        return stack[-1]

    def write(self, var: str, value: Any, push: bool) -> None:
        stack = self.stacks.setdefault(var, [])
        if push or not stack:
            stack.append(value)
        else:
            stack[-1] = value

    def pop(self, var: str) -> None:
        stack = self.stacks.get(var)
        if not stack:
            raise ProgramError(f"pop of variable {var!r}, which holds no value")
        stack.pop()


def interpret(program: HandLowered, *inputs: Any) -> Any:
    """Run ``program`` for one example (values without a batch dimension):
    the definition the batched run (:mod:`autobatch.stack_vm`) agrees with.
    Returns the values of ``vars_out`` when the thread halts."""
    if len(inputs) != len(program.vars_in):
        raise ProgramError(f"the program takes {len(program.vars_in)} input(s) "
                           f"{program.vars_in}, got {len(inputs)}")
    env = _Stacks()
    for var, value in zip(program.vars_in, inputs):
        env.write(var, value, push=True)
    returns: List[int] = []
    halt = len(program.blocks)
    pc = 0
    while pc != halt:
        block = program.blocks[pc]
        where = f"block {block.name!r}"
        for op in block.instructions:
            if isinstance(op, PopOp):
                for var in op.vars:
                    env.pop(var)
            elif isinstance(op, PrimOp):
                _no_pc(op.vars_in, op.vars_out, where)
                args = [pattern_map(env.read, v) for v in op.vars_in]
                out = op.function(*args)
                for var, part in bind_pattern(op.vars_out, out, where, op):
                    env.write(var, part, push=var not in op.skip_push_mask)
            else:
                raise ProgramError(f"{where}: {type(op).__name__} is not an instruction of "
                                   f"a program lowered by hand (PrimOp and PopOp are)")
        term = block.terminator
        if isinstance(term, BranchOp):
            if term.cond == PC_VAR:
                raise ProgramError(f"{where} branches on the program counter")
            pc = program.block_index(term.true_target if _truth(env.read(term.cond), where)
                                     else term.false_target)
        elif isinstance(term, GotoOp):
            pc = program.block_index(term.target)
        elif isinstance(term, PushGotoOp):
            returns.append(program.block_index(term.return_target))
            pc = program.block_index(term.target)
        elif isinstance(term, IndirectGotoOp):
            pc = returns.pop() if returns else halt
        else:
            raise ProgramError(f"{where} ends in {term!r}, not a jump of a program "
                               f"lowered by hand (GotoOp, BranchOp, PushGotoOp, "
                               f"IndirectGotoOp)")
    return pattern_map(env.read, program.vars_out)


def _truth(value: Any, where: str) -> bool:
    array = np.asarray(value)
    if array.size != 1:
        raise ProgramError(f"{where}: a branch condition holds {array.size} values for "
                           f"one example; conditions are scalars")
    return bool(array.reshape(-1)[0])


def _no_pc(vars_in: Any, vars_out: Any, where: str) -> None:
    if PC_VAR in pattern_leaves(tuple(vars_in)) + pattern_leaves(vars_out):
        raise ProgramError(f"{where}: a PrimOp reads or writes the program counter "
                           f"{PC_VAR!r}; only the jumps may")
