"""One primop as a per-thread scalar expression, for the native engine.

:func:`scalar_expression` reads a primop's Python bytecode (a DSL lambda, a
``const``, or a primop the frontend wrote) and, where every step is one
whose meaning on one thread's scalars is the same as NumPy's on the batch,
returns source text for one thread plus the value's *kind*: ``"b"`` (bool),
``"i"`` (int64) or ``"f"`` (float64).

What lowers (anything else raises :class:`Unlowerable`, with the reason):

- the function's arguments (each a scalar leaf, or a tuple of them);
- constants: Python ``bool``/``int``/``float`` (and NumPy scalars of those
  three dtypes), from the code or from a closure cell; tuples of them;
- ``+ - * / // %`` (not on two bools: NumPy gives a bool there, a scalar
  an int), ``& | ^`` (ints and bools), ``<< >>`` (ints), comparisons,
  unary ``-`` (not on a bool), ``~`` (a bool's is ``not``);
- ``x[k]`` of a tuple with a constant ``k``, building a tuple;
- the frontend's helpers (:mod:`autobatch.frontend_ops`): ``truth``,
  ``logical_not``, ``logical_and``, ``logical_or``, ``select``,
  ``range_continues`` on scalars.

Left out on purpose, because a compiled scalar may not give NumPy's bits:
``**``, any function call other than the helpers above (``np.exp``...),
module globals, arrays in closures, jumps (``and``/``or``/``if`` in a
lambda; the frontend writes those as helper calls).
"""
from __future__ import annotations

import dis
import numbers
import re
from typing import Any, Dict, List, Sequence, Union

import numpy as np

from autobatch import frontend_ops

__all__ = ["Unlowerable", "Scalar", "scalar_expression", "KIND_OF_DTYPE"]

#: The dtypes the native engine stores, by kind.
KIND_OF_DTYPE = {np.dtype(np.bool_): "b", np.dtype(np.int64): "i",
                 np.dtype(np.float64): "f"}
_RANK = {"b": 0, "i": 1, "f": 2}


class Unlowerable(Exception):
    """A primop (or a program) the native engine cannot run as NumPy would;
    the message says what and why."""


class Scalar:
    """A per-thread scalar value in generated code: its source and kind."""

    __slots__ = ("src", "kind")

    def __init__(self, src: str, kind: str) -> None:
        self.src, self.kind = src, kind

    def __repr__(self) -> str:
        return f"Scalar({self.src!r}, {self.kind!r})"


Value = Union[Scalar, tuple]


def _literal(value: Any, what: str) -> Scalar:
    """A constant as source text (exact: ``repr`` of a float round-trips)."""
    if isinstance(value, (bool, np.bool_)):
        return Scalar("True" if value else "False", "b")
    if isinstance(value, np.generic):
        kind = KIND_OF_DTYPE.get(value.dtype)
        if kind is None:
            raise Unlowerable(f"{what} is a NumPy {value.dtype} scalar (the native engine "
                              f"stores only bool, int64 and float64)")
        value = value.item()
    if isinstance(value, numbers.Integral):
        if not -2 ** 63 <= int(value) < 2 ** 63:
            raise Unlowerable(f"{what} ({value}) does not fit in int64")
        return Scalar(str(int(value)), "i")
    if isinstance(value, float):
        if value != value:
            return Scalar("np.nan", "f")
        if value in (float("inf"), float("-inf")):
            return Scalar("np.inf" if value > 0 else "(-np.inf)", "f")
        return Scalar(repr(value), "f")
    raise Unlowerable(f"{what} is a {type(value).__name__} ({value!r}); only bool, int and "
                      f"float constants lower")


def _constant(value: Any, what: str) -> Value:
    if isinstance(value, tuple):
        return tuple(_constant(v, what) for v in value)
    return _literal(value, what)


def _scalar(value: Value, what: str) -> Scalar:
    if not isinstance(value, Scalar):
        raise Unlowerable(f"{what} of a tuple")
    return value


