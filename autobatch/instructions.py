"""autobatch's instruction language, under TFP's module name.

Everything of :mod:`autobatch.ir` (the IR: instructions, blocks, functions,
programs, types, allocations, patterns) plus :func:`interpret`, TFP's
``instructions.interpret``: a program run for one example.  The IR lives in
:mod:`autobatch.ir` so that the interpreters (:mod:`autobatch.reference`,
:mod:`autobatch.hand_lowered`) can import it while this module imports them.
"""
from __future__ import annotations

from typing import Any, Dict

from autobatch import ir
# TFP's instructions.NullVariable / TemporaryVariable: the variable objects of
# the NULL and TEMPORARY allocations (all four live in backends.variables).
from autobatch.backends.variables import NullVariable, TemporaryVariable
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


# -- TFP's definitional environment --------------------------------------------
# TFP's interpreter keeps each variable's stack in an ``Environment`` of
# backend variables; ``PythonBackend`` makes plain Python stacks for it (one
# example, no batching).  Written from TFP's documented behaviour.


def _map_leaves(fn: Any, pattern: Any, leaf_type: Any) -> Any:
    """``pattern`` (lists and tuples are structure, except instances of
    ``leaf_type``) with each leaf replaced by ``fn(leaf)``."""
    if isinstance(pattern, (list, tuple)) and not isinstance(pattern, leaf_type):
        return type(pattern)(_map_leaves(fn, p, leaf_type) for p in pattern) \
            if not ir.is_namedtuple(pattern) else \
            type(pattern)(*(_map_leaves(fn, p, leaf_type) for p in pattern))
    return fn(pattern)


def _map_pairs(fn: Any, pattern: Any, values: Any, leaf_type: Any) -> Any:
    """``fn(leaf, value)`` over ``pattern`` and the matching parts of
    ``values``; ``values`` may hold a list or tuple where ``pattern`` has a
    leaf (the leaf gets it whole).  ValueError where the structures differ."""
    if isinstance(pattern, (list, tuple)) and not isinstance(pattern, leaf_type):
        if not isinstance(values, (list, tuple)) or isinstance(values, leaf_type) \
                or len(values) != len(pattern):
            raise ValueError(f"value {values!r} does not match pattern {pattern!r}")
        parts = [_map_pairs(fn, p, v, leaf_type) for p, v in zip(pattern, values)]
        return type(pattern)(*parts) if ir.is_namedtuple(pattern) else type(pattern)(parts)
    return fn(pattern, values)


class PythonVMVariable:
    """TFP's ``PythonVMVariable``: one variable of the definitional
    interpreter, a Python list used as a stack of unbatched values, the last
    the current one (a fresh variable holds ``[None]``).  The methods change
    the variable and return it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._stack: list = [None]

    def push(self) -> "PythonVMVariable":
        """Save the current value (it stays current)."""
        self._stack.append(self._stack[-1])
        return self

    def update(self, value: Any) -> "PythonVMVariable":
        """Overwrite the current value."""
        self._stack[-1] = value
        return self

    def pop(self) -> "PythonVMVariable":
        """Drop the current value; the saved one is current again.
        ValueError when that would leave no value."""
        self._stack.pop()
        if not self._stack:
            raise ValueError(f"Popped last value off variable {self._name}.")
        return self

    def read(self) -> Any:
        if not self._stack:
            raise ValueError(f"Reading empty variable {self._name}.")
        return self._stack[-1]

    def __repr__(self) -> str:
        return f"PythonVariable({self._stack})"


class PythonBackend:
    """TFP's ``PythonBackend``: makes :class:`PythonVMVariable` s (types and
    allocations are ignored), for :class:`Environment`."""

    def create_variable(self, name: str, alloc: Any, type_: Any) -> PythonVMVariable:
        del alloc, type_
        return PythonVMVariable(name)

    @property
    def variable_class(self) -> type:
        return PythonVMVariable


class Environment:
    """TFP's ``Environment``: the variables in scope, a dict from name to
    the backend's variable (a pattern of them for a tuple-typed variable).
    ``push``, ``update``, ``pop`` and ``read`` pass through to those
    variables and return the changed variable (or the value read); the
    environment itself is changed only by ``__setitem__``."""

    def __init__(self, env_dict: Any, backend: Any, update: Any = None) -> None:
        self.backend = backend
        self._env = dict(env_dict)
        if update is not None:
            self._env.update(update)

    @staticmethod
    def initialize(backend: Any, var_alloc: Any, var_defs: Any, *args: Any,
                   **kwargs: Any) -> "Environment":
        """One backend variable per tensor of each variable of ``var_defs``
        (``{name: Type}``), made by ``backend.create_variable(name,
        var_alloc[name], tensor_type, *args, **kwargs)``."""
        env = {}
        for name, type_ in var_defs.items():
            tensors = type_.tensors if isinstance(type_, ir.Type) else type_
            env[name] = _map_leaves(
                lambda tt, name=name: backend.create_variable(
                    name, var_alloc[name], tt, *args, **kwargs),
                tensors, ir.TensorType)
        return Environment(env, backend)

    def _known(self, name: str, doing: str) -> None:
        if name not in self._env:
            raise ValueError(f"{doing} undeclared variable {name}.")

    def push(self, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        """Save ``name``'s current value and make ``value`` current."""
        self._known(name, "Pushing")
        return _map_pairs(lambda var, val: var.push(*args, **kwargs).update(val, *args, **kwargs),
                          self._env[name], value, self.backend.variable_class)

    def update(self, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        """Overwrite ``name``'s current value with ``value``."""
        self._known(name, "Updating")
        return _map_pairs(lambda var, val: var.update(val, *args, **kwargs),
                          self._env[name], value, self.backend.variable_class)

    def pop(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Restore ``name``'s saved value (a KeyError for an undeclared
        name, as TFP's)."""
        return _map_leaves(lambda var: var.pop(*args, **kwargs), self._env[name],
                           self.backend.variable_class)

    def read(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``name``'s current value (a pattern of them for a tuple type)."""
        self._known(name, "Reading")
        return _map_leaves(lambda var: var.read(*args, **kwargs), self._env[name],
                           self.backend.variable_class)

    def __setitem__(self, key: str, value: Any) -> None:
        self._env[key] = value

    @property
    def env_dict(self) -> dict:
        return self._env


__all__ += ["Environment", "PythonBackend", "PythonVMVariable"]


# -- TFP's batch-size detection ----------------------------------------------------


def detect_batch_size(var_defs: Any, init_vals: Dict[str, Any], backend: Any) -> int:
    """TFP's ``detect_batch_size``: the batch size the inputs ``init_vals``
    (``{variable: value pattern}``) imply, read from each tensor's leading
    dimension by ``backend.batch_size``; sizes of 1 broadcast, so the result
    is the one size other than 1 (1 if none).  ``var_defs`` (a dict or
    ``(name, Type)`` pairs) gives each input's Type, whose pattern the value
    follows.  ValueError naming the inputs whose sizes disagree."""
    types = dict(var_defs)
    size, source = 1, None
    for name in sorted(init_vals):
        typ = types[name]
        pattern = typ.tensors if isinstance(typ, Type) else typ
        for _, leaf in pattern_zip(pattern, init_vals[name], leaf_type=TensorType):
            found = int(backend.batch_size(leaf))
            if found == 1 or found == size:
                continue
            if size != 1:
                raise ValueError(f"Inconsistent batch sizes: found {size} in {source} and "
                                 f"{found} in {name}")
            size, source = found, name
    return size


__all__ += ["NullVariable", "TemporaryVariable", "detect_batch_size"]
