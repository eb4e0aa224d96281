"""autobatch's instruction language, under TFP's module name.

Everything of :mod:`autobatch.ir` (the IR: instructions, blocks, functions,
programs, types, allocations, patterns) plus :func:`interpret`, TFP's
``instructions.interpret``: a program run for one example.  The IR lives in
:mod:`autobatch.ir` so that the interpreters (:mod:`autobatch.reference`,
:mod:`autobatch.hand_lowered`) can import it while this module imports them.
"""
from __future__ import annotations

from typing import Any

from autobatch import ir
from autobatch.hand_lowered import interpret as run_by_hand
from autobatch.ir import *  # noqa: F401,F403 -- this module is the IR under TFP's name
from autobatch.ir import Program
from autobatch.reference import run

__all__ = list(ir.__all__) + ["interpret"]


def interpret(program: "Program", *inputs: Any) -> Any:
    """TFP's reference interpreter: run ``program`` for one example and
    return the value of its output pattern (values without a batch
    dimension, as given).

    A program lowered by hand (push-goto, indirect goto, pops) runs with
    TFP's per-variable stacks (:func:`autobatch.hand_lowered.interpret`);
    any other program with autobatch's reference interpreter
    (:func:`autobatch.reference.run`), one call frame per call.
    """
    if not isinstance(program, Program):
        raise TypeError(f"interpret takes an instructions.Program, got "
                        f"{type(program).__name__}")
    if program.lowered_by_hand is not None:
        return run_by_hand(program.lowered_by_hand, *inputs)
    return run(program, list(inputs))