def _top(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


def _binary(op: str, a: Value, b: Value) -> Scalar:
    a, b = _scalar(a, f"operator {op!r}"), _scalar(b, f"operator {op!r}")
    op = op.rstrip("=") if op not in ("==", "!=", "<=", ">=") else op
    kinds = (a.kind, b.kind)
    if op in ("==", "!=", "<", "<=", ">", ">="):
        return Scalar(f"({a.src} {op} {b.src})", "b")
    if op in ("+", "-", "*", "//", "%"):
        if kinds == ("b", "b"):
            raise Unlowerable(f"{op!r} of two bools (NumPy gives a bool, a scalar an int)")
        # a bool operand counts as an int, as in NumPy
        kind = _top(*kinds)
        x, y = _as_number(a), _as_number(b)
        if op == "//" and kind == "i" and not re.fullmatch(r"\d+", y):
            # NumPy wraps INT64_MIN // -1 to INT64_MIN (numba gives 0)
            if y == "-1":
                return Scalar(f"(-{x})", "i")
            return Scalar(f"(({x} // {y}) if {y} != -1 else -{x})", "i")
        return Scalar(f"({x} {op} {y})", kind)
    if op == "/":
        if "b" in kinds:
            raise Unlowerable("'/' with a bool operand")
        return Scalar(f"({a.src} / {b.src})", "f")
    if op in ("&", "|", "^"):
        if "f" in kinds:
            raise Unlowerable(f"{op!r} of a float")
        if kinds == ("b", "b"):
            return Scalar(f"({a.src} {op} {b.src})", "b")
        return Scalar(f"({_as_number(a)} {op} {_as_number(b)})", "i")
    if op in ("<<", ">>"):
        if kinds != ("i", "i"):
            raise Unlowerable(f"{op!r} of a non-int")
        return Scalar(f"({a.src} {op} {b.src})", "i")
    raise Unlowerable(f"operator {op!r} (NumPy's and a compiled scalar's results may "
                      f"differ)")


def _as_number(v: Scalar) -> str:
    """A bool operand of arithmetic as an int64 (NumPy's promotion); others
    as they are (int64 and float64 locals, literals)."""
    return f"np.int64({v.src})" if v.kind == "b" else v.src


def _truth(v: Value) -> Scalar:
    v = _scalar(v, "a condition")
    return v if v.kind == "b" else Scalar(f"({v.src} != 0)", "b")


def _select(c: Value, x: Value, y: Value) -> Value:
    if isinstance(x, tuple) or isinstance(y, tuple):
        if not (isinstance(x, tuple) and isinstance(y, tuple)) or len(x) != len(y):
            raise Unlowerable("select of a tuple and a value")
        return tuple(_select(c, a, b) for a, b in zip(x, y))
    x, y = _scalar(x, "select"), _scalar(y, "select")
    kind = _top(x.kind, y.kind)
    cast = {"b": "", "i": "np.int64", "f": "np.float64"}[kind]
    return Scalar(f"({cast}({x.src}) if {_truth(c).src} else {cast}({y.src}))", kind)


def _and_or(which: str, a: Value, b: Value) -> Value:
    a, b = _scalar(a, which), _scalar(b, which)
    if a.kind == "b" and b.kind == "b":
        return Scalar(f"({a.src} {which} {b.src})", "b")
    return _select(a, b, a) if which == "and" else _select(a, a, b)


def _range(counter: Value, stop: Value, step: Value) -> Scalar:
    c, s, t = (_scalar(v, "range") for v in (counter, stop, step))
    return Scalar(f"((({t.src} > 0) and ({c.src} < {s.src})) or "
                  f"(({t.src} < 0) and ({c.src} > {s.src})))", "b")


#: frontend_ops functions, by identity, and their scalar lowering.
_HELPERS = {
    frontend_ops.truth: (1, _truth),
    frontend_ops.logical_not: (1, lambda v: Scalar(f"(not {_truth(v).src})", "b")),
    frontend_ops.logical_and: (2, lambda a, b: _and_or("and", a, b)),
    frontend_ops.logical_or: (2, lambda a, b: _and_or("or", a, b)),
    frontend_ops.select: (3, _select),
    frontend_ops.range_continues: (3, _range),
}


class _Helper:
    def __init__(self, name: str, arity: int, lower: Any) -> None:
        self.name, self.arity, self.lower = name, arity, lower


def _cell_value(function: Any, name: str) -> Any:
    code = function.__code__
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    try:
        return cells[name].cell_contents
    except (KeyError, ValueError):
        raise Unlowerable(f"closure variable {name!r} has no value") from None


def scalar_expression(function: Any, args: Sequence[Value], what: str) -> Value:
    """``function(*args)`` for one thread, as a :class:`Scalar` (or a tuple
    of them).  ``args`` hold the arguments' sources and kinds; ``what``
    names the primop in error messages.  Raises :class:`Unlowerable`."""
    code = getattr(function, "__code__", None)
    if code is None or getattr(function, "__defaults__", None) or \
            getattr(function, "__kwdefaults__", None):
        raise Unlowerable(f"primop {what}: {function!r} is not a plain Python function")
    if code.co_flags & 0x0C:  # *args / **kwargs
        raise Unlowerable(f"primop {what}: takes *args or **kwargs")
    if code.co_argcount != len(args):
        raise Unlowerable(f"primop {what}: takes {code.co_argcount} argument(s), "
                          f"the program passes {len(args)}")
    local: Dict[str, Value] = dict(zip(code.co_varnames, args))
    stack: List[Any] = []
    for ins in dis.get_instructions(function):
        name = ins.opname
        try:
            if name in ("RESUME", "COPY_FREE_VARS", "NOP", "PRECALL", "CACHE"):
                continue
            if name == "PUSH_NULL":
                stack.append(None)
            elif name == "LOAD_FAST":
                if ins.argval not in local:
                    raise Unlowerable(f"local {ins.argval!r} assigned in the function")
                stack.append(local[ins.argval])
            elif name == "LOAD_CONST":
                stack.append(_constant(ins.argval, f"constant {ins.argval!r}"))
            elif name in ("LOAD_DEREF", "LOAD_CLOSURE"):
                value = _cell_value(function, ins.argval)
                if callable(value) and not isinstance(value, np.generic):
                    helper = _HELPERS.get(value)
                    if helper is None:
                        raise Unlowerable(f"calls {ins.argval!r} ({value!r})")
                    stack.append(_Helper(ins.argval, *helper))
                else:
                    stack.append(_constant(value, f"closure variable {ins.argval!r}"))
            elif name == "BINARY_OP":
                b, a = stack.pop(), stack.pop()
                stack.append(_binary(ins.argrepr, a, b))
            elif name == "COMPARE_OP":
                b, a = stack.pop(), stack.pop()
                stack.append(_binary(ins.argrepr, a, b))
            elif name == "UNARY_NEGATIVE":
                v = _scalar(stack.pop(), "unary '-'")
                if v.kind == "b":
                    raise Unlowerable("unary '-' of a bool")
                stack.append(Scalar(f"(-{v.src})", v.kind))
            elif name == "UNARY_INVERT":
                v = _scalar(stack.pop(), "'~'")
                if v.kind == "f":
                    raise Unlowerable("'~' of a float")
                stack.append(Scalar(f"(not {v.src})", "b") if v.kind == "b"
                             else Scalar(f"(~{v.src})", "i"))
            elif name == "BINARY_SUBSCR":
                index, value = stack.pop(), stack.pop()
                if not isinstance(value, tuple):
                    raise Unlowerable("indexes a value that is not a tuple (per thread)")
                if not (isinstance(index, Scalar) and index.kind == "i"
                        and re.fullmatch(r"-?\d+", index.src)):
                    raise Unlowerable("indexes a tuple with a non-constant")
                stack.append(value[int(index.src)])
            elif name == "BUILD_TUPLE":
                n = ins.argval
                items = tuple(stack[len(stack) - n:]) if n else ()
                del stack[len(stack) - n:]
                stack.append(items)
            elif name == "CALL":
                n = ins.argval
                call_args = stack[len(stack) - n:] if n else []
                del stack[len(stack) - n:]
                callee = stack.pop()
                if callee is None and stack and isinstance(stack[-1], _Helper):
                    callee = stack.pop()
                elif stack and stack[-1] is None:
                    stack.pop()
                if not isinstance(callee, _Helper) or callee.arity != n:
                    raise Unlowerable("calls a function the native engine does not know")
                stack.append(callee.lower(*call_args))
            elif name == "RETURN_VALUE":
                result = stack.pop()
                _check_value(result)
                return result
            else:
                raise Unlowerable(f"Python bytecode {name} "
                                  f"({ins.argrepr or ins.argval})")
        except Unlowerable as exc:
            raise Unlowerable(f"primop {what}: {exc}") from None
        except (IndexError, TypeError, ValueError) as exc:  # malformed for us
            raise Unlowerable(f"primop {what}: unexpected bytecode ({exc})") from None
    raise Unlowerable(f"primop {what}: no return")


def _check_value(value: Any) -> None:
    if isinstance(value, tuple):
        for v in value:
            _check_value(v)
    elif not isinstance(value, Scalar):
        raise Unlowerable(f"returns {value!r}")


def leaves(value: Value) -> List[Scalar]:
    """The scalars of a (nested) tuple value, in order."""
    if isinstance(value, tuple):
        out: List[Scalar] = []
        for v in value:
            out.extend(leaves(v))
        return out
    return [value]

