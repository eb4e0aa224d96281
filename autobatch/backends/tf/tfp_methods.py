"""TFP's backend methods (:mod:`autobatch.backends.tfp_api`) in TensorFlow."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from autobatch.backends.tf.support import (
    _tf_dtype,
)
from autobatch.ir import TensorType


class TensorFlowTfpMethods:
    """TFP's backend methods (:mod:`autobatch.backends.tfp_api`) in TensorFlow."""

    def executes_eagerly(self) -> bool:
        return tf.executing_eagerly()

    def full_mask(self, size: Any, name: Any = None) -> Any:
        """A tensor of ``size`` True values (never a resource variable)."""
        return tf.ones(tf.reshape(tf.convert_to_tensor(size), [1]), tf.bool)

    def tfp_fill(self, value: Any, size: Any, dtype: Any, shape: Any, name: Any = None) -> Any:
        dtype = _tf_dtype(dtype)
        size = tf.convert_to_tensor(size)
        dims = tf.concat([tf.reshape(size, [1]),
                          tf.cast(tf.reshape(tf.convert_to_tensor(shape, size.dtype), [-1]),
                                  size.dtype)], 0)
        return tf.fill(dims, tf.cast(value, dtype))

    def tfp_type_of(self, t: Any, dtype_hint: Any = None) -> TensorType:
        """TFP's ``type_of``: dtype and whole shape of ``t`` (converted with
        ``dtype_hint`` in a scratch graph where no eager context runs)."""
        if not tf.is_tensor(t):
            if tf.executing_eagerly():
                t = tf.convert_to_tensor(t, dtype_hint)
            else:
                with tf.Graph().as_default():
                    t = tf.convert_to_tensor(t, dtype_hint)
        # The batch dimension (the first) may be unknown, as a TF1
        # placeholder of shape [None, ...] leaves it: the signature drops it.
        if t.shape.rank is None or None in t.shape.as_list()[1:]:
            raise TypeError(f"type_of needs a static shape, got {t.shape}")
        return TensorType(t.dtype.as_numpy_dtype, tuple(t.shape.as_list()))

    def tfp_while_loop(self, cond: Callable[..., Any], body: Callable[..., Any],
                       loop_vars: Sequence[Any], name: Any = None) -> Any:
        if tf.executing_eagerly():
            while bool(cond(*loop_vars)):
                loop_vars = body(*loop_vars)
            return loop_vars
        return tf.while_loop(cond, body, loop_vars, name=name)

    def tfp_switch_case(self, branch_selector: Any, branch_callables: Sequence[Callable[[], Any]],
                        name: Any = None) -> Any:
        if tf.executing_eagerly():
            return branch_callables[int(branch_selector)]()
        return tf.switch_case(branch_selector, list(branch_callables), name=name)

    def batch_size(self, value: Any, name: Any = None) -> Any:
        """The leading dimension of ``value``: an int where it is static, else
        a scalar tensor; 1 for a scalar."""
        value = tf.convert_to_tensor(value)
        if value.shape.rank == 0:
            return 1
        if value.shape.rank is not None and value.shape[0] is not None:
            return int(value.shape[0])
        return tf.reduce_prod(tf.shape(value)[:1])

    def static_value(self, t: Any) -> Any:
        return t.numpy() if tf.executing_eagerly() and tf.is_tensor(t) else (
            None if tf.is_tensor(t) else np.asarray(t))

    def assert_matching_dtype(self, expected_dtype: Any, value: Any, message: str = "") -> None:
        if tf.is_tensor(value):
            found = np.dtype(value.dtype.as_numpy_dtype)
        elif hasattr(value, "dtype"):
            found = np.dtype(value.dtype)
        else:  # a Python constant takes the expected dtype where it can
            found = np.dtype(tf.convert_to_tensor(value, _tf_dtype(expected_dtype))
                             .dtype.as_numpy_dtype)
        if found != np.dtype(expected_dtype):
            raise ValueError(f"Mismatched dtype: expected {np.dtype(expected_dtype)} found "
                             f"{found}. {message}")

    def broadcast_to_shape_of(self, val: Any, target: Any, name: Any = None) -> Any:
        target = tf.convert_to_tensor(target)
        val = tf.cast(val, target.dtype) if not tf.is_tensor(val) else val
        return tf.broadcast_to(val, tf.shape(target))

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any],
             name: Any = None) -> Any:
        return tf.cond(pred, true_fn, false_fn, name=name)

    def equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return tf.equal(t1, t2, name=name)

    def not_equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return tf.not_equal(t1, t2, name=name)

    def any(self, t: Any, name: Any = None) -> Any:
        return tf.reduce_any(t, name=name)
