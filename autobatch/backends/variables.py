"""TFP's variable objects: what ``Backend.create_variable`` returns.

TFP's VM keeps each program variable as an immutable object with
``read()``, ``update(value, mask)``, ``push(mask)`` and ``pop(mask)``, each
update returning a new object; code written against TFP's backends
(``create_variable(name, alloc, type_, max_stack_depth, batch_size)``) uses
them directly.  autobatch's VM stores its registers and stacks itself (see
:mod:`autobatch.backends.base`), so these classes are the public API only.

- :class:`NullVariable` (NULL): holds nothing; updates, pushes and pops
  change nothing; a read raises :class:`~autobatch.errors.NullVariableError`.
- :class:`TemporaryVariable` (TEMPORARY): the last value written, whole
  (``update`` ignores the mask, as TFP's: a temporary lives inside one block
  run); no stack.
- :class:`RegisterVariable` (REGISTER): one row per thread; ``update``
  writes the rows where ``mask`` holds; push and pop change nothing.
- :class:`FullVariable` (FULL): a register (``current``) plus a stack of
  ``max_stack_depth`` frames per thread and a per-thread stack index.
  ``push(mask)`` saves ``current`` for the masked threads (a duplicating
  push: ``current`` is unchanged); ``pop(mask)`` restores the saved value
  for them.  As in TFP, ``max_stack_depth`` counts the current value: a
  thread holds at most ``max_stack_depth - 1`` saved values.  A push
  beyond raises :class:`VariableStackOverflow` (a
  :class:`~autobatch.errors.StackOverflowError` and, as TFP's, a
  ValueError), a pop of an empty stack :class:`VariableUnderflow` (a
  ValueError) where the stack index is known eagerly.  Inside a graph (``tf.function``, a TF1 graph) the
  check is an assertion the variable's new values depend on: running the
  graph raises ``tf.errors.InvalidArgumentError`` whose message names the
  error, as TFP's assertions do.  ``TensorFlowBackend(safety_checks=False)``
  drops the checks (TFP's ``UnsafeStack``).

The array work is the backend's (``_var_where``, ``_var_stack_read``,
``_var_stack_write``, ``_var_step``, ``_var_guard``), so one set of classes
serves NumPy and TensorFlow.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from autobatch.errors import NullVariableError, ProgramError, StackOverflowError

__all__ = ["NullVariable", "TemporaryVariable", "RegisterVariable", "FullVariable", "Stack",
           "VariableStackOverflow", "VariableUnderflow"]


class VariableStackOverflow(StackOverflowError, ValueError):
    """A push past ``max_stack_depth`` (TFP raises ValueError there).
    ``function`` holds the variable's name."""

    def __init__(self, name: str, max_stack_depth: int) -> None:
        super().__init__(name, max_stack_depth)
        self.args = (f"push to variable {name!r} exceeds max_stack_depth={max_stack_depth} "
                     f"(values per thread, the current one included); pass a larger "
                     f"max_stack_depth",)

    def __str__(self) -> str:
        return self.args[0]


