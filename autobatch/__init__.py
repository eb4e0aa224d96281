"""autobatch: run a control-heavy function over a whole batch at once.

In the manner of TensorFlow Probability's ``auto_batching``: a Python function
with recursion, branches and loops is turned into an instruction program and
run by a batched program-counter VM on NumPy or TensorFlow (or, on NumPy
with numba installed, by one compiled kernel that runs each thread's own
control flow: :mod:`autobatch.native`).  Names are re-exported lazily so
that ``import autobatch`` needs NumPy at most.
"""
from importlib import import_module
from importlib import metadata as _metadata

try:  # the one version: the installed distribution's metadata (pyproject.toml)
    __version__ = _metadata.version("memopt")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

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
    "truthy": "autobatch.frontend",
}

#: TFP's ``auto_batching`` submodules, loaded when first used as attributes
#: (``autobatch.tf_backend`` imports TensorFlow, ``xla`` when called).
SUBMODULES = ("allocation_strategy", "dsl", "frontend", "instructions", "liveness",
              "lowering", "numpy_backend", "stack_optimization", "stackless",
              "tf_backend", "type_inference", "virtual_machine", "xla")

__all__ = sorted(_EXPORTS) + list(SUBMODULES)


def __getattr__(name):
    if name in SUBMODULES:
        value = import_module(f"autobatch.{name}")
        globals()[name] = value
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autobatch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(SUBMODULES))
