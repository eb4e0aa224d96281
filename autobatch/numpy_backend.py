"""TFP's module name ``auto_batching.numpy_backend``, for code written against it.

``NumpyBackend`` is :class:`autobatch.backends.numpy.NumpyBackend` (it takes
TFP's argument lists beside its own: :mod:`autobatch.backends.tfp_api`).
TFP's variable classes take TFP's arguments: ``RegisterNumpyVariable(value)``
and ``FullNumpyVariable(current, Stack(stack, stack_index))``; they are
:class:`~autobatch.backends.variables.RegisterVariable` and
:class:`~autobatch.backends.variables.FullVariable` doing their array work
on a NumPy backend when none is given (``backend=`` keyword).
"""
from autobatch.backends.numpy import NumpyBackend
from autobatch.backends.variables import FullVariable, RegisterVariable, Stack

__all__ = ["NumpyBackend", "FullNumpyVariable", "RegisterNumpyVariable", "Stack"]

_DEFAULT = NumpyBackend()


class RegisterNumpyVariable(RegisterVariable):
    """TFP's ``RegisterNumpyVariable(value)`` (see the module doc)."""

    __slots__ = ()

    @staticmethod
    def _default_backend() -> NumpyBackend:
        return _DEFAULT


class FullNumpyVariable(FullVariable):
    """TFP's ``FullNumpyVariable(current, stack)`` (see the module doc)."""

    __slots__ = ()

    @staticmethod
    def _default_backend() -> NumpyBackend:
        return _DEFAULT
