"""The backend protocol: the array operations the batched executors call.

A backend stores every per-thread value as an array whose leading dimension
is the batch (one row per thread), and every stack as an array
``[frames, batch, ...]``.  The executors
(:mod:`autobatch.virtual_machine`, :mod:`autobatch.stackless`) never touch
arrays themselves; they call only the methods below, so a backend may be
eager NumPy, TensorFlow eager, ``tf.function`` or XLA.

Style: functional.  Methods that update storage return the updated array;
a backend with mutable arrays (NumPy) may update in place and return the same
object, one with immutable tensors returns a new one.  The VM's block code
is straight-line (no data-dependent Python control flow), so it can be
traced once by a graph backend.

Selections
----------
:meth:`select` turns ``(pc, block)`` into an opaque *selection*: the
threads about to run that block.  Values read through a selection are
*selection values*: the NumPy backend gathers just the selected rows
(compact: work is proportional to the number of selected threads); a
masking backend may instead return whole-batch values and apply the mask on
write.  Primop functions are applied to selection values, so they only need
to be elementwise along the leading dimension.  Selection values may be
scalars (a constant broadcast to every selected thread).

A masking backend computes on every thread: frame indices of threads
outside the selection may then be out of range (from -1 to ``frames``) and
must be clipped before gathering; primops see those threads' stale values
(they must not raise on them).  :class:`~autobatch.backends.numpy.MaskedNumpyBackend`
is such a backend, in NumPy: the semantics a TensorFlow/XLA backend
implements with ``tf.where``, gathers and scatters.

Besides these methods, the generated block code uses only Python operators
on selection values of call depths: ``d + 1``, ``d - 1``, ``d <= limit``
(int32 arrays or tensors), and ``<`` between :meth:`reduce_min`'s result and
an int.  The loop state handed to :meth:`while_loop` is a dict of arrays
plus two ints (``"next"``, ``"steps"``); each block function takes and returns
that dict with the same keys.

Minimal set of methods
----------------------
storage:     ``fill``, ``stack``, ``size``, ``as_batched``, ``to_numpy``
types:       ``type_of``, ``placeholder``
threads:     ``select``, ``read``, ``write``, ``read_frame``, ``write_frame``,
             ``where``, ``split``, ``part``, ``narrow``, ``merge``, ``callee_pc``
control:     ``reduce_min``, ``check``, ``while_loop``, ``switch_case``,
             ``wrap_block``

TFP's backend API (``fill(value, size, dtype, shape)``, ``type_of(t,
dtype_hint)``, ``while_loop(cond, body, loop_vars)``, ``switch_case(selector,
callables)``, ``batch_size``, ``cond``, ...) comes with every backend class:
:mod:`autobatch.backends.tfp_api` (the shared names take either argument
list).

Optional abilities are declared here, on the base class, with defaults
that mean "not offered" (the executors read them directly, never probe with
``getattr``/``hasattr``): ``compaction``, ``fused_loops``, ``phase_sizes``,
``run_vm``, ``run_on_dummies``, ``cache_key``, ``wrap_block``,
``while_loop``, ``switch_case``; ``tests/autobatch/test_backend_conformance.py``
checks every backend against them.

A backend whose arrays may change shape between steps sets
``compaction = True`` and provides ``running_threads(pc, halt) ->
(selection, count)`` and ``take_threads(array, selection, axis)``; the VM
then drops halted threads from every array once at most half still run
(see :meth:`autobatch.virtual_machine.VirtualMachine._run_compacting`).
A backend of static shapes (XLA) may instead override ``phase_sizes(batch,
lowered) -> sizes`` and provide ``more_running``, ``pack_running``, ``inert_rows``,
``take_rows``, ``put_rows`` and ``is_storage``: the VM then packs the running
threads into arrays of each size in turn as threads halt (see
:meth:`~autobatch.virtual_machine.VirtualMachine._run_phases`).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from autobatch.backends import variables as _variables
from autobatch.backends.tfp_api import TfpMethods, accept_tfp_arguments
from autobatch.ir import (
    TensorType, Type, VariableAllocation, as_pattern, pattern_leaves, pattern_map,
)

__all__ = ["Abilities", "Backend", "MAX_CHAIN", "dummies_for"]


def dummies_for(backend: Any, inputs: Sequence[Any]) -> List[Any]:
    """``inputs`` with every Type/TensorType leaf replaced by zeros of it
    (its shape taken whole: TFP's types given to ``run_on_dummies`` carry
    the batch dimension), made by ``backend.placeholder``."""
    def dummy(leaf: Any) -> Any:
        if not isinstance(leaf, TensorType):
            return leaf
        if isinstance(backend, Backend):
            return backend._var_zeros(TensorType(leaf.dtype, ()), tuple(leaf.shape))
        return np.zeros(tuple(leaf.shape), leaf.dtype)

    out = []
    for value in inputs:
        if isinstance(value, Type):
            value = value.tensors
        if any(isinstance(leaf, TensorType) for leaf in pattern_leaves(as_pattern(value))):
            value = pattern_map(dummy, as_pattern(value))
        out.append(value)
    return out

#: Most blocks one VM step runs through by jump threading (a backend that
#: keeps spare stack frames for a step's calls sizes them by it).
MAX_CHAIN = 16


class Abilities(abc.ABC):
    """What every backend declares, whether it runs the VM (:class:`Backend`)
    or compiles whole programs itself (``compiles_programs``: the JAX
    backend): its name, its optional abilities, and the two type hooks type
    inference uses."""

    #: A short name used in cache keys and messages (``"numpy"``).
    name: str = "abstract"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every backend's fill, type_of, while_loop and switch_case also take
        # TFP's argument lists (autobatch.backends.tfp_api).
        super().__init_subclass__(**kwargs)
        accept_tfp_arguments(cls)
    #: Whether the VM may drop halted threads (see the module doc).
    compaction: bool = False
    #: Whether a program without calls may run as one fused loop
    #: (:mod:`autobatch.fused`, generated NumPy) instead of on the VM.
    fused_loops: bool = False
    #: Whether the backend compiles whole programs itself (``compile(program)``
    #: returning an object with ``run(args)``), as the JAX backend does; the
    #: VM's array protocol below is then not used.
    compiles_programs: bool = False
    #: Whether programs may run on the native engine (:mod:`autobatch.native`,
    #: numba): False never, None where numba imports and the program lowers
    #: (the automatic choice), True always (NativeEngineError where it cannot).
    native: Optional[bool] = False

    def cache_key(self) -> Tuple[Any, ...]:
        """What makes two backend objects interchangeable for compiled code
        (equal keys: code compiled for one serves the other).  Here the
        class; a backend with settings adds them."""
        return (type(self),)

    def phase_sizes(self, batch: int, lowered: Any) -> List[int]:
        """Row counts a backend of static shapes packs the running threads
        into as they halt (see the module doc); none here.  A backend that
        returns sizes provides ``more_running``, ``pack_running``,
        ``inert_rows``, ``take_rows``, ``put_rows`` and ``is_storage``."""
        return []

    # -- types -----------------------------------------------------------------------------
    @abc.abstractmethod
    def type_of(self, value: Any, batch_size: int) -> TensorType:
        """The per-thread type of one array a primop returned for
        ``batch_size`` threads.  A Python scalar gives a *weak* type (it takes
        the dtype of what it meets); an array without the batch dimension
        (0-d) a strong scalar type.  Raise TypeError where the leading
        dimension is neither absent nor ``batch_size``."""

    @abc.abstractmethod
    def placeholder(self, tensor_type: TensorType, batch_size: int) -> Any:
        """A value of ``tensor_type`` for ``batch_size`` threads to run primops
        on during type inference (zeros)."""

    def run_on_dummies(self, primitive_callable: Callable[..., Any],
                       input_types: Sequence[Any]) -> Any:
        """``primitive_callable(*input_types)`` on :meth:`placeholder` values (type
        inference runs every primop so, to learn its outputs' types).  A backend whose
        surrounding context changes what operators mean (TensorFlow's TF1
        graphs) runs it as the batched run will.  As TFP's
        ``run_on_dummies(primitive_callable, input_types)``, an input may be
        a Type (or TensorType) whose shape includes the batch dimension: it
        is replaced by zeros of that type."""
        return primitive_callable(*dummies_for(self, input_types))


class Backend(Abilities, TfpMethods):
    """What the VM needs from an array library (see the module doc), plus
    TFP's backend methods (:class:`~autobatch.backends.tfp_api.TfpMethods`)."""

    #: The value :meth:`placeholder` fills with (and type inference gives a
    #: weak Python scalar's placeholder).
    placeholder_fill = 0
    #: Whether one op may take two dtypes (NumPy promotes).  False makes type
    #: inference give a variable only ever given Python constants the dtype
    #: of what a primop combines it with.
    mixes_dtypes = True

    # -- storage ------------------------------------------------------------------------
    @abc.abstractmethod
    def fill(self, tensor_type: TensorType, batch_size: int, value: Any = 0) -> Any:
        """A new array ``[batch_size, *tensor_type.shape]`` filled with ``value``."""

    @abc.abstractmethod
    def stack(self, tensor_type: TensorType, batch_size: int, frames: int,
              value: Any = 0) -> Any:
        """A new stack ``[frames, batch_size, *tensor_type.shape]`` filled with ``value``."""

    @abc.abstractmethod
    def size(self, array: Any) -> int:
        """The leading (batch) dimension of ``array``."""

    @abc.abstractmethod
    def as_batched(self, value: Any, tensor_type: TensorType, batch_size: int) -> Any:
        """A user's argument as a new storage array ``[batch_size, *shape]`` of
        ``tensor_type.dtype``: a value without the batch dimension, or with a
        batch dimension of 1, is broadcast to every thread.  Never aliases
        ``value`` (the executor may update storage in place)."""

    @abc.abstractmethod
    def to_numpy(self, value: Any) -> Any:
        """A result array as the backend hands it to the user."""

    # -- threads -------------------------------------------------------------------------
    @abc.abstractmethod
    def select(self, pc: Any, block: int) -> Any:
        """The selection of threads whose ``pc`` equals ``block``."""

    @abc.abstractmethod
    def read(self, array: Any, selection: Any) -> Any:
        """The selected threads' rows of ``array`` (a selection value)."""

    @abc.abstractmethod
    def write(self, array: Any, selection: Any, value: Any) -> Any:
        """``array`` with the selected threads' rows set to ``value`` (a
        selection value or a scalar; cast to ``array``'s dtype)."""

    @abc.abstractmethod
    def read_frame(self, stack: Any, selection: Any, frame: Any) -> Any:
        """``stack[frame[t], t]`` for each selected thread ``t`` (``frame`` is
        a selection value of frame indices)."""

    @abc.abstractmethod
    def write_frame(self, stack: Any, selection: Any, frame: Any, value: Any) -> Any:
        """``stack`` with ``stack[frame[t], t] = value[t]`` for each selected
        thread ``t``; other entries unchanged."""

    @abc.abstractmethod
    def where(self, condition: Any, x: Any, y: Any, name: Any = None) -> Any:
        """Elementwise ``x if condition else y`` on selection values or scalars
        (TFP's argument names; ``name`` unused)."""

    @abc.abstractmethod
    def split(self, selection: Any, cond: Any) -> Any:
        """The selected threads divided by ``cond`` (a boolean selection value
        or scalar): an opaque *split*, for running both arms of an if/else in
        one step."""

    @abc.abstractmethod
    def part(self, split: Any, side: bool) -> Any:
        """The selection of the threads on one side of ``split``."""

    @abc.abstractmethod
    def narrow(self, value: Any, split: Any, side: bool) -> Any:
        """A selection value of the whole selection, restricted to one side
        (a value of :meth:`part`'s selection); scalars unchanged."""

    @abc.abstractmethod
    def merge(self, split: Any, if_true: Any, if_false: Any, tensor_type: TensorType) -> Any:
        """One value of the whole selection from a value of each side (either
        may be a scalar), of ``tensor_type``'s dtype."""

    @abc.abstractmethod
    def callee_pc(self, selection: Any, entry: int, halt: int) -> Any:
        """The program counter array for a function run (stackless executor)
        over the selected threads: ``entry`` for those, ``halt`` for any
        other row the backend keeps."""

    # -- control -------------------------------------------------------------------------
    @abc.abstractmethod
    def reduce_min(self, t: Any, name: Any = None) -> Any:
        """The smallest element of ``t`` (TFP's name; the next block to run: every
        halted thread's pc is the largest index, so ``reduce_min(pc) < halt``
        means some thread is still active)."""

    @abc.abstractmethod
    def check(self, ok: Any, selection: Any, make_error: Callable[[], Exception]) -> None:
        """Raise ``make_error()`` unless ``ok`` (a selection value) holds for
        every selected thread.

        A backend that cannot raise inside compiled code should still make
        the failure visible (an assertion op, or a flag checked after the run).
        """

    def while_loop(self, cond: Callable[[Any], Any], body: Callable[[Any], Any],
                   state: Any) -> Any:
        """``while cond(state): state = body(state)``; returns the final state."""
        while cond(state):
            state = body(state)
        return state

    def switch_case(self, index: Any, branches: Sequence[Callable[[Any], Any]],
                    state: Any) -> Any:
        """``branches[index](state)``."""
        return branches[int(index)](state)

    def wrap_block(self, function: Callable[[dict], dict], name: str) -> Callable[[dict], dict]:
        """Hook to compile one block's code (``tf.function``, say); identity here."""
        return function

    # -- TFP's backend helpers ------------------------------------------------------------
    def full_mask(self, size: int, name: Optional[str] = None) -> Any:
        """A boolean array of ``size`` True values (TFP's ``full_mask``;
        ``name`` is accepted for TFP's signature)."""
        return self.fill(TensorType(np.bool_, ()), size, True)

    def merge_dtypes(self, dt1: Any, dt2: Any) -> Any:
        """The dtype covering ``dt1`` and ``dt2`` (None: unknown), as TFP's
        TensorFlow backend: equal dtypes, else ValueError.  (Type inference
        itself also lets Python constants take their variable's dtype.)"""
        if dt1 is None or dt2 is None:
            return dt1 if dt2 is None else dt2
        if np.dtype(dt1) != np.dtype(dt2):
            raise ValueError(f"Mismatched dtypes {np.dtype(dt1)} vs {np.dtype(dt2)}")
        return np.dtype(dt1)

    def merge_shapes(self, s1: Any, s2: Any) -> Any:
        """The broadcast of shapes ``s1`` and ``s2`` (None: unknown), as TFP's
        backends; ValueError where they are not broadcast-compatible."""
        if s1 is None or s2 is None:
            return s1 if s2 is None else s2
        return tuple(np.broadcast_shapes(tuple(s1), tuple(s2)))

    def create_variable(self, name: Any, alloc: Any, type_: Any, max_stack_depth: int,
                        batch_size: int) -> Any:
        """TFP's ``create_variable``: a new variable object (see
        :mod:`autobatch.backends.variables`) for allocation ``alloc``,
        zeros of ``type_`` (a TensorType, or a Type: a pattern of them gives
        the same pattern of variables) per thread.  ``name`` names the
        variable in a stack overflow's message."""
        v = _variables
        tensors = type_.tensors if isinstance(type_, Type) else type_
        if isinstance(tensors, (tuple, list)):
            return pattern_map(lambda t: self.create_variable(name, alloc, t, max_stack_depth,
                                                              batch_size), tuple(tensors))
        alloc = VariableAllocation(alloc)
        if alloc == VariableAllocation.NULL:
            return v.NullVariable()
        if alloc == VariableAllocation.TEMPORARY:
            return v.TemporaryVariable.empty()
        tensor_type = TensorType(tensors.dtype, tuple(tensors.shape))
        value = self._var_zeros(tensor_type, (batch_size,))
        if alloc == VariableAllocation.REGISTER:
            return v.RegisterVariable(value, backend=self)
        stack = v.Stack(self._var_zeros(tensor_type, (max_stack_depth, batch_size)),
                        self._var_zeros(TensorType(np.int32, ()), (batch_size,)))
        return v.FullVariable(value, stack, name=str(name), backend=self)

    # The array work of the variable objects, in NumPy (TensorFlow overrides).
    def _var_zeros(self, tensor_type: TensorType, lead: Tuple[int, ...]) -> Any:
        return np.zeros(lead + tensor_type.shape, tensor_type.dtype)

    def _var_where(self, mask: Any, new: Any, old: Any) -> Any:
        mask = np.asarray(mask)
        old = np.asarray(old)
        return np.where(mask.reshape(mask.shape + (1,) * (old.ndim - mask.ndim)), new, old)

    def _var_depth(self, stack: Any) -> int:
        return int(stack.shape[0])

    def _var_step(self, index: Any, mask: Any, delta: int) -> Any:
        return index + delta * np.asarray(mask, dtype=index.dtype)

    def _var_guard(self, values: Tuple[Any, ...], failed: Callable[[], Any],
                   make_error: Callable[[], Exception]) -> Tuple[Any, ...]:
        """``values`` unchanged; raise ``make_error()`` where any element of
        ``failed()`` holds (a graph backend makes ``values`` depend on an
        assertion instead)."""
        if bool(np.any(failed())):
            raise make_error()
        return values

    def _var_stack_read(self, stack: Any, index: Any) -> Any:
        rows = np.clip(index, 0, stack.shape[0] - 1)
        return stack[rows, np.arange(stack.shape[1])]

    def _var_stack_write(self, stack: Any, index: Any, mask: Any, value: Any) -> Any:
        stack = stack.copy()
        mask = np.asarray(mask, dtype=bool)
        threads = np.arange(stack.shape[1])[mask]
        stack[np.asarray(index)[mask], threads] = np.asarray(value)[mask]
        return stack

    # -- whole runs ------------------------------------------------------------------------
    def run_vm(self, vm: Any, args: Sequence[Any], cache: Optional[dict] = None) -> Any:
        """Run ``vm`` (a VirtualMachine built with this backend) over ``args``
        and return main's value; ``vm.steps`` is set.  Here: ``vm.run(args)``.
        A backend that compiles whole runs (TensorFlow's graph and XLA modes)
        overrides this; ``cache`` is where it may keep the compiled run."""
        return vm.run(args)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

