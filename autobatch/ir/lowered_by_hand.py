"""Programs lowered by hand: TFP's per-variable stacks.

A graph written with push-goto, indirect goto and pops (no function calls);
its one-example meaning is :func:`autobatch.hand_lowered.interpret`, its
batched run :mod:`autobatch.stack_vm`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np

from autobatch.errors import ProgramError
from autobatch.ir.ops import (
    PC_VAR,
    BranchOp,
    FunctionCallOp,
    IndirectGotoOp,
    PopOp,
    PushGotoOp,
)
from autobatch.ir.patterns import as_pattern, pattern_leaves
from autobatch.ir.types import Type, VariableAllocation, single_type


def is_hand_lowered(blocks: List[Any]) -> bool:
    """Whether a graph's blocks use the lowered instructions (push-goto,
    indirect goto, pop), i.e. were lowered by hand."""
    for block in blocks:
        if isinstance(block.terminator, (PushGotoOp, IndirectGotoOp)):
            return True
        if any(isinstance(op, PopOp) for op in block.instructions):
            return True
    return False


@dataclass(eq=False)
class HandLowered:
    """One graph of a program lowered by hand (see the module doc).

    ``blocks`` are TFP-style :class:`~autobatch.instructions.Block` s, the
    first the entry; jump targets are Block objects, block names, or None
    (halt).  ``var_defs`` always holds :data:`PC_VAR` (int32 scalar), and
    ``var_alloc`` every variable of ``var_defs``.
    """

    blocks: List[Any]
    var_defs: Dict[str, Any]
    vars_in: List[str]
    vars_out: Any
    var_alloc: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vars_in = [str(v) for v in self.vars_in]
        self.vars_out = as_pattern(self.vars_out)
        for block in self.blocks:
            for op in block.instructions:
                if isinstance(op, FunctionCallOp):
                    raise ProgramError(
                        f"block {block.name!r} calls {getattr(op.function, 'name', op.function)!r}"
                        f" in a program lowered by hand (it has push-goto, indirect goto or "
                        f"pop instructions): lower that call by hand too, or write the "
                        f"program with FunctionCallOp only and let lowering make the stacks")
        self.var_defs = {k: (v if isinstance(v, Type) else Type(v))
                         for k, v in dict(self.var_defs or {}).items()}
        self.var_defs.setdefault(PC_VAR, single_type(np.int32, ()))
        alloc = dict(self.var_alloc or {})
        for name in self.var_defs:
            alloc.setdefault(name, VariableAllocation.FULL)
        self.var_alloc = {k: VariableAllocation(v) if not isinstance(v, str)
                          else VariableAllocation[v.upper()] for k, v in alloc.items()}

    def block_index(self, target: Any) -> int:
        """The index of a jump target (a Block, a block name; None: the
        halt index, ``len(blocks)``)."""
        if target is None:
            return len(self.blocks)
        for i, block in enumerate(self.blocks):
            if block is target or (isinstance(target, str) and block.name == target):
                return i
        name = getattr(target, "name", target)
        raise ProgramError(f"a jump targets block {name!r}, which is not in the program's "
                           f"graph; add it to the ControlFlowGraph")

    def variables(self) -> List[str]:
        """Every variable the graph reads or writes (without the pc)."""
        seen: Dict[str, None] = dict.fromkeys(self.vars_in)
        for block in self.blocks:
            for op in block.instructions:
                names = op.vars if isinstance(op, PopOp) else \
                    list(op.vars_in) + pattern_leaves(op.vars_out)
                seen.update(dict.fromkeys(pattern_leaves(tuple(names))))
            if isinstance(block.terminator, BranchOp):
                seen[block.terminator.cond] = None
        seen.update(dict.fromkeys(pattern_leaves(self.vars_out)))
        return list(seen)

    def check_types(self) -> None:
        """Raise ProgramError unless every variable has a full Type (the
        batched run allocates its storage from them)."""
        missing = [v for v in self.variables() if v not in self.var_defs
                   or any(leaf is None for leaf in self.var_defs[v].leaves())]
        if missing:
            raise ProgramError(
                f"variable(s) {missing} of a program lowered by hand have no Type in "
                f"var_defs; give each one (instructions.single_type(dtype, shape)): the "
                f"batched run allocates every variable's stack before it starts")
