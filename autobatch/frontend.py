"""The user's face of autobatch: :class:`Context` and ``@ctx.batch``.

A user writes plain Python for one example and decorates it::

    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0]])
    def fib(n):
        if n > 1:
            return fib(n - 1) + fib(n - 2)
        return 1

    fib(np.arange(20), max_stack_depth=20)   # one batched run over 20 threads

The decorated function takes batched arguments: each with a leading batch
dimension, all of one size; an argument of batch size 1, or without the
dimension (a scalar), is given to every thread.  Tuples are tuple-typed
arguments.  It returns the batched result (NumPy arrays, or tensors with the
TensorFlow backend; tuples for tuple results).  Extra keywords:

``backend``
    ``autobatch.NumpyBackend()``, ``autobatch.TensorFlowBackend()`` or
    ``autobatch.JaxBackend()`` (programs without calls only); by default
    TensorFlow's where an argument is a TensorFlow tensor (results are then
    tensors), else NumPy's.
``max_stack_depth``
    the most calls pending at once per thread (default 15).
``stackless``
    run with the stackless executor (calls on the host stack; eager only).
``dry_run``
    as in TFP: call the plain Python function directly on the arguments,
    which must have a batch dimension of size 1 or none (the batched
    functions it calls run plainly too), and return what it returns: a way
    to debug a program.  Conditions on tensors of shape ``[1]`` need
    :func:`truthy` there.  :meth:`BatchedFunction.per_example` runs the
    plain function over a whole batch, one example after another.
``block_code_cache``
    a dict that keeps compiled block code (and TensorFlow's traced runs)
    across calls; default: the Context's own (:attr:`Context.block_code_cache`).

The source of a decorated function is translated (:mod:`autobatch.frontend_ast`
says what Python is accepted) into an IR function; functions decorated in one
Context call each other by name.  The program for a call is typed, allocated
and lowered once per ``(function, argument types, backend)`` and cached, as is
the compiled block code, so a second call with arguments of the same types
compiles nothing.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from autobatch import stackless as stackless_executor
from autobatch.dsl import ProgramBuilder
from autobatch.errors import ProgramError
from autobatch.frontend_ast import (
    FrontendError, FunctionTranslator, ParsedFunction, closure_values, parse_function,
)
from autobatch.ir import (
    Module, Program, as_pattern, pattern_leaves, pattern_map, pattern_unflatten,
    rebuild,
)
from autobatch.lowering import LoweredProgram
from autobatch.pipeline import (
    DEFAULT_MAX_STACK_DEPTH, CacheStats, Pipeline, argument_types, backend_key,
)
from autobatch.virtual_machine import VirtualMachine

__all__ = ["Context", "BatchedFunction", "Module", "CacheStats", "FrontendError", "truthy",
           "TF_BACKEND"]


def __getattr__(name: str) -> Any:
    """TFP's ``frontend.TF_BACKEND`` (a ``TensorFlowBackend()``), made when
    first read: importing this module does not import TensorFlow."""
    if name == "TF_BACKEND":
        from autobatch.backends.tf import TensorFlowBackend
        backend = TensorFlowBackend()
        globals()[name] = backend
        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

log = logging.getLogger(__name__)


@dataclass
class _Registered:
    parsed: ParsedFunction
    type_inference: Optional[Callable]


def _default_backend(args: Sequence[Any] = ()) -> Any:
    from autobatch.backends.default import default_backend
    return default_backend(args)


#: How many batched compilations or runs are in progress on this thread
#: (:func:`truthy` leaves values alone while one is).
_BATCHING = threading.local()


def _batching() -> bool:
    return getattr(_BATCHING, "depth", 0) > 0


def truthy(x: Any) -> Any:
    """A condition usable both batched and in a dry run, as TFP's ``truthy``.

    Batched, an ``if`` condition has a batch dimension (one value per
    thread), and so it has in a dry run, where the batch is one example: a
    value of shape ``[1]``, which TensorFlow refuses as a Python ``if``
    condition ("Non-scalar tensor ... cannot be converted to boolean").
    Write ``if truthy(x > 0):``: while autobatch compiles or runs a batched
    call, ``x`` is returned unchanged; otherwise (a dry run, a plain call) a
    value of shape ``[1]`` becomes its one element (a scalar of the same
    kind: NumPy or TensorFlow), and any other value is returned unchanged.
    """
    if _batching():
        return x
    shape = getattr(x, "shape", None)
    if shape is not None and tuple(shape) == (1,):
        return x[0]
    return x


def _is_array(value: Any) -> bool:
    """A TensorFlow tensor (symbolic ones cannot become NumPy arrays), or an
    array with at least one dimension."""
    if type(value).__module__.startswith("tensorflow"):
        return True
    shape = getattr(value, "shape", None)
    return shape is not None and hasattr(value, "dtype") and len(shape) >= 1


def _holds_arrays(value: Any) -> bool:
    """Whether ``value`` (a list or tuple) holds a tensor, or an array of at
    least one dimension, anywhere."""
    return any(_holds_arrays(v) if isinstance(v, (list, tuple)) else _is_array(v)
               for v in value)


def _as_argument(value: Any) -> Any:
    """A list of Python numbers becomes an array (a batch of values); a list
    holding arrays or tensors is structure, as in TFP (``[state_part, ...]``
    of TFP's NUTS: a tuple-typed argument); tuples stay tuples."""
    if isinstance(value, tuple) or (isinstance(value, list) and _holds_arrays(value)):
        return rebuild(value, (_as_argument(v) for v in value))
    if isinstance(value, list):
        return np.asarray(value)
    return value


def _is_tf_backend(backend: Any) -> bool:
    return backend.name == "tensorflow"


class Context:
    """A set of functions batched together; they may call each other by name.

    Methods follow TensorFlow Probability's ``auto_batching.Context``:
    :meth:`batch`, :meth:`batch_uncurried`, :meth:`function_names`,
    :meth:`module`, :meth:`program`, :meth:`program_compiled`,
    :meth:`program_lowered`, :meth:`lowered_for_args`.

    Attributes
    ----------
    block_code_cache : the default cache of compiled block code (and of
        TensorFlow's traced runs), shared by every call.
    stats : :class:`CacheStats`.
    """

    def __init__(self) -> None:
        self._registered: Dict[str, _Registered] = {}
        self._module: Optional[Module] = None
        self.block_code_cache: dict = {}
        self._backends: Dict[Any, Any] = {}
        self.stats = CacheStats()
        self.pipeline = Pipeline(self.stats)
        self._local = threading.local()

    # -- defining ----------------------------------------------------------------------
    def batch(self, type_inference: Optional[Callable] = None) -> Callable[[Callable],
                                                                              "BatchedFunction"]:
        """Decorator: batch the function it decorates (see :meth:`batch_uncurried`).

        ``type_inference`` (optional, a lambda is fine) maps the list of
        argument :class:`~autobatch.instructions.Type` s to the return type
        (a Type, TensorType, or a one-element list of one).  Needed only where
        the return type cannot be inferred (a recursion with no base case).
        """
        return functools.partial(self.batch_uncurried, type_inference=type_inference)

    def batch_uncurried(self, function: Callable,
                        type_inference: Optional[Callable] = None) -> "BatchedFunction":
        """Batch ``function`` (defined with ``def`` in a source file); returns
        the batched function.

        Raises
        ------
        FrontendError : the function cannot be translated (the message names
            the line and the construct).
        ProgramError : a function of that name is already batched here.
        """
        parsed = parse_function(function)
        if parsed.name in self._registered:
            raise ProgramError(f"a function named {parsed.name!r} is already batched in this "
                               f"Context; give the new one another name")
        if type_inference is not None and not callable(type_inference):
            raise TypeError(f"type_inference of {parsed.name!r} must be callable (argument "
                            f"types -> return type), got {type_inference!r}")
        # Translate once now, so that unsupported Python is reported at the
        # decorator; calls of functions batched later are checked at the first call.
        signatures = {name: reg.parsed.params for name, reg in self._registered.items()}
        signatures[parsed.name] = parsed.params
        FunctionTranslator(parsed, ProgramBuilder(), signatures, type_inference).translate()
        self._registered[parsed.name] = _Registered(parsed, type_inference)
        self._module = None
        self.pipeline.clear()
        return BatchedFunction(self, parsed)

    def function_names(self) -> List[str]:
        """Names of the batched functions, in the order they were batched."""
        return list(self._registered)

    # -- programs ------------------------------------------------------------------------
    def module(self) -> Module:
        """Every batched function translated to IR, as an
        :class:`~autobatch.instructions.Module` (TFP's; cached until another
        function is batched)."""
        if self._module is None:
            builder = ProgramBuilder()
            signatures = {name: reg.parsed.params for name, reg in self._registered.items()}
            for reg in self._registered.values():
                reg.parsed.closure = closure_values(reg.parsed.python)
                FunctionTranslator(reg.parsed, builder, signatures,
                                   reg.type_inference).translate()
            names = self.function_names()
            functions = builder.program(main=names[0]).functions if names else ()
            self._module = Module(tuple(functions))
            self.stats.translations += 1
        return self._module

    def program(self, main: str) -> Program:
        """The untyped program entering at function ``main``."""
        return self.module().program(main)

    def program_compiled(self, main: str, sig: Optional[Sequence[Any]] = None,
                         backend: Any = None) -> Program:
        """``program(main)`` typed for arguments of types ``sig`` (a Type or
        TensorType per parameter of ``main``, without the batch dimension)
        and allocated; cached on ``(main, sig, backend)``.  Without ``sig``
        the program is allocated but not typed (for inspection)."""
        return self._compiled_for(main, sig, backend).program

    def _compiled_for(self, main: str, sig: Optional[Sequence[Any]], backend: Any) -> Any:
        backend = backend if backend is not None else _default_backend()
        with self._running():
            return self.pipeline.compiled(main, lambda: self.program(main), sig, backend)

    def program_lowered(self, main: str, sig: Optional[Sequence[Any]] = None,
                        backend: Any = None) -> LoweredProgram:
        """:meth:`program_compiled` lowered for the VM; cached likewise.
        Without ``sig`` (TFP: type inference skipped, a result to inspect,
        not to run) it is :meth:`program_compiled`'s untyped, allocated
        Program, unlowered: lowering here needs the types."""
        if sig is None:
            return self.program_compiled(main, None, backend)
        backend = backend if backend is not None else _default_backend()
        with self._running():
            return self.pipeline.lowered(main, lambda: self.program(main), sig, backend)

    def lowered_for_args(self, name: str, args: Sequence[Any], backend: Any = None
                         ) -> LoweredProgram:
        """The lowered program of function ``name`` for these batched arguments."""
        backend = backend if backend is not None else _default_backend()
        sig = argument_types([_as_argument(a) for a in args], backend)
        return self.program_lowered(name, sig, backend)

    # -- running ---------------------------------------------------------------------------
    def _canonical(self, backend: Any) -> Any:
        """The first backend object seen with ``backend``'s settings (the
        default NumPy one for None), so that code cached under one backend
        object serves an equal, new one."""
        backend = backend if backend is not None else _default_backend()
        return self._backends.setdefault(backend_key(backend), backend)

    @contextlib.contextmanager
    def _flag(self, name: str) -> Iterator[None]:
        old = getattr(self._local, name, False)
        setattr(self._local, name, True)
        try:
            yield
        finally:
            setattr(self._local, name, old)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        _BATCHING.depth = getattr(_BATCHING, "depth", 0) + 1
        try:
            with self._flag("running"):
                yield
        finally:
            _BATCHING.depth -= 1

    def _dry_running(self) -> Any:
        return self._flag("dry_run")

    def _in(self, name: str) -> bool:
        return getattr(self._local, name, False)


class BatchedFunction:
    """What ``@ctx.batch`` returns: call it with batched arguments (see the
    module doc for the keywords).

    Attributes
    ----------
    python : the plain function.
    context : the Context it is batched in.
    last_steps : VM steps (blocks run) of the latest batched call.
    """

    def __init__(self, context: Context, parsed: ParsedFunction) -> None:
        self.context = context
        self.python = parsed.python
        self.params = parsed.params
        self.last_steps: Optional[int] = None
        functools.update_wrapper(self, parsed.python)

    def __repr__(self) -> str:
        return f"<batched function {self.__name__}({', '.join(self.params)})>"

    def _bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
        name = self.__name__
        if len(args) > len(self.params):
            raise TypeError(f"{name}() takes {len(self.params)} argument(s) "
                            f"{self.params}, got {len(args)}")
        bound = dict(zip(self.params, args))
        for key, value in kwargs.items():
            if key not in self.params:
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r} "
                                f"(parameters: {self.params}; options: backend, "
                                f"max_stack_depth, stackless, dry_run, block_code_cache)")
            if key in bound:
                raise TypeError(f"{name}() got argument {key!r} twice")
            bound[key] = value
        missing = [p for p in self.params if p not in bound]
        if missing:
            raise TypeError(f"{name}() is missing argument(s) {missing}")
        return [bound[p] for p in self.params]

    def __call__(self, *args: Any, dry_run: bool = False, stackless: bool = False,
                 max_stack_depth: int = DEFAULT_MAX_STACK_DEPTH, backend: Any = None,
                 block_code_cache: Optional[dict] = None, **kwargs: Any) -> Any:
        ctx = self.context
        if ctx._in("dry_run"):
            return self.python(*args, **kwargs)
        if ctx._in("running"):
            raise ProgramError(
                f"batched function {self.__name__!r} was called while a batched program "
                f"runs (from a primop: an ordinary function called by a batched one?); "
                f"call it by name in the body of a function batched in the same Context")
        values = [_as_argument(a) for a in self._bind(args, kwargs)]
        if dry_run:
            return self._dry_run(values)
        backend = ctx._canonical(backend if backend is not None
                                 else _default_backend(values))
        name = self.__name__
        if stackless:
            if _is_tf_backend(backend) and not _executing_eagerly():
                raise ProgramError("stackless=True runs eagerly (Python decides which "
                                   "threads call); call it outside tf.function")
            sig = argument_types(values, backend)
            program = ctx.program_compiled(name, sig, backend)
            with ctx._running():
                return stackless_executor.execute(program, values, backend, max_stack_depth)
        sig = argument_types(values, backend)
        compiled = ctx._compiled_for(name, sig, backend)
        engine = compiled.engine(backend)
        if engine != "vm":
            runner = compiled.runner(backend)
            with ctx._running():
                result = runner.run(values, max_stack_depth) if engine == "native" \
                    else runner.run(values)
            self.last_steps = runner.steps
            return result
        lowered = ctx.program_lowered(name, sig, backend)
        cache = ctx.block_code_cache if block_code_cache is None else block_code_cache
        with ctx._running():
            vm = VirtualMachine(lowered, backend, max_stack_depth, cache)
            result = backend.run_vm(vm, values, cache)
        self.last_steps = vm.steps
        return result

    def _dry_run(self, args: List[Any]) -> Any:
        """TFP's dry run: the plain function called directly on ``args``
        (batch dimension 1 or none), its result returned as it is."""
        for arg in args:
            for leaf in pattern_leaves(as_pattern(arg)):
                shape = tuple(getattr(leaf, "shape", np.shape(leaf)))
                if shape and shape[0] != 1:
                    raise ProgramError(
                        f"dry_run calls {self.__name__!r} directly, on one example: give "
                        f"arguments with a batch dimension of size 1 (or none), got shape "
                        f"{shape}; per_example(...) runs a whole batch one example at a "
                        f"time")
        with self.context._dry_running():
            return self.python(*args)

    def per_example(self, *args: Any, backend: Any = None, **kwargs: Any) -> Any:
        """The plain Python function over a batch, one example after another
        (size-1 and scalar arguments broadcast), results stacked on axis 0
        like a batched call's (tensors with a TensorFlow backend, or where an
        argument is a tensor).  Nothing is compiled; batched functions called
        inside run plainly too.  An oracle for the batched call."""
        args = [_as_argument(a) for a in self._bind(args, kwargs)]
        sizes = set()
        for arg in args:
            for leaf in pattern_leaves(arg):
                shape = tuple(getattr(leaf, "shape", np.shape(leaf)))
                if shape and shape[0] != 1:
                    sizes.add(int(shape[0]))
        if len(sizes) > 1:
            raise ProgramError(f"arguments of {self.__name__!r} have different batch sizes "
                               f"{sorted(sizes)}; give them one batch size (size 1 and "
                               f"scalars broadcast)")
        batch = sizes.pop() if sizes else 1

        def example(leaf: Any, i: int) -> Any:
            shape = tuple(getattr(leaf, "shape", np.shape(leaf)))
            if not shape:
                return leaf
            return leaf[0] if shape[0] == 1 else leaf[i]

        results = []
        with self.context._dry_running():
            for i in range(batch):
                one = [pattern_map(lambda leaf: example(leaf, i), a) for a in args]
                results.append(self.python(*one))
        if not results:
            return np.zeros((0,))
        columns = zip(*[pattern_leaves(as_pattern(r)) for r in results])
        stacked = [np.stack([np.asarray(v) for v in column]) for column in columns]
        backend = backend if backend is not None else _default_backend(args)
        if _is_tf_backend(backend):
            import tensorflow as tf
            stacked = [tf.constant(s) for s in stacked]
        return pattern_unflatten(as_pattern(results[0]), stacked)


def _executing_eagerly() -> bool:
    import tensorflow as tf
    return tf.executing_eagerly()
