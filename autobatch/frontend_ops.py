"""Batched meanings of Python's boolean operators, for primops the frontend writes.

Python's ``and``, ``or``, ``not``, ``a if c else b``, chained comparisons and
``if x:`` ask one value for its truth; on a batch of values they must ask each
thread.  The frontend (:mod:`autobatch.frontend_ast`) rewrites them into calls
of the functions below, which work on Python scalars, NumPy arrays, TensorFlow
tensors and JAX arrays (traced ones included) alike (neither TensorFlow nor
JAX is imported here: a tensor or JAX array is recognised by its type's
module).

Values are batched: a leading batch dimension, one row per thread.  A
*condition* is one truth value per thread: a boolean array ``[batch]`` (or
a number, meaning ``!= 0``, as in Python), or a scalar for every thread.

Value semantics follow Python, thread by thread: ``a and b`` is ``b`` where
``a`` is true and ``a`` elsewhere; ``a or b`` is ``a`` where ``a`` is true,
``b`` elsewhere.  Both sides are computed for every thread (the frontend
only calls these where neither side calls a batched function; otherwise it
emits real branches that skip the other side).
"""
from __future__ import annotations

import numbers
import sys
from typing import Any

import numpy as np

from autobatch.ir import is_namedtuple, rebuild

__all__ = ["truth", "logical_not", "logical_and", "logical_or", "select", "range_continues"]


def _is_tf(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow")


def _tf() -> Any:
    return sys.modules["tensorflow"]


def _is_jax(value: Any) -> bool:
    """A JAX array or tracer (under ``jit``/``vmap``: no NumPy conversion)."""
    module = type(value).__module__
    return module.startswith("jax") or module.startswith("jaxlib")


def _np(*values: Any) -> Any:
    """The array module for ``values``: ``jax.numpy`` where one is a JAX
    array (or tracer), else NumPy."""
    return sys.modules["jax.numpy"] if any(_is_jax(v) for v in values) else np


def _is_python_scalar(value: Any) -> bool:
    return isinstance(value, (bool, numbers.Number)) and not isinstance(value, np.generic)


def truth(value: Any) -> Any:
    """One boolean per thread: ``value`` itself where it is boolean, else
    ``value != 0`` (Python's truth of a number).  Raises TypeError for a
    value with more than one element per thread (Python would too: the truth
    of an array is ambiguous) and for tuples."""
    if isinstance(value, (tuple, list)):
        raise TypeError("a condition must be one boolean per thread, got a tuple; "
                        "test one of its parts")
    if _is_python_scalar(value):
        return bool(value)
    if _is_tf(value):
        tf = _tf()
        if value.shape.rank is not None and value.shape.rank > 1:
            raise TypeError(f"a condition must be one boolean per thread, got a tensor of "
                            f"shape {value.shape} (batch first); reduce it first, e.g. "
                            f"with tf.reduce_any(x, axis=-1)")
        return value if value.dtype == tf.bool else tf.not_equal(value, 0)
    xp = _np(value)
    array = xp.asarray(value)
    if array.ndim > 1:
        raise TypeError(f"a condition must be one boolean per thread, got an array of "
                        f"shape {array.shape} (batch first); reduce it first, e.g. with "
                        f"np.any(x, axis=-1)")
    return array if array.dtype == np.bool_ else xp.not_equal(array, 0)


def logical_not(value: Any) -> Any:
    """``not value``, per thread."""
    cond = truth(value)
    if isinstance(cond, bool):
        return not cond
    if _is_tf(cond):
        return _tf().logical_not(cond)
    return _np(cond).logical_not(cond)


def _is_bool(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    if _is_tf(value):
        return dtype == _tf().bool
    return dtype == np.bool_


def logical_and(a: Any, b: Any) -> Any:
    """``a and b``, per thread (``b`` where ``a`` is true, else ``a``)."""
    if _is_bool(a) and _is_bool(b):
        if isinstance(a, bool) and isinstance(b, bool):
            return a and b
        if _is_tf(a) or _is_tf(b):
            return _tf().logical_and(a, b)
        return _np(a, b).logical_and(a, b)
    return select(a, b, a)


def logical_or(a: Any, b: Any) -> Any:
    """``a or b``, per thread (``a`` where ``a`` is true, else ``b``)."""
    if _is_bool(a) and _is_bool(b):
        if isinstance(a, bool) and isinstance(b, bool):
            return a or b
        if _is_tf(a) or _is_tf(b):
            return _tf().logical_or(a, b)
        return _np(a, b).logical_or(a, b)
    return select(a, a, b)


def _ndim(value: Any) -> int:
    if _is_python_scalar(value):
        return 0
    shape = getattr(value, "shape", None)
    if shape is None:
        return np.ndim(value)
    rank = len(shape) if not _is_tf(value) else shape.rank
    return int(rank or 0)


def select(cond: Any, x: Any, y: Any) -> Any:
    """``x if cond else y``, per thread; tuples part by part.  ``cond`` is
    broadcast over the trailing (per-thread) dimensions of ``x`` and ``y``."""
    if isinstance(x, tuple) or isinstance(y, tuple):
        if not (isinstance(x, tuple) and isinstance(y, tuple)) or len(x) != len(y):
            raise TypeError("the two sides of a conditional expression are tuples of "
                            "different lengths (or a tuple and a value)")
        return rebuild(x if is_namedtuple(x) else y, (select(cond, a, b) for a, b in zip(x, y)))
    cond = truth(cond)
    if isinstance(cond, bool):
        return x if cond else y
    rank = max(_ndim(x), _ndim(y))
    if _is_tf(cond) or _is_tf(x) or _is_tf(y):
        tf = _tf()
        if tf.is_tensor(x) and not tf.is_tensor(y):
            y = tf.convert_to_tensor(y, dtype=x.dtype)
        elif tf.is_tensor(y) and not tf.is_tensor(x):
            x = tf.convert_to_tensor(x, dtype=y.dtype)
        cond = tf.convert_to_tensor(cond)
        for _ in range(rank - _ndim(cond)):
            cond = cond[..., None]
        return tf.where(cond, x, y)
    xp = _np(cond, x, y)
    cond = xp.asarray(cond)
    cond = cond.reshape(cond.shape + (1,) * (rank - cond.ndim))
    return xp.where(cond, x, y)


def range_continues(counter: Any, stop: Any, step: Any) -> Any:
    """Whether ``for i in range(start, stop, step)`` runs another pass with
    ``i == counter``, for a step whose sign is known only at run time (a zero
    step stops at once, where Python would raise)."""
    up = logical_and(step > 0, counter < stop)
    down = logical_and(step < 0, counter > stop)
    return logical_or(up, down)
