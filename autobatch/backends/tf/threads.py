"""Reading and writing the threads at a block: select, read, write, frames,
split and merge at a branch, calls; and XLA's phases (static shapes that
shrink with the running threads)."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from autobatch.backends.tf.selections import Bucket, Rows
from autobatch.backends.tf.support import (
    PHASE_DIVISOR,
    _is_python_scalar,
    _is_variable,
    _scalar_program,
    _storage_shape,
    _tf_dtype,
    _variable_dtype,
)
from autobatch.ir import TensorType


class Threads:
    """Reading and writing the threads at a block: select, read, write, frames,
    split and merge at a branch, calls; and XLA's phases (static shapes that
    shrink with the running threads)."""

    def select(self, pc: Any, block: int) -> Any:
        hit = tf.equal(self.to_numpy(pc), block)
        if self._bucket is not None:
            return self._pack(hit, self._bucket)
        if self.masked:
            return hit
        return Rows(tf.reshape(tf.where(hit), [-1]))

    @staticmethod
    def _pack(hit: tf.Tensor, size: int) -> Bucket:
        """The threads where ``hit`` holds, packed in order into ``size``
        slots (a running count places each; the VM picks a bucket that holds
        them all)."""
        batch = hit.shape[0]
        hits = tf.cast(hit, tf.int32)
        slot = tf.where(hit, tf.cumsum(hits) - 1, size)
        rows = tf.tensor_scatter_nd_update(tf.zeros([size], tf.int32), slot[:, None],
                                           tf.range(batch, dtype=tf.int32))
        valid = tf.range(size, dtype=tf.int32) < tf.reduce_sum(hits)
        return Bucket(rows, valid, batch)

    def read(self, array: Any, selection: Any) -> tf.Tensor:
        if isinstance(selection, Bucket):
            return tf.gather(array, selection.rows)
        if self.masked:
            return array
        if _is_variable(array):
            return tf.raw_ops.ResourceGather(resource=array, indices=selection.rows,
                                             dtype=_variable_dtype(array))
        return tf.gather(array, selection.rows)

    @staticmethod
    def _cast(value: Any, dtype: tf.DType) -> tf.Tensor:
        if tf.is_tensor(value):
            return value if value.dtype == dtype else tf.cast(value, dtype)
        return tf.constant(np.asarray(value, dtype=dtype.as_numpy_dtype))

    @staticmethod
    def _rows(mask: tf.Tensor, rank: int) -> tf.Tensor:
        """``mask`` [n] reshaped to broadcast against a rank-``rank`` array."""
        for _ in range(rank - 1):
            mask = mask[..., None]
        return mask

    @staticmethod
    def _fill_shape(value: tf.Tensor, count: tf.Tensor, row_shape: Sequence[int]) -> tf.Tensor:
        """``value`` as ``count`` rows of ``row_shape`` (no-op when it has
        them): a constant (no batch dimension) or one row (a leading
        dimension of 1, as TFP's primops return ``tf.constant([0])``) is
        broadcast."""
        if value.shape.rank == 1 + len(row_shape) and value.shape[0] != 1:
            return value
        if not row_shape and value.shape.rank == 0:
            return tf.fill(count, value)
        row = tf.constant(tuple(row_shape), tf.int64)
        return tf.broadcast_to(value, tf.concat([count, row], 0))

    def write(self, array: Any, selection: Any, value: Any) -> Any:
        if _is_variable(array):
            shape = _storage_shape(array)
            value = self._cast(value, _variable_dtype(array))
            value = self._fill_shape(value, selection.count(), shape[1:])
            tf.raw_ops.ResourceScatterUpdate(resource=array, indices=selection.rows,
                                             updates=value)
            return array
        value = self._cast(value, array.dtype)
        if isinstance(selection, Bucket):
            value = self._fill_shape(value, tf.shape(selection.rows, out_type=tf.int64),
                                     array.shape[1:])
            return tf.tensor_scatter_nd_update(array, selection.targets()[:, None], value)
        if self.masked:
            return tf.where(self._rows(selection, array.shape.rank), value, array)
        value = self._fill_shape(value, selection.count(), array.shape[1:])
        return tf.tensor_scatter_nd_update(array, selection.rows[:, None], value)

    def _frames(self, stack: tf.Tensor, frame: Any) -> tf.Tensor:
        frame = self._cast(frame, tf.int32)
        if self.masked and self.mode != "xla":
            # Threads outside the selection hold any depth (-1 after main
            # returned); TensorFlow's gathers reject such indices, XLA's clamp
            # them and its scatters drop them.
            frame = tf.clip_by_value(frame, 0, stack.shape[1] - 1)
        return frame

    def read_frame(self, stack: Any, selection: Any, frame: Any) -> tf.Tensor:
        frame = self._frames(stack, frame)
        if isinstance(selection, Bucket):
            frame = tf.broadcast_to(frame, tf.shape(selection.rows))
            return tf.gather_nd(stack, tf.stack([selection.rows, frame], axis=1))
        if self.masked:
            return tf.gather(stack, frame, batch_dims=1)
        flat = selection.flat_indices(frame, self._frames_of(stack))
        if _is_variable(stack):
            return tf.raw_ops.ResourceGather(resource=stack, indices=flat,
                                             dtype=_variable_dtype(stack))
        return tf.gather(self._flatten(stack), flat)

    def write_frame(self, stack: Any, selection: Any, frame: Any, value: Any) -> Any:
        frame = self._frames(stack, frame)
        if _is_variable(stack):
            flat = selection.flat_indices(frame, self._frames_of(stack))
            value = self._cast(value, _variable_dtype(stack))
            value = self._fill_shape(value, selection.count(), _storage_shape(stack)[1:])
            tf.raw_ops.ResourceScatterUpdate(resource=stack, indices=flat, updates=value)
            return stack
        value = self._cast(value, stack.dtype)
        if isinstance(selection, Bucket):
            frame = tf.broadcast_to(frame, tf.shape(selection.rows))
            value = self._fill_shape(value, tf.shape(selection.rows, out_type=tf.int64),
                                     stack.shape[2:])
            indices = tf.stack([selection.targets(), frame], axis=1)
            return tf.tensor_scatter_nd_update(stack, indices, value)
        if not self.masked:
            flat = selection.flat_indices(frame, self._frames_of(stack))
            value = self._fill_shape(value, selection.count(), stack.shape[2:])
            updated = tf.tensor_scatter_nd_update(self._flatten(stack), flat[:, None], value)
            return tf.reshape(updated, tf.shape(stack))
        threads = tf.range(tf.shape(stack)[0], dtype=tf.int32)
        if self.mode == "xla":
            # Unselected threads point past the last frame: XLA drops those updates.
            frame = tf.where(selection, frame, stack.shape[1])
        else:
            old = tf.gather(stack, frame, batch_dims=1)
            value = tf.where(self._rows(selection, old.shape.rank), value, old)
        value = tf.broadcast_to(value, tf.concat([tf.shape(threads), tf.shape(stack)[2:]], 0))
        indices = tf.stack([threads, tf.broadcast_to(frame, tf.shape(threads))], axis=1)
        return tf.tensor_scatter_nd_update(stack, indices, value)

    @staticmethod
    def _flatten(stack: tf.Tensor) -> tf.Tensor:
        """A ``[batch, frames, ...]`` stack tensor as ``[batch * frames, ...]``."""
        return tf.reshape(stack, tf.concat([[-1], tf.shape(stack)[2:]], 0))

    def where(self, condition: Any, x: Any, y: Any, name: Any = None) -> tf.Tensor:
        return tf.where(condition, x, y)

    def split(self, selection: Any, cond: Any) -> Tuple[Any, ...]:
        """Mask and bucket: ``(selection, cond)``.  Gather: ``(selection, positions of
        the true threads in it, positions of the false ones)``, positions as
        ``[n]`` indices."""
        cond = tf.convert_to_tensor(cond, tf.bool)
        if self.masked:
            return selection, cond
        if cond.shape.rank == 0:
            cond = tf.fill(selection.count(), cond)
        return (selection, tf.reshape(tf.where(cond), [-1]),
                tf.reshape(tf.where(tf.logical_not(cond)), [-1]))

    def part(self, split: Tuple[Any, ...], side: bool) -> Any:
        if isinstance(split[0], Bucket):
            selection, cond = split
            return selection.narrowed(cond if side else tf.logical_not(cond))
        if self.masked:
            selection, cond = split
            return tf.logical_and(selection, cond if side else tf.logical_not(cond))
        return Rows(tf.gather(split[0].rows, split[1] if side else split[2]))

    def narrow(self, value: Any, split: Tuple[Any, ...], side: bool) -> Any:
        if self.masked or _is_python_scalar(value) or len(getattr(value, "shape", ())) == 0:
            return value
        return tf.gather(value, split[1] if side else split[2])

    def merge(self, split: Tuple[Any, ...], if_true: Any, if_false: Any,
              tensor_type: TensorType) -> tf.Tensor:
        dtype = _tf_dtype(tensor_type.dtype)
        if_true, if_false = self._cast(if_true, dtype), self._cast(if_false, dtype)
        if self.masked:
            cond = split[1]
            if cond.shape.rank:
                cond = self._rows(cond, 1 + len(tensor_type.shape))
            return tf.where(cond, if_true, if_false)
        rank = 1 + len(tensor_type.shape)
        positions, parts = [], []
        for at, value in ((split[1], if_true), (split[2], if_false)):
            index = tf.cast(at, tf.int32)
            if value.shape.rank != rank or value.shape[0] == 1:
                value = tf.broadcast_to(value, tf.concat([tf.shape(index), tensor_type.shape],
                                                         axis=0))
            positions.append(index)
            parts.append(value)
        return tf.dynamic_stitch(positions, parts)

    def callee_pc(self, selection: Any, entry: int, halt: int) -> tf.Tensor:
        if isinstance(selection, Bucket):
            selection = selection.valid
        if self.masked:
            return tf.where(selection, tf.constant(entry, tf.int32), tf.constant(halt, tf.int32))
        return tf.fill(selection.count(), tf.constant(entry, tf.int32))

    # -- phases (XLA: static shapes that shrink with the running threads) ---------------
    def phase_sizes(self, batch: int, lowered: Any) -> List[int]:
        """Row counts the VM packs the running threads into as they halt
        (:meth:`VirtualMachine._run_phases`): XLA runs of programs of
        per-thread scalars over at least ``phase_min_batch`` threads get
        one phase at an eighth of the batch; nothing otherwise (each phase is
        one more compiled copy of the loop)."""
        if self.mode != "xla" or batch < self.phase_min_batch:
            return []
        if not _scalar_program(lowered):
            return []
        return [-(-batch // PHASE_DIVISOR)]

    def more_running(self, more: Any, pc: Any, halt: int, limit: int) -> tf.Tensor:
        """``more`` and more than ``limit`` threads still running."""
        running = tf.reduce_sum(tf.cast(tf.less(self.to_numpy(pc), halt), tf.int32))
        return tf.logical_and(more, running > limit)

    def pack_running(self, pc: Any, halt: int, size: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(rows, valid)``: the running threads packed into ``size`` slots."""
        packed = self._pack(tf.less(self.to_numpy(pc), halt), size)
        return packed.rows, packed.valid

    @staticmethod
    def inert_rows(rows: tf.Tensor, valid: tf.Tensor, batch: int) -> tf.Tensor:
        """``rows``, with ``batch`` (out of range: writes dropped) where not valid."""
        return tf.where(valid, rows, batch)

    @staticmethod
    def take_rows(array: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
        return tf.gather(array, rows)

    @staticmethod
    def put_rows(array: tf.Tensor, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """``array`` with ``values`` written at ``rows`` (out-of-range rows dropped)."""
        return tf.tensor_scatter_nd_update(array, rows[:, None], tf.cast(values, array.dtype))

    @staticmethod
    def is_storage(value: Any) -> bool:
        """A per-thread array of the loop state (not a scalar like the step count)."""
        return tf.is_tensor(value) and value.shape.rank is not None and value.shape.rank >= 1
