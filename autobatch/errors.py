"""Exception classes of autobatch.

Every error autobatch raises on a bad program or bad input is one of these,
and its message names the function, variable or argument at fault and what to
do about it.
"""
from __future__ import annotations

__all__ = [
    "AutobatchError",
    "ProgramError",
    "TypeInferenceError",
    "NullVariableError",
    "StackOverflowError",
    "NativeEngineError",
]


class AutobatchError(Exception):
    """Base class of autobatch's own errors.

    The classes whose constructor takes just the message keep
    ``Exception.__init__`` as theirs (not the one of the builtin error they
    also derive from): TensorFlow's AutoGraph re-raises an error from a
    user's ``tf.function`` as its own class only then, and as a
    ``StagingError`` (no longer a ``ValueError`` or ``TypeError``)
    otherwise."""


class ProgramError(AutobatchError, ValueError):
    """A malformed program: unknown function or block, a variable read before
    it is written, a builder used out of order, arity mismatches."""

    __init__ = Exception.__init__


class TypeInferenceError(AutobatchError, TypeError):
    """Types that cannot be inferred or do not agree (a variable written with
    ``int64`` in one place and ``float32`` in another, say)."""

    __init__ = Exception.__init__


class NullVariableError(AutobatchError, RuntimeError):
    """A read of a variable whose allocation is NULL (it holds nothing).

    The allocation strategy only makes a variable NULL when nothing reads it;
    this error means an allocation map was edited by hand, or a bug.
    """

    __init__ = Exception.__init__


class StackOverflowError(AutobatchError, RuntimeError):
    """A thread made more nested calls than ``max_stack_depth`` allows.

    Attributes
    ----------
    function : the function whose call did not fit on the stack.
    max_stack_depth : the depth the program ran with.
    """

    def __init__(self, function: str, max_stack_depth: int, detail: str = "") -> None:
        self.function = function
        self.max_stack_depth = max_stack_depth
        message = (f"call to function {function!r} exceeds max_stack_depth="
                   f"{max_stack_depth} (nested calls per thread); pass a larger "
                   f"max_stack_depth")
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class NativeEngineError(AutobatchError, ValueError):
    """The native engine was asked for (``NumpyBackend(native=True)``) but
    cannot run the program: numba is not installed, or a primop or variable
    is one it cannot run as NumPy would (the message names it)."""

    __init__ = Exception.__init__
