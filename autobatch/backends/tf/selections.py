"""How a step names the threads at a block: gathered rows (:class:`Rows`)
or, under XLA, a static bucket of packed rows (:class:`Bucket`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf


class Rows:
    """A gathering backend's selection: ``rows``, the ``[n]`` (int64) indices
    of the selected threads, with per-trace caches of the ops derived from it
    (the count, flat stack indices).

    Indices are 1-D so that registers use ``ResourceGather`` /
    ``ResourceScatterUpdate`` and stacks (stored flat, ``[batch * frames,
    ...]``) are indexed by ``row * frames + frame``: measured 3x faster per
    selected thread than the N-d gathers and scatters.
    """

    __slots__ = ("rows", "_count", "_flat")

    def __init__(self, rows: tf.Tensor) -> None:
        self.rows = rows
        self._count: Optional[tf.Tensor] = None
        self._flat: Dict[Tuple[int, int], Tuple[Any, tf.Tensor]] = {}

    def count(self) -> tf.Tensor:
        """``[n]``: the shape of a value of the selection (as a 1-element tensor)."""
        if self._count is None:
            self._count = tf.shape(self.rows, out_type=tf.int64)
        return self._count

    def flat_indices(self, frame: tf.Tensor, frames: int) -> tf.Tensor:
        """``[n]`` indices ``row * frames + frame`` into a flattened
        ``[batch * frames, ...]`` stack."""
        cached = self._flat.get((id(frame), frames))
        if cached is None or cached[0] is not frame:
            cached = (frame, self.rows * frames + tf.cast(frame, tf.int64))
            self._flat[(id(frame), frames)] = cached
        return cached[1]


class Bucket:
    """A bucketing backend's selection (XLA): the selected threads packed
    first into ``rows``, ``[m]`` thread indices for a static bucket size
    ``m``, and ``valid`` (``[m]`` bool), which of those slots hold a
    selected thread.  Values read through it have ``m`` rows, so a block's
    primops compute on about as many threads as it runs, not on the whole
    batch; writes scatter the valid rows back (the others go out of range,
    which XLA's scatters drop)."""

    __slots__ = ("rows", "valid", "batch")

    def __init__(self, rows: tf.Tensor, valid: tf.Tensor, batch: int) -> None:
        self.rows, self.valid, self.batch = rows, valid, batch

    def targets(self) -> tf.Tensor:
        """``[m]`` rows to write: the thread, or ``batch`` (dropped) for an
        invalid slot."""
        return tf.where(self.valid, self.rows, self.batch)

    def narrowed(self, keep: tf.Tensor) -> "Bucket":
        return Bucket(self.rows, tf.logical_and(self.valid, keep), self.batch)


#: Bucket sizes as fractions of the batch (each costs a compiled copy of
#: every block).
BUCKET_DIVISORS = (4, 1)


def bucket_sizes(batch: int) -> List[int]:
    """The static bucket sizes for ``batch`` threads: ``ceil(batch / d)``
    for d in :data:`BUCKET_DIVISORS`, ascending, without repeats."""
    return sorted({max(1, -(-batch // d)) for d in BUCKET_DIVISORS})
