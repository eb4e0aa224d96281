"""Which backend runs a call by default: :func:`default_backend` picks
TensorFlow's where any argument is a TensorFlow tensor (so that tensors in
give tensors out, in eager code, in a ``tf.function`` and in a TF1 graph
alike), NumPy's otherwise.  Neither is imported before it is needed.
"""
from typing import Any, Sequence

__all__ = ["default_backend", "is_tensorflow_value"]


def is_tensorflow_value(value: Any) -> bool:
    """Whether ``value`` (or a leaf of a tuple/list of values) is a
    TensorFlow tensor or variable; never imports TensorFlow."""
    if isinstance(value, (tuple, list)):
        return any(is_tensorflow_value(v) for v in value)
    module = type(value).__module__ or ""
    return module.startswith(("tensorflow.", "tf_keras.", "keras."))


def default_backend(args: Sequence[Any] = ()) -> Any:
    """``TensorFlowBackend()`` if any of ``args`` holds a TensorFlow tensor,
    else ``NumpyBackend()``."""
    if is_tensorflow_value(list(args)):
        from autobatch.backends.tf import TensorFlowBackend
        return TensorFlowBackend()
    from autobatch.backends.numpy import NumpyBackend
    return NumpyBackend()
