"""Batched arguments: their batch size and the per-thread types they imply.

Shared by every executor (:mod:`autobatch.pipeline` re-exports both; the
fused-loop engine, :mod:`autobatch.fused`, takes them from here so that it
does not import the pipeline that imports it).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from autobatch.errors import ProgramError
from autobatch.ir import TensorType, Type, as_pattern, pattern_leaves, pattern_map

__all__ = ["DEFAULT_MAX_STACK_DEPTH", "batch_size", "argument_types", "lists_as_arrays"]

#: Default bound on pending calls per thread (as in TFP's auto_batching).
DEFAULT_MAX_STACK_DEPTH = 15


def _shape(value: Any) -> Tuple[int, ...]:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else np.shape(value)


def batch_size(args: Sequence[Any], types: Sequence[Type], backend: Any = None) -> Any:
    """The batch size of arguments of the given per-thread types: the leading
    dimension of the leaves that have one beyond their type's shape (size 1
    broadcasts); 1 where none has.  Raises ProgramError for two sizes.

    Where no leaf's batch dimension is static but one's is unknown (a TF1
    placeholder of shape ``[None, ...]``), ``backend.batch_size`` of that
    leaf: a scalar tensor (given a ``backend``)."""
    sizes = set()
    unknown = None
    for arg, typ in zip(args, types):
        leaves = pattern_leaves(as_pattern(arg))
        if len(leaves) != len(typ.leaves()):
            raise ProgramError(f"an argument has {len(leaves)} part(s); its type {typ} "
                               f"has {len(typ.leaves())}")
        for leaf, leaf_type in zip(leaves, typ.leaves()):
            shape = _shape(leaf)
            if len(shape) == len(leaf_type.shape) + 1 and shape[0] is None:
                unknown = leaf
            elif len(shape) == len(leaf_type.shape) + 1 and shape[0] != 1:
                sizes.add(shape[0])
    if len(sizes) > 1:
        raise ProgramError(f"arguments have different batch sizes {sorted(sizes)}; "
                           f"give them one batch size (size-1 and scalars broadcast)")
    if sizes:
        return sizes.pop()
    return backend.batch_size(unknown) if unknown is not None and backend is not None else 1


def argument_types(args: Sequence[Any], backend: Any) -> List[Type]:
    """The per-thread Type of each batched argument: a leaf with a leading
    batch dimension has type ``(dtype, shape[1:])``; a 0-d leaf (broadcast to
    every thread) has type ``(dtype, ())``."""
    def leaf_type(leaf: Any) -> TensorType:
        shape = _shape(leaf)
        # By keyword: an unknown batch dimension (None, a TF1 placeholder's
        # [None, ...]) is still autobatch's batch_size, not TFP's dtype_hint.
        return backend.type_of(leaf, batch_size=shape[0] if shape else 1).strong()
    return [Type(pattern_map(leaf_type, as_pattern(a))) for a in args]


def lists_as_arrays(args: Sequence[Any], types: Sequence[Any]) -> List[Any]:
    """``args`` with each list given for a parameter whose type (``types``,
    None where unknown) is a single tensor made an array of that dtype
    (TFP's tests pass batches as lists; a list is otherwise a tuple value)."""
    out = list(args)
    for i, typ in enumerate(list(types)[:len(out)]):
        if isinstance(out[i], list) and typ is not None and isinstance(typ.tensors, TensorType):
            out[i] = np.asarray(out[i], dtype=typ.tensors.dtype)
    return out
