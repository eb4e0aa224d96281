"""TFP's module name ``auto_batching.numpy_backend``, for code written against it.

``NumpyBackend`` is :class:`autobatch.backends.numpy.NumpyBackend` (it takes
TFP's argument lists beside its own: :mod:`autobatch.backends.tfp_api`);
TFP's variable classes are autobatch's (:mod:`autobatch.backends.variables`),
which serve every backend: ``FullNumpyVariable`` is
:class:`~autobatch.backends.variables.FullVariable`, ``RegisterNumpyVariable``
:class:`~autobatch.backends.variables.RegisterVariable`.
"""
from autobatch.backends.numpy import NumpyBackend
from autobatch.backends.variables import FullVariable as FullNumpyVariable
from autobatch.backends.variables import RegisterVariable as RegisterNumpyVariable

__all__ = ["NumpyBackend", "FullNumpyVariable", "RegisterNumpyVariable"]
