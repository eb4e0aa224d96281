"""The native engine: a lowered program compiled by numba, one thread per lane.

:func:`native_program` turns a :class:`~autobatch.lowering.LoweredProgram`
into a :class:`NativeProgram` (or raises
:class:`~autobatch.native_expr.Unlowerable`); its :meth:`NativeProgram.run`
takes and returns what :meth:`autobatch.virtual_machine.VirtualMachine.run`
does, bit for bit (a NaN is a NaN, but its sign bit may differ: LLVM, like
NumPy's own vector loops, does not keep it through arithmetic), and raises
the same
:class:`~autobatch.errors.StackOverflowError`.  Where each thread's control
flow diverges (recursion, data-dependent loops) running threads one after
another in compiled code does only the work each thread needs; see
:mod:`autobatch.native_codegen` for the kernel.

Compiled kernels are cached twice: in this process by the kernel's source,
and on disk by numba (``cache=True``) in a file named by a hash of the
source, under ``$AUTOBATCH_NATIVE_CACHE`` (default
``$XDG_CACHE_HOME/autobatch/native``, else ``~/.cache/autobatch/native``;
a temporary directory where that cannot be written), so a new process
loads the machine code instead of compiling it again.

numba is optional (``pip install memopt[fast]``): :func:`available` says
whether it imports.  ``AUTOBATCH_NATIVE=0`` in the environment turns the
automatic choice off (an explicit request still works).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from typing import Any, Dict, Optional, Sequence

import numpy as np

from autobatch.arguments import DEFAULT_MAX_STACK_DEPTH, batch_size
from autobatch.errors import ProgramError, StackOverflowError
from autobatch.ir import as_pattern, pattern_leaves, pattern_unflatten
from autobatch.lowering import LoweredProgram
from autobatch.native_codegen import KernelPlan, kernel_source
from autobatch.native_expr import Unlowerable

__all__ = ["available", "auto_enabled", "native_program", "NativeProgram", "Unlowerable",
           "cache_dir", "forget_compiled"]

_numba: Any = None
_lock = threading.Lock()
_kernels: Dict[str, Any] = {}


def available() -> bool:
    """Whether numba imports (imported on first ask)."""
    global _numba
    if _numba is None:
        try:
            import numba
            _numba = numba
        except ImportError:
            _numba = False
    return _numba is not False


def auto_enabled() -> bool:
    """Whether the automatic engine choice may pick the native engine:
    ``AUTOBATCH_NATIVE`` is not ``0`` (numba is asked for later, only for a
    program that lowers)."""
    return os.environ.get("AUTOBATCH_NATIVE", "1") != "0"


def cache_dir() -> str:
    """Where generated kernels and numba's cache files go (made if missing)."""
    root = os.environ.get("AUTOBATCH_NATIVE_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        root = os.path.join(base, "autobatch", "native")
    try:
        os.makedirs(root, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = os.path.join(tempfile.gettempdir(), f"autobatch-native-{os.getuid()}")
    os.makedirs(root, exist_ok=True)
    return root


def _load_kernel(source: str) -> Any:
    """The numba dispatcher of ``source``'s ``kernel``: from this process's
    cache, else from a module file named by the source's hash (written once,
    never rewritten, so numba's on-disk cache stays valid across processes)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _lock:
        kernel = _kernels.get(digest)
        if kernel is not None:
            return kernel
        name = f"autobatch_kernel_{digest}"
        path = os.path.join(cache_dir(), name + ".py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        kernel = module.kernel
        _kernels[digest] = kernel
        return kernel


def forget_compiled() -> None:
    """Drop this process's compiled kernels (the next use loads them from
    the disk cache again, as a new process would)."""
    with _lock:
        for digest in list(_kernels):
            sys.modules.pop(f"autobatch_kernel_{digest}", None)
        _kernels.clear()


class NativeProgram:
    """A lowered program run by a numba kernel (see the module doc).

    ``steps`` after :meth:`run`: None (the kernel does not count block runs).
    """

    def __init__(self, lowered: LoweredProgram, plan: KernelPlan) -> None:
        self.lowered = lowered
        self.plan = plan
        self.steps: Optional[int] = None

    @property
    def source(self) -> str:
        return self.plan.source

    def kernel(self) -> Any:
        """The compiled kernel (compiled, or loaded from disk, on first use).
        Raises :class:`~autobatch.native_expr.Unlowerable` where numba
        cannot compile the generated source (a case the generator should
        have refused; the automatic choice then falls back)."""
        if not available():
            raise Unlowerable("numba is not installed (pip install numba)")
        kernel = _load_kernel(self.plan.source)
        if not kernel.signatures:
            numba = _numba
            arrays = [numba.typeof(np.empty(1, d)) for d in
                      self.plan.input_dtypes + self.plan.output_dtypes]
            signature = tuple(arrays) + (numba.typeof(np.empty(1, np.int32)), numba.int64)
            try:
                kernel.compile(signature)
            except numba.core.errors.NumbaError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                raise Unlowerable(f"numba cannot compile the generated kernel "
                                  f"({kernel.py_func.__module__}): {first}") from exc
        return kernel

    def run(self, args: Sequence[Any], max_stack_depth: Optional[int] = None) -> Any:
        lowered = self.lowered
        depth = DEFAULT_MAX_STACK_DEPTH if max_stack_depth is None else max_stack_depth
        if not isinstance(depth, (int, np.integer)) or depth < 1:
            raise ValueError(f"max_stack_depth must be a positive int, got {depth!r}")
        if len(args) != len(lowered.inputs):
            raise ProgramError(f"the program takes {len(lowered.inputs)} argument(s) "
                               f"{lowered.inputs}, got {len(args)}")
        types = [lowered.var_types[v] for v in lowered.inputs]
        batch = batch_size(args, types)
        inputs = []
        for arg, typ in zip(args, types):
            for leaf, tt in zip(pattern_leaves(as_pattern(arg)), typ.leaves()):
                array = np.asarray(leaf)
                if array.ndim == 0:
                    array = array[None]
                out = np.empty((batch,), dtype=tt.dtype)
                out[...] = array  # broadcasts a batch of 1, as the VM does
                inputs.append(out)
        outputs = [np.empty(batch, dtype=d) for d in self.plan.output_dtypes]
        status = np.zeros(batch, np.int32)
        self.kernel()(*inputs, *outputs, status, np.int64(depth))
        bad = np.flatnonzero(status)
        if bad.size:
            callee = self.plan.callees[int(status[bad[0]]) - 1]
            raise StackOverflowError(callee, int(depth))
        return pattern_unflatten(lowered.var_types[lowered.output].tensors, outputs)


def native_program(lowered: LoweredProgram) -> NativeProgram:
    """A :class:`NativeProgram` for ``lowered``; raises
    :class:`~autobatch.native_expr.Unlowerable` naming what the native
    engine cannot run (numba is not needed until the first run)."""
    return NativeProgram(lowered, kernel_source(lowered))
