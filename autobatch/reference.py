"""The one-example reference interpreter: what a program means.

:func:`run` executes an (unlowered) :class:`~autobatch.instructions.Program`
for a single example, one instruction at a time, calls on the Python stack.
It is deliberately naive: the batched executors
(:mod:`autobatch.virtual_machine`, :mod:`autobatch.stackless`) must give,
for every thread ``i``, what ``run(program, example i)`` gives.

Each value is held with a batch dimension of 1, so primop functions see the
same kind of arrays as in a batched run (with one thread).

Stack depth: ``max_stack_depth`` bounds the number of calls pending at once
(calls that will come back to their caller).  A tail call (``x = call g(..);
return x``) ends its caller's activation and does not count, exactly as in
the batched executors, where it is a jump.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from autobatch.errors import ProgramError, StackOverflowError
from autobatch.ir import (
    BranchOp, FunctionCallOp, GotoOp, PrimOp, Program, ReturnOp, as_pattern, bind_pattern,
    pattern_leaves, pattern_map, pattern_unflatten,
)

__all__ = ["run", "run_batch"]


def _truth(value: Any) -> bool:
    array = np.asarray(value)
    if array.size != 1:
        raise ProgramError(f"a branch condition holds {array.size} values for one "
                           f"thread; conditions must be scalars per thread")
    return bool(array.reshape(-1)[0])


class _Interpreter:
    def __init__(self, program: Program, max_stack_depth: Optional[int]) -> None:
        self.program = program.validate()
        self.max_stack_depth = max_stack_depth
        self.steps = 0

    def call(self, name: str, args: Sequence[Any], depth: int) -> Any:
        fn = self.program.function(name)
        env: Dict[str, Any] = dict(zip(fn.params, args))
        block = fn.entry
        while True:
            self.steps += 1
            where = f"function {fn.name!r}, block {block.name!r}"

            def read(var: str) -> Any:
                try:
                    return env[var]
                except KeyError:
                    raise ProgramError(f"{where}: variable {var!r} is read before "
                                       f"it is written") from None

            tail = block.tail_call()
            for op in block.instructions:
                if isinstance(op, PrimOp):
                    value = op.function(*[read(v) for v in op.vars_in])
                elif isinstance(op, FunctionCallOp):
                    callee_args = [read(v) for v in op.vars_in]
                    if op is tail:  # a jump: our activation ends here
                        fn = self.program.function(op.function)
                        env = dict(zip(fn.params, callee_args))
                        block = fn.entry
                        break
                    if self.max_stack_depth is not None and depth >= self.max_stack_depth:
                        raise StackOverflowError(op.function, self.max_stack_depth)
                    value = self.call(op.function, callee_args, depth + 1)
                else:
                    raise ProgramError(f"{where}: {type(op).__name__} belongs to lowered "
                                       f"programs; the reference runs unlowered ones")
                env.update(bind_pattern(op.vars_out, value, where, op))
            else:
                term = block.terminator
                if isinstance(term, GotoOp):
                    block = fn.block(term.target)
                elif isinstance(term, BranchOp):
                    target = term.true_target if _truth(read(term.cond)) else term.false_target
                    block = fn.block(target)
                elif isinstance(term, ReturnOp):
                    return pattern_map(read, term.vars)
                else:
                    raise ProgramError(f"{where}: {type(term).__name__} belongs to "
                                       f"lowered programs")


def _one(leaf: Any) -> Any:
    """A leaf of one example with a batch dimension of 1."""
    return np.asarray(leaf)[None]


def _unbatch(leaf: Any) -> np.ndarray:
    array = np.asarray(leaf)
    return array[0] if array.ndim else array


def run(program: Program, args: Sequence[Any], max_stack_depth: Optional[int] = None) -> Any:
    """Run ``program`` on one example.

    Parameters
    ----------
    program : an unlowered program (typed or not).
    args : one value per parameter of ``main``, without a batch dimension
        (tuples for tuple-typed parameters).
    max_stack_depth : the most calls pending at once; None: no limit but
        Python's own recursion limit.

    Returns
    -------
    The value ``main`` returns (arrays without the batch dimension; tuples
    for tuple values).  Where the program is typed, leaves are cast to the
    inferred return type.
    """
    interp = _Interpreter(program, max_stack_depth)
    main = program.main_function()
    if len(args) != len(main.params):
        raise ProgramError(f"function {main.name!r} takes {len(main.params)} argument(s) "
                           f"{main.params}, got {len(args)}")
    batched = [pattern_map(_one, as_pattern(a)) for a in args]
    result = interp.call(main.name, batched, 0)
    result = pattern_map(_unbatch, as_pattern(result))
    if main.return_type is not None:
        leaves = [np.asarray(v, dtype=t.dtype)
                  for v, t in zip(pattern_leaves(result), main.return_type.leaves())]
        result = pattern_unflatten(result, leaves)
    return result


def run_batch(program: Program, args: Sequence[Any],
              max_stack_depth: Optional[int] = None) -> Any:
    """:func:`run` on each example of a batch; results stacked on axis 0.

    ``args`` have a leading batch dimension (all the same size); a leaf
    without one (0-d) is given to every example.
    """
    args = [as_pattern(a) for a in args]
    sizes = {np.asarray(leaf).shape[0] for a in args for leaf in pattern_leaves(a)
             if np.asarray(leaf).ndim}
    if len(sizes) > 1:
        raise ProgramError(f"arguments have different batch sizes {sorted(sizes)}")
    batch = sizes.pop() if sizes else 1
    results: List[Any] = []
    for i in range(batch):
        example = [pattern_map(lambda leaf: np.asarray(leaf)[i] if np.asarray(leaf).ndim
                               else leaf, a) for a in args]
        results.append(run(program, example, max_stack_depth))
    first = results[0]
    columns = list(zip(*[pattern_leaves(r) for r in results]))
    return pattern_unflatten(first, [np.stack(c) for c in columns])
