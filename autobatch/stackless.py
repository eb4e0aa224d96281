"""The stackless executor: batched, with calls on the host (Python) stack.

:func:`execute` runs an unlowered, typed program.  Within one function run,
threads move between blocks by program counter as in the VM (lowest block
first); at a call, the threads that make it run the callee together as one
nested function run (a Python recursion), each run with its own registers.
No stacks, no allocation strategy, no lowering: a simpler executor that must
agree with the VM and the reference.  Every value lives in a register of its
function run; blocks are interpreted, not compiled.

It needs eager execution (Python recursion decides which threads call), so
with TensorFlow it runs eagerly only.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from autobatch.errors import ProgramError, StackOverflowError
from autobatch.ir import (
    BranchOp, FunctionCallOp, Function, GotoOp, PrimOp, Program, ReturnOp, TensorType, Type,
    as_pattern, bind_pattern, pattern_leaves, pattern_map, pattern_unflatten,
)
from autobatch.arguments import lists_as_arrays
from autobatch.pipeline import DEFAULT_MAX_STACK_DEPTH, argument_types, batch_size

__all__ = ["execute", "is_running"]

_RUNNING = threading.local()


def is_running() -> bool:
    """TFP's ``stackless.is_running``: True while :func:`execute` runs a
    primitive's function (so that a primitive can tell this executor's run
    from type inference, the VM's staging or a dry run), False elsewhere.
    Per thread."""
    return getattr(_RUNNING, "depth", 0) > 0


@contextlib.contextmanager
def _running() -> Iterator[None]:
    _RUNNING.depth = getattr(_RUNNING, "depth", 0) + 1
    try:
        yield
    finally:
        _RUNNING.depth -= 1


class _Stackless:
    def __init__(self, program: Program, backend: Any, max_stack_depth: Optional[int]) -> None:
        self.program = program
        self.backend = backend
        self.max_stack_depth = max_stack_depth
        self.steps = 0

    def run_function(self, fn: Function, args: List[Any], pc: Any, depth: int) -> Any:
        """Run ``fn`` for the threads whose ``pc`` is its entry (0); ``args`` are
        values over the rows of ``pc``.  Returns the return value over them."""
        B = self.backend
        size = B.size(pc)
        halt = len(fn.blocks)
        index = {b.name: i for i, b in enumerate(fn.blocks)}
        registers: Dict[str, List[Any]] = {}

        def store(var: str, sel: Any, value: Any) -> None:
            typ: Type = fn.var_types[var]
            leaves = registers.get(var)
            if leaves is None:
                leaves = registers[var] = [B.fill(t, size) for t in typ.leaves()]
            parts = pattern_leaves(as_pattern(value)) if typ.is_tuple else [value]
            registers[var] = [B.write(reg, sel, part) for reg, part in zip(leaves, parts)]

        def load(var: str, sel: Any) -> Any:
            leaves = registers.get(var)
            if leaves is None:
                raise ProgramError(f"function {fn.name!r}: variable {var!r} is read before "
                                   f"it is written")
            return pattern_unflatten(fn.var_types[var].tensors,
                                     [B.read(reg, sel) for reg in leaves])

        for param, typ, arg in zip(fn.params, [fn.var_types[p] for p in fn.params], args):
            leaves = pattern_leaves(as_pattern(arg))
            registers[param] = [B.as_batched(a, t, size) for a, t in zip(leaves, typ.leaves())]
        rtype = fn.return_type
        assert rtype is not None  # execute() refuses an untyped function
        ret = [B.fill(t, size) for t in rtype.leaves()]
        while True:
            b = B.reduce_min(pc)
            if not b < halt:
                break
            self.steps += 1
            block = fn.blocks[int(b)]
            sel = B.select(pc, b)
            where = f"function {fn.name!r}, block {block.name!r}"
            tail = block.tail_call()
            for op in block.instructions:
                inputs = [load(v, sel) for v in op.vars_in]
                if isinstance(op, PrimOp):
                    with _running():
                        value = op.function(*inputs)
                elif isinstance(op, FunctionCallOp):
                    callee = self.program.function(op.function)
                    nested = depth if op is tail else depth + 1
                    if (op is not tail and self.max_stack_depth is not None
                            and depth >= self.max_stack_depth):
                        raise StackOverflowError(callee.name, self.max_stack_depth)
                    value = self.run_function(callee, inputs, B.callee_pc(sel, 0, len(
                        callee.blocks)), nested)
                else:
                    raise ProgramError(f"{where}: {type(op).__name__} belongs to lowered "
                                       f"programs")
                for var, part in bind_pattern(op.vars_out, value, where, op):
                    store(var, sel, part)
            term = block.terminator
            if isinstance(term, GotoOp):
                pc = B.write(pc, sel, index[term.target])
            elif isinstance(term, BranchOp):
                pc = B.write(pc, sel, B.where(load(term.cond, sel), index[term.true_target],
                                              index[term.false_target]))
            elif isinstance(term, ReturnOp):
                value = pattern_map(lambda v: load(v, sel), term.vars)
                parts = pattern_leaves(as_pattern(value))
                ret = [B.write(r, sel, part) for r, part in zip(ret, parts)]
                pc = B.write(pc, sel, halt)
            else:
                raise ProgramError(f"{where}: {type(term).__name__} belongs to lowered "
                                   f"programs")
        return pattern_unflatten(rtype.tensors, ret)


def _is_backend(value: Any) -> bool:
    return hasattr(value, "fill") and hasattr(value, "to_numpy")


class _Unset:
    """The default of :func:`execute`'s ``max_stack_depth`` (so that TFP's
    argument order can tell "not given" from an input)."""

    def __repr__(self) -> str:
        return f"DEFAULT_MAX_STACK_DEPTH ({DEFAULT_MAX_STACK_DEPTH})"


_UNSET = _Unset()


def execute(program: Program, args: Any, backend: Any = None,
            max_stack_depth: Any = _UNSET, *inputs: Any) -> Any:
    """Run ``program`` for a batch of inputs without explicit stacks.

    Parameters and result as :func:`autobatch.virtual_machine.execute`
    (``program`` must be an unlowered Program; it is typed here if needed).
    ``max_stack_depth`` (default ``DEFAULT_MAX_STACK_DEPTH``) bounds pending
    non-tail calls as in the VM (None: only Python's recursion limit).

    TFP's order ``execute(program, backend, block_code_cache, *inputs)``
    works too (a backend in second place picks it): the inputs one by one,
    ``block_code_cache`` accepted and unused (blocks are interpreted here).
    """
    if _is_backend(args):
        backend, args = args, ([] if max_stack_depth is _UNSET else [max_stack_depth]) \
            + list(inputs)
        max_stack_depth = _UNSET
    elif inputs:
        raise TypeError(f"stackless.execute takes (program, args, backend, max_stack_depth) "
                        f"or TFP's (program, backend, block_code_cache, *inputs); got "
                        f"{len(inputs)} argument(s) more")
    if max_stack_depth is _UNSET:
        max_stack_depth = DEFAULT_MAX_STACK_DEPTH
    if backend is None:
        from autobatch.backends.numpy import NumpyBackend
        backend = NumpyBackend()
    # A list for a parameter known (typed, or declared in TFP's var_defs) to
    # be one tensor is that tensor, as TFP's tests pass batches.
    declared, main = program.given_var_defs or {}, program.main_function()
    args = lists_as_arrays(args, [(main.var_types or {}).get(p) or declared.get(p)
                                  for p in main.params])
    if any(fn.return_type is None for fn in program.functions
           if fn.name == program.main):
        from autobatch.type_inference import infer_types
        program = infer_types(program, argument_types(args, backend), backend)
    main = program.main_function()
    if len(args) != len(main.params):
        raise ProgramError(f"function {main.name!r} takes {len(main.params)} argument(s) "
                           f"{main.params}, got {len(args)}")
    batch = batch_size(args, [main.var_types[p] for p in main.params])
    pc = backend.fill(TensorType(np.dtype(np.int32), ()), batch, 0)
    runner = _Stackless(program, backend, max_stack_depth)
    result = runner.run_function(main, list(args), pc, 0)
    return pattern_map(backend.to_numpy, as_pattern(result))


setattr(execute, "__tfp_signature__", inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for name in ("program", "backend", "block_code_cache")] + [
    inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL)]))