class VariableUnderflow(ProgramError):
    """A pop of a variable with no saved value (a ValueError, as TFP's)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"pop of variable {name!r}, whose stack holds no saved value "
                         f"(more pops than pushes)")


class NullVariable(NamedTuple):
    """A NULL variable: nothing is stored."""

    def update(self, value: Any, mask: Any) -> "NullVariable":
        return self

    def push(self, mask: Any) -> "NullVariable":
        return self

    def pop(self, mask: Any) -> "NullVariable":
        return self

    def read(self) -> Any:
        raise NullVariableError("read of a NULL variable (the allocation said nothing "
                                "reads it)")


class TemporaryVariable(NamedTuple):
    """A TEMPORARY variable: ``value`` (None before the first write)."""

    value: Any = None

    @staticmethod
    def empty() -> "TemporaryVariable":
        return TemporaryVariable(None)

    def update(self, value: Any, mask: Any) -> "TemporaryVariable":
        return TemporaryVariable(value)

    def push(self, mask: Any) -> "TemporaryVariable":
        raise ProgramError("push of a TEMPORARY variable: a temporary never lives "
                           "across a call; allocate it REGISTER or FULL")

    def pop(self, mask: Any) -> "TemporaryVariable":
        raise ProgramError("pop of a TEMPORARY variable: a temporary never lives "
                           "across a call; allocate it REGISTER or FULL")

    def read(self) -> Any:
        if self.value is None:
            raise ProgramError("read of a TEMPORARY variable before it was written")
        return self.value


class Stack(NamedTuple):
    """TFP's ``Stack``: ``stack`` (``[max_stack_depth, batch, ...]``, the
    saved values) and ``stack_index`` (``[batch]`` int32: each thread's
    number of saved values)."""

    stack: Any
    stack_index: Any


class _OnBackend:
    """The array work of a variable goes to its ``backend``; where none was
    given (TFP's constructors take none), to the class's default (the
    backend-specific classes of :mod:`autobatch.tf_backend` and
    :mod:`autobatch.numpy_backend` have one)."""

    __slots__ = ()

    @staticmethod
    def _default_backend() -> Any:
        raise ProgramError("this variable has no backend: build it with backend=..., or "
                           "use the backend's own class (tf_backend.RegisterTensorFlowVariable, "
                           "numpy_backend.RegisterNumpyVariable...) or create_variable")

    def _b(self) -> Any:
        backend = self.backend
        return backend if backend is not None else self._default_backend()


class RegisterVariable(_OnBackend, NamedTuple("_Register", [("value", Any), ("backend", Any)])):
    """A REGISTER variable: ``value`` has one row per thread.  TFP's
    ``RegisterTensorFlowVariable(value)``; ``backend`` (keyword) does the
    array work."""

    __slots__ = ()

    def __new__(cls, value: Any, backend: Any = None) -> "RegisterVariable":
        return super().__new__(cls, value, backend)

    def update(self, value: Any, mask: Any) -> "RegisterVariable":
        return self._replace(value=self._b()._var_where(mask, value, self.value))

    def push(self, mask: Any) -> "RegisterVariable":
        return self

    def pop(self, mask: Any) -> "RegisterVariable":
        return self

    def read(self) -> Any:
        return self.value


class FullVariable(_OnBackend, NamedTuple("_Full", [("current", Any), ("stack", Any),
                                                    ("name", str), ("backend", Any)])):
    """A FULL variable: ``current`` (one row per thread) and ``stack``, a
    :class:`Stack` of ``[max_stack_depth, batch, ...]`` saved values and each
    thread's count of them: TFP's ``FullTensorFlowVariable(current,
    stack)``.  ``name`` (keyword) appears in a stack overflow's message,
    ``backend`` (keyword) does the array work.  The methods take TFP's
    optional ``name`` argument (an op name; unused)."""

    __slots__ = ()

    def __new__(cls, current: Any, stack: Any, name: str = "variable",
                backend: Any = None) -> "FullVariable":
        return super().__new__(cls, current, Stack(*stack), name, backend)

    @property
    def index(self) -> Any:
        """Each thread's number of saved values (``stack.stack_index``)."""
        return self.stack.stack_index

    def update(self, value: Any, mask: Any, name: Any = None) -> "FullVariable":
        return self._replace(current=self._b()._var_where(mask, value, self.current))

    def push(self, mask: Any, name: Any = None) -> "FullVariable":
        b = self._b()
        depth = b._var_depth(self.stack.stack)
        index = b._var_step(self.index, mask, 1)
        index, current = b._var_guard(
            (index, self.current), lambda: index >= depth,
            lambda: VariableStackOverflow(self.name, depth))
        stack = b._var_stack_write(self.stack.stack, self.index, mask, current)
        return self._replace(stack=Stack(stack, index), current=current)

    def pop(self, mask: Any, name: Any = None) -> "FullVariable":
        b = self._b()
        index, = b._var_guard((b._var_step(self.index, mask, -1),),
                              lambda: b._var_step(self.index, mask, -1) < 0,
                              lambda: VariableUnderflow(self.name))
        top = b._var_stack_read(self.stack.stack, index)
        return self._replace(current=b._var_where(mask, top, self.current),
                             stack=Stack(self.stack.stack, index))

    def read(self, name: Any = None) -> Any:
        return self.current
