"""TFP's module name ``auto_batching.tf_backend``, for code written against it.

``TensorFlowBackend`` is :class:`autobatch.backends.tf.TensorFlowBackend`
(TFP's ``safety_checks`` and argument lists accepted beside its own).  TFP's
variable classes take TFP's arguments: ``RegisterTensorFlowVariable(value)``
and ``FullTensorFlowVariable(current, Stack(stack, stack_index))``; they are
:class:`~autobatch.backends.variables.RegisterVariable` and
:class:`~autobatch.backends.variables.FullVariable` doing their array work
on a TensorFlow backend when none is given (``backend=`` keyword).
Importing this module imports TensorFlow.
"""
from autobatch.backends.tf import TensorFlowBackend
from autobatch.backends.variables import FullVariable, RegisterVariable, Stack

__all__ = ["TensorFlowBackend", "FullTensorFlowVariable", "RegisterTensorFlowVariable", "Stack"]

_DEFAULT = TensorFlowBackend()


class RegisterTensorFlowVariable(RegisterVariable):
    """TFP's ``RegisterTensorFlowVariable(value)`` (see the module doc)."""

    __slots__ = ()

    @staticmethod
    def _default_backend() -> TensorFlowBackend:
        return _DEFAULT


class FullTensorFlowVariable(FullVariable):
    """TFP's ``FullTensorFlowVariable(current, stack)`` (see the module doc)."""

    __slots__ = ()

    @staticmethod
    def _default_backend() -> TensorFlowBackend:
        return _DEFAULT
