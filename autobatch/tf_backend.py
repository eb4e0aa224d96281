"""TFP's module name ``auto_batching.tf_backend``, for code written against it.

``TensorFlowBackend`` is :class:`autobatch.backends.tf.TensorFlowBackend`
(TFP's ``safety_checks`` and argument lists accepted beside its own);
TFP's variable classes are autobatch's (:mod:`autobatch.backends.variables`):
``FullTensorFlowVariable`` is
:class:`~autobatch.backends.variables.FullVariable`,
``RegisterTensorFlowVariable``
:class:`~autobatch.backends.variables.RegisterVariable`.  Importing this
module imports TensorFlow.
"""
from autobatch.backends.tf import TensorFlowBackend
from autobatch.backends.variables import FullVariable as FullTensorFlowVariable
from autobatch.backends.variables import RegisterVariable as RegisterTensorFlowVariable

__all__ = ["TensorFlowBackend", "FullTensorFlowVariable", "RegisterTensorFlowVariable"]
