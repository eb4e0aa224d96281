"""Types and allocations: what a variable holds and how the executor stores it.

:class:`TensorType` is a dtype and a shape *without* the batch dimension;
:class:`Type` is a pattern of them.  :class:`VariableAllocation` says how the
batched executor stores a variable (NULL < TEMPORARY < REGISTER < FULL);
:mod:`autobatch.allocation_strategy` chooses it.
"""
from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from autobatch.ir.patterns import (
    as_pattern,
    format_pattern,
    is_namedtuple,
    pattern_leaves,
    pattern_map,
)


def _as_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        numpy_dtype = getattr(dtype, "as_numpy_dtype", None)  # tf.DType
        if numpy_dtype is None:
            raise
        return np.dtype(numpy_dtype)


@dataclass(frozen=True)
class TensorType:
    """A dtype and a shape of one thread's value (no batch dimension).

    ``weak`` marks the type of a Python scalar constant (``1``, ``0.5``,
    ``True``): where a variable is also written with a value of a real dtype,
    the constant takes that dtype (as NumPy 2 does with Python scalars).
    Variables' final types are never weak.
    """

    dtype: np.dtype
    shape: Tuple[int, ...] = ()
    weak: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def strong(self) -> "TensorType":
        """The same type, not weak."""
        return replace(self, weak=False) if self.weak else self

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{'~' if self.weak else ''}{self.dtype.name}[{dims}]"


def numpy_type_of(value: Any, batch_size: int) -> TensorType:
    """The per-thread type of a NumPy value a primop returned for
    ``batch_size`` threads.

    A constant (no batch dimension: a Python scalar, a NumPy scalar, a 0-d
    array) has a *weak* type: where its variable is also written with, or
    declared as, another dtype of a compatible kind, the constant takes that
    dtype (TFP types constants by the dtype their variable prefers).  An
    array's leading dimension must be ``batch_size`` (TypeError otherwise).
    """
    if isinstance(value, (bool, numbers.Number)) and not isinstance(value, np.generic):
        return TensorType(np.asarray(value).dtype, (), weak=True)
    array = np.asarray(value)
    if array.ndim == 0:
        return TensorType(array.dtype, (), weak=True)
    if array.shape[0] != batch_size:
        raise TypeError(f"a primop returned an array of shape {array.shape} for "
                        f"{batch_size} thread(s); outputs must have the batch "
                        f"dimension first, or be scalars")
    return TensorType(array.dtype, array.shape[1:])


@dataclass(frozen=True)
class Type:
    """The type of a variable: a :class:`TensorType` or a nested tuple of them."""

    tensors: Any

    def __post_init__(self) -> None:
        # TFP writes patterns with lists too: they are structure, as tuples.
        object.__setattr__(self, "tensors", as_pattern(self.tensors))
        for leaf in pattern_leaves(self.tensors):
            if not isinstance(leaf, TensorType) and leaf is not None:
                raise TypeError(f"Type leaves must be TensorType (or None: not known yet, "
                                f"as TFP's Type(None)), got {leaf!r}")

    def leaves(self) -> List[TensorType]:
        """The tensor types, in pattern order (one per stored array)."""
        return pattern_leaves(self.tensors)

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.tensors, tuple)

    def strong(self) -> "Type":
        return Type(pattern_map(TensorType.strong, self.tensors))

    def _key(self) -> Any:
        # A namedtuple equals a plain tuple of the same parts; their Types must
        # not be equal (a primop reads fields by name).
        def kinds(p: Any) -> Any:
            if isinstance(p, tuple):
                return (type(p) if is_namedtuple(p) else tuple, tuple(kinds(q) for q in p))
            return None
        return self.tensors, kinds(self.tensors)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Type) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return format_pattern(pattern_map(str, self.tensors))


def single_type(dtype: Any, shape: Sequence[int]) -> Type:
    """TFP's ``single_type``: the Type of one tensor."""
    return Type(TensorType(dtype, tuple(shape)))


class VariableAllocation(enum.IntEnum):
    """How the batched executor stores a variable; ordered, so ``max`` upgrades.

    NULL: holds nothing; writes are dropped and a read raises
        :class:`~autobatch.errors.NullVariableError` (nothing reads it).
    TEMPORARY: one value per thread that lives only inside one block run:
        never live across a block boundary, so it needs no storage.
    REGISTER: one value per thread, kept across blocks; not live across a
        call that may overwrite it.
    FULL: a register plus one slot per stack frame, per thread: live across a
        call to a function that may (transitively) write it.
    """

    NULL = 0
    TEMPORARY = 1
    REGISTER = 2
    FULL = 3

    @classmethod
    def _missing_(cls, value: Any) -> Optional["VariableAllocation"]:
        """TFP's ``VariableAllocation('full')``: a name (any case) gives the member."""
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        return None

    def __str__(self) -> str:
        return self.name

def _as_allocation(value: Any) -> "VariableAllocation":
    """A VariableAllocation from itself, its value or its name."""
    if isinstance(value, str):
        return VariableAllocation[value.upper()]
    return VariableAllocation(value)
