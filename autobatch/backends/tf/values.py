"""Types of primop results, type inference's placeholders, and the array
work of TFP's variable objects (:mod:`autobatch.backends.variables`)."""
from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from autobatch.backends.base import dummies_for
from autobatch.backends.tf.support import (
    _is_python_scalar,
    _legacy_graph,
    _tf_dtype,
)
from autobatch.backends.tfp_api import accept_tfp_arguments
from autobatch.ir import TensorType


class Values:
    """Types of primop results, type inference's placeholders, and the array
    work of TFP's variable objects (:mod:`autobatch.backends.variables`)."""

    def type_of(self, value: Any, batch_size: int) -> TensorType:
        if _is_python_scalar(value):
            return TensorType(np.asarray(value).dtype, (), weak=True)
        if tf.is_tensor(value):
            shape = tuple(value.shape)
            dtype = value.dtype.as_numpy_dtype
        else:
            array = np.asarray(value)
            shape, dtype = array.shape, array.dtype
        if len(shape) == 0:  # a constant: takes its variable's dtype (see numpy_type_of)
            return TensorType(dtype, (), weak=True)
        if shape[0] == 1 and batch_size != 1 and None not in shape[1:]:
            # One row, broadcast to every thread (TFP's ``tf.constant([0])``).
            return TensorType(dtype, shape[1:])
        if shape[0] != batch_size or None in shape[1:]:
            raise TypeError(f"a primop returned a value of shape {shape} for {batch_size} "
                            f"thread(s); outputs must have the batch dimension first, or "
                            f"be scalars, and a static shape per thread")
        return TensorType(dtype, shape[1:])

    def run_on_dummies(self, primitive_callable: Callable[..., Any],
                       input_types: Sequence[Any]) -> Any:
        """``primitive_callable(*input_types)``; in a TF1 graph, as TF2 code (eagerly), so
        that type inference sees what the run (traced as TF2 code, see
        :meth:`_run_in_users_graph`) computes: ``==`` on tensors is
        elementwise there, identity in TF1 graphs."""
        inputs = dummies_for(self, input_types)
        if _legacy_graph(tf.compat.v1.get_default_graph()):
            try:
                with context.eager_mode():
                    eager = tf.nest.map_structure(
                        lambda v: tf.ones(v.shape, v.dtype) if tf.is_tensor(v) else v, inputs)
                    return primitive_callable(*eager)
            except TypeError as exc:
                if "out of scope" not in str(exc):
                    raise
                # The primitive closes over a tensor of the user's TF1 graph
                # (TypeError "... is out of scope"): it runs in that graph, as
                # TFP's run_on_dummies always does.
        return primitive_callable(*inputs)

    # -- TFP's variable objects (autobatch.backends.variables) -------------------------
    def _var_zeros(self, tensor_type: TensorType, lead: Tuple[int, ...]) -> tf.Tensor:
        return tf.zeros(tuple(lead) + tensor_type.shape, _tf_dtype(tensor_type.dtype))

    def _var_where(self, mask: Any, new: Any, old: Any) -> tf.Tensor:
        old = tf.convert_to_tensor(old)
        mask = tf.convert_to_tensor(mask)
        extra = (old.shape.rank - mask.shape.rank
                 if old.shape.rank is not None and mask.shape.rank is not None
                 else tf.rank(old) - tf.rank(mask))
        mask = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([extra], tf.int32)], 0))
        out = tf.where(mask, tf.cast(new, old.dtype), old)
        if not tf.executing_eagerly():
            out.set_shape(old.shape)  # a value of unknown shape written to a known one
        return out

    def _var_step(self, index: Any, mask: Any, delta: int) -> tf.Tensor:
        return index + delta * tf.cast(mask, index.dtype)

    def _var_guard(self, values: Tuple[Any, ...], failed: Callable[[], Any],
                   make_error: Callable[[], Exception]) -> Tuple[Any, ...]:
        """Eagerly: raise now.  In a graph: ``values`` through an assertion
        whose message is the error (``tf.errors.InvalidArgumentError`` when
        the graph runs and the check fails), as TFP's stacks do.  Nothing
        with ``safety_checks=False``."""
        if not self.safety_checks:
            return values
        hit = tf.reduce_any(failed())
        if tf.executing_eagerly():
            if bool(hit):
                raise make_error()
            return values
        error = make_error()
        check = tf.debugging.Assert(tf.logical_not(hit), [f"{type(error).__name__}: {error}"])
        with tf.control_dependencies([check]):
            return tuple(tf.identity(v) for v in values)

    def _var_stack_read(self, stack: Any, index: Any) -> tf.Tensor:
        rows = tf.clip_by_value(index, 0, stack.shape[0] - 1)
        threads = tf.range(tf.shape(index)[0], dtype=rows.dtype)
        return tf.gather_nd(stack, tf.stack([rows, threads], axis=1))

    def _var_stack_write(self, stack: Any, index: Any, mask: Any, value: Any) -> tf.Tensor:
        frames = tf.range(stack.shape[0], dtype=index.dtype)[:, None]
        hit = tf.logical_and(tf.equal(frames, index[None, :]), tf.cast(mask, tf.bool)[None, :])
        return self._var_where(hit, tf.cast(value, stack.dtype)[None], stack)

    def placeholder(self, tensor_type: TensorType, batch_size: int) -> tf.Tensor:
        """Ones, not zeros: TensorFlow raises on an integer division by zero
        (``a % b`` in a primop), where NumPy only warns."""
        return tf.ones((batch_size,) + tensor_type.shape, _tf_dtype(tensor_type.dtype))


# Values's own definitions of TFP's shared names (fill, type_of, while_loop,
# switch_case) also take TFP's argument lists (autobatch.backends.tfp_api).
accept_tfp_arguments(Values)
