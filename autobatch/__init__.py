"""autobatch: run a control-heavy function over a whole batch at once.

In the manner of TensorFlow Probability's ``auto_batching``: a Python function
with recursion, branches and loops is turned into an instruction program and
run by a batched program-counter VM on NumPy or TensorFlow (or, on NumPy
with numba installed, by one compiled kernel that runs each thread's own
control flow: :mod:`autobatch.native`).  Names are re-exported lazily so
that ``import autobatch`` needs NumPy at most.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "Context": "autobatch.frontend",
    "NumpyBackend": "autobatch.backends.numpy",
    "TensorFlowBackend": "autobatch.backends.tf",
    "JaxBackend": "autobatch.backends.jax",
    "ProgramBuilder": "autobatch.dsl",
    "VariableAllocation": "autobatch.instructions",
    "TensorType": "autobatch.instructions",
    "Type": "autobatch.instructions",
    "Program": "autobatch.instructions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autobatch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
