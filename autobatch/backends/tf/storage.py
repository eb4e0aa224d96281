"""Registers and stacks: made as tensors, or (graph mode, gathering) as
anonymous resource variables updated in place."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from autobatch.backends.tf.support import (
    _ANONYMOUS,
    SPARE_FRAMES,
    _is_variable,
    _storage_shape,
    _tf_dtype,
    _variable_dtype,
)
from autobatch.backends.tfp_api import accept_tfp_arguments
from autobatch.ir import TensorType


class Storage:
    """Registers and stacks: made as tensors, or (graph mode, gathering) as
    anonymous resource variables updated in place."""

    def fill(self, tensor_type: TensorType, batch_size: int, value: Any = 0) -> Any:
        scalar = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        array = tf.fill((batch_size,) + tensor_type.shape, scalar)
        return self._maybe_variable(array)

    def stack(self, tensor_type: TensorType, batch_size: int, frames: int,
              value: Any = 0) -> Any:
        """``[batch, frames, ...]``; gathering backends add spare frames, so that
        the pushes of a step whose overflow check failed (the run stops after
        it) stay in range without clipping every frame index."""
        if not self.masked:
            frames += SPARE_FRAMES
        scalar = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        array = tf.fill((batch_size, frames) + tensor_type.shape, scalar)
        if not self._in_variables():
            return array
        # A variable cannot be reshaped: it holds the stack flat,
        # [batch * frames, ...], and the frame count is kept beside it.
        handle = self._maybe_variable(tf.reshape(array, (batch_size * frames,)
                                                 + tensor_type.shape))
        self._stack_frames[id(handle)] = (handle, frames)
        return handle

    def size(self, array: Any) -> int:
        """Threads in a register (not a stack)."""
        dim = _storage_shape(array)[0]
        return int(dim) if dim is not None else tf.shape(array)[0]

    def _frames_of(self, stack: Any) -> int:
        """Frames per thread of a stack (tensor ``[batch, frames, ...]`` or
        flat variable)."""
        if _is_variable(stack):
            kept = self._stack_frames[id(stack)]
            assert kept[0] is stack
            return kept[1]
        return stack.shape[1]

    def as_batched(self, value: Any, tensor_type: TensorType, batch_size: int) -> Any:
        dtype = _tf_dtype(tensor_type.dtype)
        if tf.is_tensor(value):
            tensor = tf.cast(value, dtype)
        else:
            tensor = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        if tensor.shape.rank == len(tensor_type.shape):
            tensor = tensor[None]
        # tf.identity: a new tensor even where no broadcast is needed (tensors
        # are immutable, so aliasing the user's value is harmless anyway).
        array = tf.identity(tf.broadcast_to(tensor, (batch_size,) + tensor_type.shape))
        return self._maybe_variable(array)

    def to_numpy(self, value: Any) -> Any:
        """Results stay tensors (EagerTensors outside a graph)."""
        if _is_variable(value):
            return tf.raw_ops.ReadVariableOp(resource=value, dtype=_variable_dtype(value))
        return value

    def _in_variables(self) -> bool:
        """Whether storage made now lives in resource variables (graph mode,
        gathering, while tracing)."""
        return self._variables and self._variables_ok and not tf.executing_eagerly()

    def _maybe_variable(self, array: tf.Tensor) -> Any:
        """``array``, or (graph mode, gathering, inside a graph) a new anonymous
        resource variable holding it.

        TensorFlow's graph executor copies a tensor that a scatter updates
        (inside a while loop the buffer is never forwarded), so every push to
        a tensor stack would cost the whole stack; a variable is updated in
        place (``ResourceScatterNdUpdate``): O(selected threads).  The loop
        captures variables instead of carrying them (fewer loop variables and
        graph nodes per step).  Anonymous: freed with the run's last handle.
        """
        if not self._in_variables():
            return array
        handle = tf.raw_ops.VarHandleOp(dtype=array.dtype, shape=array.shape,
                                        shared_name=_ANONYMOUS)
        tf.raw_ops.AssignVariableOp(resource=handle, value=array)
        return handle


# Storage's own definitions of TFP's shared names (fill, type_of, while_loop,
# switch_case) also take TFP's argument lists (autobatch.backends.tfp_api).
accept_tfp_arguments(Storage)
