"""Choose how every variable is stored: :func:`optimize`.

Every variable starts at NULL and is upgraded only as far as a rule demands
(:class:`~autobatch.instructions.VariableAllocation`):

- NULL: nothing ever reads it (it is never live).  Writes are dropped.
- TEMPORARY: read, but never live across a block boundary: not live on
  entry to any block and not live across a call (a call ends its block once
  lowered).  Its value is kept only while one block runs.
- REGISTER: live across a block boundary or across a call, but no call it is
  live across can write it.
- FULL: live across a call whose callee may, transitively, run the
  variable's own function again (recursion), which would overwrite it.  It
  gets a stack: saved before such a call, restored after.

Variables are local to their function, so a callee writes a caller's
variable only by running the caller's function again: a variable live across
a call to a function that cannot reach its own function in the call graph
stays REGISTER (the call-graph refinement).  A tail call (``x = call g(..);
return x``) leaves nothing live after it, so it never makes anything FULL.

The program counter is FULL (a stack of return addresses) where the program
has a call that must come back (a non-tail call), else REGISTER.

Liveness is the project's one analysis, :mod:`memopt.liveness`, over one
flow node per instruction and per terminator (:func:`function_flow`); loops
(back edges) are ordinary edges of that graph.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Dict, Set

from autobatch.ir import (  # the flow helpers live in instructions
    FunctionCallOp, Function, FunctionFlow, Program, VariableAllocation, call_graph,
    check_defined, function_flow, reachable,
)

__all__ = [
    "FunctionFlow",
    "function_flow",
    "call_graph",
    "reachable",
    "check_defined",
    "has_returning_call",
    "optimize",
]

log = logging.getLogger(__name__)


def _allocate_function(fn: Function, flow: FunctionFlow,
                       reach: Dict[str, Set[str]]) -> Dict[str, VariableAllocation]:
    live = flow.liveness
    alloc = {var: VariableAllocation.NULL for var in fn.variables()}

    def upgrade(var: str, level: VariableAllocation) -> None:
        if alloc[var] < level:
            alloc[var] = level

    for node in flow.nodes:  # read somewhere: at least TEMPORARY
        for var in node.reads:
            upgrade(var, VariableAllocation.TEMPORARY)
    for block in fn.blocks:  # live on entry to a block: crosses a boundary
        for var in live.live_in(flow.block_start[block.name]):
            upgrade(var, VariableAllocation.REGISTER)
        tail = block.tail_call()
        for k, op in enumerate(block.instructions):
            if not isinstance(op, FunctionCallOp) or op is tail:
                continue
            i = flow.node(block.name, k)
            across = sorted(set(live.live_out(i)) - set(flow.nodes[i].writes))
            recursive = fn.name in reach[op.function]
            for var in across:
                upgrade(var, VariableAllocation.FULL if recursive
                        else VariableAllocation.REGISTER)
    return alloc


def has_returning_call(program: Program, functions: Set[str]) -> bool:
    """Whether any of ``functions`` makes a call that is not a tail call."""
    for fn in program.functions:
        if fn.name not in functions:
            continue
        for block in fn.blocks:
            tail = block.tail_call()
            if any(isinstance(op, FunctionCallOp) and op is not tail
                   for op in block.instructions):
                return True
    return False


def optimize(program: Program) -> Program:
    """A copy of ``program`` with every function's ``var_alloc`` and the
    program's ``pc_alloc`` set (see the module doc for the rules).

    An untyped program whose TFP-style ``var_defs`` type every variable is
    typed from them first (:meth:`~autobatch.instructions.Program.with_declared_types`),
    so TFP's ``optimize`` -> ``lower_function_calls`` runs on it as on TFP.

    Raises ProgramError for a variable that may be read before it is written.
    """
    program.validate()
    program = program.with_declared_types() or program
    graph = call_graph(program)
    reach = {name: reachable(graph, name) for name in graph}
    functions = []
    for fn in program.functions:
        flow = function_flow(fn)
        check_defined(flow)
        alloc = _allocate_function(fn, flow, reach)
        log.debug("allocation of %s: %s", fn.name,
                  {v: a.name for v, a in sorted(alloc.items())})
        functions.append(replace(fn, var_alloc=alloc))
    in_use = reachable(graph, program.main)
    pc = (VariableAllocation.FULL if has_returning_call(program, in_use)
          else VariableAllocation.REGISTER)
    return program.replace_functions(functions, pc_alloc=pc)

