"""memopt: plans tensor memory for ML programs.

The public face of the library.  Names are re-exported lazily so that
``import memopt`` needs NumPy at most: Paddle is imported only when a Paddle
program is handed in.

- :func:`memory_optimize` / :func:`release_memory`: rewrite a Paddle static
  program so variables with disjoint lifetimes share memory.
- :func:`analyze`: peak, timeline and who holds the peak.
- :mod:`memopt.liveness`, :mod:`memopt.graph`: the shared core.
"""
from importlib import import_module
from importlib import metadata as _metadata

try:  # the one version: the installed distribution's metadata (pyproject.toml)
    __version__ = _metadata.version("memopt")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

#: public name -> module that defines it
_EXPORTS = {
    "memory_optimize": "memopt.api",
    "release_memory": "memopt.api",
    "Report": "memopt.report",
    "analyze": "memopt.api",
    "estimate": "memopt.api",
    "suggest_recompute": "memopt.paddle.dygraph",
    "Strategy": "memopt.parallel",
    "RankEstimate": "memopt.parallel",
    "Analysis": "memopt.analysis",
    "RuntimeModel": "memopt.analysis",
    "plan_arena": "memopt.arena",
    "ArenaPlan": "memopt.arena",
    "assign_groups": "memopt.reuse",
    "GroupPlan": "memopt.reuse",
    "read_csv": "memopt.problems",
    "write_csv": "memopt.problems",
    "Graph": "memopt.graph",
    "Block": "memopt.graph",
    "Op": "memopt.graph",
    "Var": "memopt.graph",
    "Size": "memopt.graph",
    "Problem": "memopt.problems",
    "Buffer": "memopt.problems",
    "FlowNode": "memopt.liveness",
    "Interval": "memopt.liveness",
    "MemoptError": "memopt.errors",
    "GraphError": "memopt.errors",
    "PlanError": "memopt.errors",
    "UnsupportedProgramError": "memopt.errors",
    "ProblemFormatError": "memopt.errors",
    "ModelFileError": "memopt.errors",
    "MergedVariableError": "memopt.errors",
    "StepAlreadyRunError": "memopt.errors",
    "PaddleInternalsError": "memopt.errors",
    "install_fetch_guard": "memopt.paddle.guards",
    "BudgetError": "memopt.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memopt' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
