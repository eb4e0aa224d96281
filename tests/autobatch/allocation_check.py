"""What a program's liveness implies for each variable's storage, derived
here independently of ``allocation_strategy`` (its own backward dataflow over
each function's blocks, its own call-graph closure), to check
``allocation_strategy.optimize``'s choices against:

- NULL: never read;
- TEMPORARY: read, but live neither into any block nor across a call;
- REGISTER: live into a block (a parameter into the entry block) or across a
  call whose callee cannot run this function again;
- FULL: live across a call (not a tail call) whose callee can, transitively,
  run this function again, which would overwrite it.

The program counter needs a stack (FULL) exactly where a function reachable
from ``main`` makes a call that must come back."""
from __future__ import annotations

from typing import Dict, List, Set

from autobatch.ir import FunctionCallOp, VariableAllocation as VA


def _closure(callees: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for g in callees[todo.pop()]:
            if g not in seen:
                seen.add(g)
                todo.append(g)
    return seen


def _live_in_per_block(fn) -> Dict[str, Set[str]]:
    live_in = {b.name: set() for b in fn.blocks}
    changed = True
    while changed:
        changed = False
        for block in reversed(fn.blocks):
            live = set().union(*[live_in[t] for t in block.terminator.targets]) \
                if block.terminator.targets else set()
            live |= set(block.terminator.reads)
            for op in reversed(block.instructions):
                live = (live - set(op.writes)) | set(op.reads)
            if live != live_in[block.name]:
                live_in[block.name] = live
                changed = True
    return live_in


def required(program) -> Dict[str, Dict[str, VA]]:
    """``{function: {variable: the least storage its liveness allows}}``,
    plus ``{"<pc>": {"pc": ...}}``."""
    callees = {fn.name: {op.function for b in fn.blocks for op in b.instructions
                         if isinstance(op, FunctionCallOp)} for fn in program.functions}
    out: Dict[str, Dict[str, VA]] = {}
    returning_call = False
    in_use = _closure(callees, program.main) | {program.main}
    for fn in program.functions:
        need = {v: VA.NULL for v in fn.variables()}

        def up(v, level):
            need[v] = max(need[v], level)
        live_in = _live_in_per_block(fn)
        for block in fn.blocks:
            for v in live_in[block.name]:
                up(v, VA.REGISTER)
            live = set().union(*[live_in[t] for t in block.terminator.targets]) \
                if block.terminator.targets else set()
            live |= set(block.terminator.reads)
            for v in block.terminator.reads:
                up(v, VA.TEMPORARY)
            tail = block.tail_call()
            for op in reversed(block.instructions):
                if isinstance(op, FunctionCallOp) and op is not tail:
                    returning_call |= fn.name in in_use
                    recursive = fn.name in _closure(callees, op.function) | {op.function}
                    for v in live - set(op.writes):
                        up(v, VA.FULL if recursive else VA.REGISTER)
                live = (live - set(op.writes)) | set(op.reads)
                for v in op.reads:
                    up(v, VA.TEMPORARY)
        out[fn.name] = need
    out["<pc>"] = {"pc": VA.FULL if returning_call else VA.REGISTER}
    return out


def differences(program) -> List[str]:
    """Where ``program``'s allocation differs from :func:`required`: a
    weaker choice is a bug (a value lost), a stronger one a lost saving."""
    need = required(program)
    found = []
    for fn in program.functions:
        for var, level in sorted(need[fn.name].items()):
            got = fn.var_alloc[var]
            if got != level:
                kind = "BUG" if got < level else "lost saving"
                found.append(f"{kind}: {fn.name}.{var} is {got.name}, liveness needs {level.name}")
    if program.pc_alloc != need["<pc>"]["pc"]:
        found.append(f"pc is {program.pc_alloc.name}, needs {need['<pc>']['pc'].name}")
    return found
