"""The one compile path: types -> allocation -> lowering (or fusing), cached.

Every executor gets its program from here: :class:`~autobatch.frontend.Context`
(through one :class:`Pipeline` per Context), :func:`autobatch.virtual_machine.execute`
and the benchmarks (through :func:`prepare` / :func:`compile_program`).

- :func:`typed` runs :func:`~autobatch.type_inference.infer_types` for the
  argument types, then :func:`~autobatch.allocation_strategy.optimize`.
- :func:`~autobatch.lowering.lower` turns that into the VM's
  :class:`~autobatch.lowering.LoweredProgram`.
- :func:`~autobatch.fused.fuse` turns a program whose ``main`` makes no call
  into one fused loop (:class:`~autobatch.fused.FusedProgram`).

Engine choice (:meth:`Compiled.engine`): the backend's own compiler where it
has one (JAX); the native engine (:mod:`autobatch.native`, numba, one thread
per lane) where the backend allows it (``NumpyBackend(native=None)``, the
default: where numba imports and the program lowers, once its kernel is
compiled: the first call of a program runs on the fused loop or the VM, the
second starts the compile in a background thread and runs there too, later
calls run natively once the kernel is ready, so that a first call costs
what the fused loop or the VM costs; ``native=True``: always, compiled before the first
run); else the fused loop where the backend declares ``fused_loops``
(NumPy) and the program fuses; the VM otherwise (recursion, calls,
TensorFlow).  All give the reference's results bit for bit; the fused loop
has no program counter, stacks or per-step selection.

Also here, because every executor needs them: :func:`batch_size` and
:func:`argument_types` (the per-thread types of batched arguments), from
:mod:`autobatch.arguments`.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence

from autobatch.allocation_strategy import optimize
from autobatch.arguments import DEFAULT_MAX_STACK_DEPTH, argument_types, batch_size
from autobatch.ir import Program
from autobatch.lowering import LoweredProgram, lower
from autobatch.type_inference import as_type, infer_types

__all__ = ["DEFAULT_MAX_STACK_DEPTH", "Pipeline", "Compiled", "CacheStats", "typed", "prepare", "compile_program",
           "batch_size", "argument_types", "backend_key"]


def backend_key(backend: Any) -> Any:
    """What makes two backend objects interchangeable for compiled code."""
    return backend.cache_key()


def typed(program: Program, sig: Optional[Sequence[Any]], backend: Any = None) -> Program:
    """``program`` typed for arguments of types ``sig`` (None: left untyped)
    and allocated."""
    if sig is not None:
        program = infer_types(program, [as_type(s) for s in sig], backend)
    return optimize(program)


def prepare(program: Program, arg_types: Sequence[Any], backend: Any = None) -> LoweredProgram:
    """Type, allocate and lower ``program`` for arguments of ``arg_types``."""
    return lower(typed(program, arg_types, backend))


@dataclass
class Compiled:
    """One program compiled for one signature: the typed, allocated program,
    and (made on first use) its lowered and fused forms."""

    program: Program
    _lowered: Optional[LoweredProgram] = None
    _fused: Any = field(default=False)  # False: not tried yet; None: does not fuse
    _native: Any = field(default=False)  # False: not tried yet; else NativeProgram or reason
    _compiled_by: Dict[Any, Any] = field(default_factory=dict)
    #: The background compile of the native kernel (automatic choice).
    _native_thread: Optional[threading.Thread] = None
    _native_ready: bool = False
    _native_asked: bool = False

    @property
    def lowered(self) -> LoweredProgram:
        if self._lowered is None:
            self._lowered = lower(self.program)
        return self._lowered

    @property
    def fused(self) -> Any:
        """The :class:`~autobatch.fused.FusedProgram`, or None where the
        program does not fuse (calls, irreducible control flow)."""
        if self._fused is False:
            from autobatch.fused import fuse
            self._fused = fuse(self.program)
        return self._fused

    def native(self, backend: Any, ask: bool = True) -> Any:
        """The :class:`~autobatch.native.NativeProgram` where ``backend``
        allows the native engine and it can run this program, else None.
        Raises :class:`~autobatch.errors.NativeEngineError` where the
        backend demands it (``native=True``) and it cannot.  The kernel is
        generated first (no numba needed), so a program that does not lower
        never imports numba; then compiled, or loaded from disk: before
        this returns where the backend demands the engine; under the
        automatic choice (``native=None``) in a background thread started
        by the second ask (the first call of a program is not slowed by
        numba), returning None (the fused loop or the VM runs) until the
        kernel is ready (:meth:`wait_for_native` starts and waits for it)."""
        mode = getattr(backend, "native", False)
        if mode is False:
            return None
        from autobatch import native
        if mode is None and not native.auto_enabled():
            return None
        if self._native is False:
            try:
                self._native = native.native_program(self.lowered)
            except native.Unlowerable as exc:
                self._native = str(exc)
        if mode is None and not self._native_ready:
            # Automatic choice: the first call runs on the fused loop or the VM
            # alone; the second starts compiling (or loading) the kernel in the
            # background, and they run until it is ready.
            if ask:
                if self._native_asked:
                    self._start_native()
                self._native_asked = True
            if not self._native_ready:
                if isinstance(self._native, str):
                    return self._refuse(mode, self._why_not())
                return None
        if not isinstance(self._native, str) and not self._native_ready:
            self._compile_native()
        if isinstance(self._native, str):
            return self._refuse(mode, self._why_not())
        return self._native

    #: The reason kept when numba does not import.
    _NO_NUMBA = "it needs numba, which does not import; install it (pip install numba, " \
                "or memopt[fast])"

    def _why_not(self) -> str:
        """Why the native engine does not run this program (``_native`` is
        the reason)."""
        if self._native == self._NO_NUMBA:
            return self._NO_NUMBA
        return f"the native engine cannot run this program: {self._native}"

    def _compile_native(self) -> None:
        """Compile (or load from disk) the native kernel; on failure keep the
        reason in ``_native`` (a string), on success mark it ready."""
        from autobatch import native
        program = self._native
        if isinstance(program, str):
            return
        if not native.available():
            self._native = self._NO_NUMBA
            return
        try:
            program.kernel()  # compiled now, or loaded from disk
        except native.Unlowerable as exc:
            self._native = str(exc)
            return
        self._native_ready = True

    def _start_native(self) -> None:
        """Start the background compile of the native kernel (once)."""
        if not isinstance(self._native, (str, bool)) and self._native_thread is None:
            self._native_thread = threading.Thread(
                target=self._compile_native, name="autobatch-native-compile", daemon=True)
            self._native_thread.start()

    def wait_for_native(self, timeout: Optional[float] = None) -> bool:
        """Start the background compile of the native kernel if the
        automatic choice asked for it (see :meth:`native`) and wait for it to
        end; whether the kernel is ready."""
        if self._native_asked:
            self._start_native()
        thread = self._native_thread
        if thread is not None:
            thread.join(timeout)
        return self._native_ready

    @staticmethod
    def _refuse(mode: Any, reason: str) -> None:
        """None (the automatic choice falls back), or NativeEngineError
        where the backend demands the native engine."""
        if mode is True:
            from autobatch.errors import NativeEngineError
            raise NativeEngineError(f"NumpyBackend(native=True): {reason}; pass native=None "
                                    f"to fall back to the fused loop or the VM where the "
                                    f"native engine cannot run, or native=False")
        logging.getLogger("autobatch.native").debug("native engine not used: %s", reason)
        return None

    def engine(self, backend: Any, ask: bool = True) -> str:
        """What runs this program on ``backend``: ``"compiled"`` (a backend
        that compiles whole programs itself: JAX), ``"native"`` (the numba
        engine, see :meth:`native`), ``"fused"`` (the NumPy fused loop) or
        ``"vm"``."""
        if backend.compiles_programs:
            return "compiled"
        if self.native(backend, ask) is not None:
            return "native"
        if backend.fused_loops and self.fused is not None:
            return "fused"
        return "vm"

    def compiled_by(self, backend: Any) -> Any:
        """``backend.compile(program)``, kept per backend settings."""
        key = backend_key(backend)
        if key not in self._compiled_by:
            self._compiled_by[key] = backend.compile(self.program)
        return self._compiled_by[key]

    def runner(self, backend: Any) -> Any:
        """An object whose ``run(args)`` runs the program on ``backend`` where
        :meth:`engine` picks the native engine, the fused loop or the
        backend's own compiler (the native engine's ``run`` also takes
        ``max_stack_depth``); None where it picks the VM (the caller builds a
        :class:`~autobatch.virtual_machine.VirtualMachine` from
        :attr:`lowered`).  Not another ask of the native engine: call
        :meth:`engine` once per run, then this."""
        engine = self.engine(backend, ask=False)
        if engine == "compiled":
            return self.compiled_by(backend)
        if engine == "native":
            return self.native(backend, ask=False)
        if engine == "fused":
            return self.fused
        return None


def compile_program(program: Program, arg_types: Sequence[Any], backend: Any = None
                    ) -> Compiled:
    """:func:`typed` wrapped in a :class:`Compiled` (uncached)."""
    return Compiled(typed(program, arg_types, backend))


@dataclass
class CacheStats:
    """What a Pipeline built, and how often its cache answered instead.

    ``translations``: times the batched functions were translated to IR (a
    Context counts these); ``compilations``: typed and allocated programs
    built; ``lowerings``: lowered programs built; ``hits``: requests served
    from a cache.
    """

    translations: int = 0
    compilations: int = 0
    lowerings: int = 0
    hits: int = 0


class Pipeline:
    """:func:`typed` and lowering, cached on ``(key, signature, backend)``.

    ``key`` names the program (a Context uses the entry function's name);
    ``make_program`` builds it when the cache misses.  :meth:`clear` forgets
    everything (a Context does when another function is batched).
    """

    def __init__(self, stats: Optional[CacheStats] = None) -> None:
        self.stats = stats if stats is not None else CacheStats()
        self._compiled: Dict[Any, Compiled] = {}

    def clear(self) -> None:
        self._compiled.clear()

    def compiled(self, key: Any, make_program: Callable[[], Program],
                 sig: Optional[Sequence[Any]], backend: Any) -> Compiled:
        sig_key = None if sig is None else tuple(as_type(s) for s in sig)
        full = (key, sig_key, backend_key(backend))
        found = self._compiled.get(full)
        if found is not None:
            self.stats.hits += 1
            return found
        found = Compiled(typed(make_program(), sig_key, backend))
        self._compiled[full] = found
        self.stats.compilations += 1
        return found

    def lowered(self, key: Any, make_program: Callable[[], Program],
                sig: Sequence[Any], backend: Any) -> LoweredProgram:
        if sig is None:
            raise ValueError("lowering needs the argument types (sig): a typed program")
        sig_key = tuple(as_type(s) for s in sig)
        full = (key, sig_key, backend_key(backend))
        found = self._compiled.get(full)
        if found is not None and found._lowered is not None:
            self.stats.hits += 1
            return found._lowered
        compiled = self.compiled(key, make_program, sig_key, backend)
        self.stats.lowerings += 1
        return compiled.lowered
