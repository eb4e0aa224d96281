"""Primops that only pick tuple components of their arguments.

A DSL program unpacks tuple-typed variables with primops such as ``lambda
first: first[1]`` or ``lambda pair: (pair[1], pair[0])``.  Such a primop
computes nothing: its result *is* some of its arguments' leaves.
:func:`projection` recognizes one from its Python bytecode and returns a
:class:`Pick` recipe, so that an executor can bind the output to the input
values it already holds instead of calling the function -- no call, no read
of the leaves the primop drops, and the output keeps the identity of its
input (which lets the VM skip writing a value back where it came from).

What is recognized: the positional arguments, ``x[k]`` with an int constant
``k`` (on a value the caller knows to be a tuple: :func:`apply` checks it),
building a tuple, and returning.  Anything else (arithmetic, calls, globals,
closures, defaults, keyword or star arguments, ``x[k]`` on an array) gives
None: the primop is an ordinary one and is called as before.
"""
from __future__ import annotations

import dis
import inspect
import types
from typing import Any, Callable, Optional, Sequence, Tuple

__all__ = ["Pick", "projection", "apply"]


class Pick:
    """The leaf ``args[arg][path[0]][path[1]]...`` of a primop's arguments."""

    __slots__ = ("arg", "path")

    def __init__(self, arg: int, path: Tuple[int, ...] = ()) -> None:
        self.arg, self.path = arg, path

    def __repr__(self) -> str:
        return f"Pick({self.arg}, {self.path})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Pick) and (self.arg, self.path) == (other.arg, other.path)

    def __hash__(self) -> int:
        return hash((self.arg, self.path))


class _Index:
    """An int constant on the reader's stack (a tuple index)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


_LOADS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"}
_REFUSED_FLAGS = (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR
                  | inspect.CO_COROUTINE)
_SKIP = {"RESUME", "NOP", "CACHE", "EXTENDED_ARG"}


def projection(function: Callable[..., Any], n_args: int) -> Optional[Any]:
    """The recipe of ``function`` if it only picks tuple components of its
    ``n_args`` positional arguments: a :class:`Pick`, or a tuple of recipes
    (the function builds a tuple); None otherwise."""
    if not isinstance(function, types.FunctionType):
        return None
    code = function.__code__
    if (code.co_argcount != n_args or code.co_kwonlyargcount or code.co_freevars
            or code.co_flags & _REFUSED_FLAGS):
        return None
    stack: list = []
    try:
        for ins in dis.get_instructions(code):
            op = ins.opname
            if op in _SKIP:
                continue
            if op in _LOADS and isinstance(ins.arg, int) and ins.arg < n_args:
                stack.append(Pick(ins.arg))
            elif op == "LOAD_CONST" and type(ins.argval) is int:
                stack.append(_Index(ins.argval))
            elif op == "BINARY_SUBSCR" or (op == "BINARY_OP" and ins.argrepr == "[]"):
                key, base = stack.pop(), stack.pop()
                if not (isinstance(base, Pick) and isinstance(key, _Index)):
                    return None
                stack.append(Pick(base.arg, base.path + (key.value,)))
            elif op == "BUILD_TUPLE":
                count = ins.arg or 0
                parts = stack[len(stack) - count:] if count else []
                del stack[len(stack) - count:]
                if not all(_is_recipe(p) for p in parts):
                    return None
                stack.append(tuple(parts))
            elif op == "RETURN_VALUE":
                value = stack.pop()
                return value if _is_recipe(value) and not stack else None
            else:
                return None
    except IndexError:  # a stack shape this reader does not follow
        return None
    return None


def _is_recipe(value: Any) -> bool:
    if isinstance(value, Pick):
        return True
    return isinstance(value, tuple) and all(_is_recipe(p) for p in value)


def apply(recipe: Any, args: Sequence[Any], node: type = tuple) -> Optional[Any]:
    """``recipe`` on ``args`` (values as patterns: ``node`` -- tuples by
    default -- for tuple values, anything else a leaf): the picked parts
    (built as ``node``), or None where a path indexes into a leaf (an array:
    real indexing, not a projection) or out of range."""
    if isinstance(recipe, Pick):
        value = args[recipe.arg]
        for k in recipe.path:
            if not isinstance(value, node) or not -len(value) <= k < len(value):
                return None
            value = value[k]
        return value
    parts = [apply(p, args, node) for p in recipe]
    return None if any(p is None for p in parts) else node(parts)

