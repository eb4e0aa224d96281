"""The TensorFlow backend: the batched VM eagerly, in ``tf.function``, or with XLA.

Modes (``TensorFlowBackend(mode=...)``):

- ``"eager"``: the VM's loop runs in Python, one block per step.  Each
  block's code is traced once into a graph (kept in the
  ``block_code_cache``) and called with the state's tensors, so a step is one
  graph call, not a dozen eager ops; ``compile_blocks=False`` runs every op
  eagerly instead.
- ``"graph"``: the whole run (every step, every block) is one
  ``tf.function``: ``tf.while_loop`` around ``tf.switch_case`` over the
  blocks, the chosen block called as a function.  Traced once per program
  and argument signature.
- ``"xla"``: the same function with ``jit_compile=True``.

Selections: ``"gather"`` (the default for eager and graph) selects the
threads at a block with ``tf.where`` and gathers/scatters their rows, so
primops see only those threads (work proportional to them; dynamic shapes).
XLA needs static shapes.  ``"mask"`` computes every block on every thread
and keeps the selected rows with ``tf.where``: primops then also see threads
outside the selection (stale values), as the backend protocol allows.
``"bucket"`` packs the selected threads into the smaller of two static
sizes (a quarter of the batch, the whole batch: :func:`bucket_sizes`) and
runs the block on those rows only, each block compiled once per size;
padding slots hold stale rows too, and their writes are dropped.
``"auto"`` (the XLA default) buckets the blocks that compute on or move
(push, pop, copy) per-thread vectors or matrices (NUTS-shaped: 4-5x faster
than masks) and masks the others (on scalars, as in fib, packing costs more
than the few operations it saves, and each bucket is one more compiled copy
of the block).

Storage: stacks are thread-major, ``[batch, frames, ...]``: a push or pop is
one gather or scatter of one row per selected thread.  In graph mode with
gathering, every register and stack (held flat, ``[batch * frames, ...]``) is
an anonymous resource variable updated in place (TensorFlow's executor would copy a whole tensor per scatter: a push
would cost the whole stack); the while loop captures the variables rather
than carrying them.  XLA keeps tensors (it updates loop buffers in place) and
runs two VM steps per loop pass for programs of per-thread scalars; on large
batches of those, once at most an eighth of the threads still run, it packs
them into arrays of an eighth of the size and goes on there (fib over
10,000 threads: 2.1x faster steady, about 3 s more compile).

Stack overflow: where the VM runs inside a graph, the depth check cannot
raise; the failing check's code is kept in the loop state, the loop stops, and
:meth:`TensorFlowBackend.run_vm` raises the engine's StackOverflowError after
the run.  Eagerly, the check raises at once.

Results are ``tf.Tensor`` s (EagerTensors outside a graph); ``.numpy()``
gives arrays.  Inside a user's own ``tf.function`` the VM builds graph ops
(``tf.while_loop``, ``tf.switch_case``) whatever the mode.

Not thread-safe: a backend object traces one program at a time.
"""
from __future__ import annotations

import logging
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.ops import resource_variable_ops

from autobatch.backends.base import MAX_CHAIN, Backend, dummies_for
from autobatch.ir import TensorType, rebuild

__all__ = ["TensorFlowBackend", "MODES", "SELECTIONS"]

log = logging.getLogger(__name__)

#: The ways the VM can run on TensorFlow.
MODES = ("eager", "graph", "xla")
#: How threads at a block are picked: gather their rows, mask every row, or
#: (XLA) pack them into the smallest of a few static bucket sizes.
SELECTIONS = ("gather", "mask", "bucket", "auto")

#: Extra stack frames of gathering backends (see TensorFlowBackend.stack):
#: one per call a VM step can make after its overflow check failed.
SPARE_FRAMES = MAX_CHAIN + 1

#: XLA runs of scalar programs over at least this many threads pack the
#: running threads into a PHASE_DIVISOR-th of the batch once few enough run.
PHASE_MIN_BATCH = 4096
PHASE_DIVISOR = 8

#: Loop-state key of the error code (0: no failed check).
ERROR_KEY = "__error"

# The errors of failed checks inside graphs, by code (index + 1).  Shared by
# every backend object, because block code traced with one backend may be
# reused (through a block_code_cache) by an equal one.
_ERROR_MAKERS: List[Callable[[], Exception]] = []
_TRACE_COUNTS: Dict[Tuple[Any, ...], int] = {}
_ERROR_CODES: Dict[int, int] = {}


def _error_code(make_error: Callable[[], Exception]) -> int:
    code = _ERROR_CODES.get(id(make_error))
    if code is None or _ERROR_MAKERS[code - 1] is not make_error:
        _ERROR_MAKERS.append(make_error)
        code = len(_ERROR_MAKERS)
        _ERROR_CODES[id(make_error)] = code
    return code


def raise_for_error_code(code: int) -> None:
    """Raise the error of a failed check whose ``code`` a graph run returned
    (nothing for 0)."""
    code = int(code)
    if code:
        raise _ERROR_MAKERS[code - 1]()


_ANONYMOUS = context.anonymous_name()


def _run_as_function(outputs: Any, op_types: Tuple[str, ...]) -> None:
    """Keep the control-flow op that made ``outputs`` a function call.

    TensorFlow lowers a ``Case`` in a graph to switch/merge nodes, so every
    step walks (as dead nodes) the code of every block; called as a function
    it runs only the chosen block: fewer nodes per step (measured 20-40%
    faster on fib).  Uses the private lowering attribute; where the graph's
    structure is not as expected, nothing is changed.
    """
    from tensorflow.core.framework import attr_value_pb2
    flat = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
    op = flat[0].op if flat else None
    for _ in range(8):
        if op is None or op.type in op_types:
            break
        op = op.inputs[0].op if op.inputs else None
    if op is not None and op.type in op_types:
        op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


def _in_xla_context(graph: Any) -> bool:
    """Whether ``graph`` (or a graph it is nested in) is being built for XLA
    (a ``tf.function(jit_compile=True)``)."""
    from tensorflow.python.ops import control_flow_util
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def _leave_autobatch_to_python() -> None:
    """AutoGraph (``tf.function``'s default) calls autobatch's own code as
    Python, unconverted, as TensorFlow's rules already do for TFP's
    (``DoNotConvert('tensorflow_probability')``): a batched function first
    called inside a ``tf.function`` was converted and failed while compiling
    (TypeError ``tf__fibonacci() missing 1 required positional argument``).
    The user's functions are still run by autobatch, which batches them."""
    from tensorflow.python.autograph.core import config
    if not any(isinstance(rule, config.DoNotConvert) and getattr(rule, "_prefix", None)
               == "autobatch" for rule in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config.DoNotConvert("autobatch"),) + \
            tuple(config.CONVERSION_RULES)


_leave_autobatch_to_python()


def _legacy_graph(graph: Any) -> bool:
    """Whether ``graph`` is built as TF1 code (a ``tf.compat.v1.Graph``, not
    a function), where ``==`` on tensors compares identity."""
    return not tf.executing_eagerly() and not getattr(graph, "building_function", False) \
        and not tf.compat.v1.executing_eagerly_outside_functions()


def _is_variable(value: Any) -> bool:
    return tf.is_tensor(value) and value.dtype == tf.resource


def _variable_dtype(handle: tf.Tensor) -> tf.DType:
    data = resource_variable_ops.get_eager_safe_handle_data(handle)
    return tf.as_dtype(data.shape_and_type[0].dtype)


def _storage_shape(array: Any) -> Tuple[Optional[int], ...]:
    """The static shape of a storage array or of the variable holding it."""
    if _is_variable(array):
        data = resource_variable_ops.get_eager_safe_handle_data(array)
        return tuple(tf.TensorShape(data.shape_and_type[0].shape).as_list())
    return tuple(array.shape.as_list())


class _Rows:
    """A gathering backend's selection: ``rows``, the ``[n]`` (int64) indices
    of the selected threads, with per-trace caches of the ops derived from it
    (the count, flat stack indices).

    Indices are 1-D so that registers use ``ResourceGather`` /
    ``ResourceScatterUpdate`` and stacks (stored flat, ``[batch * frames,
    ...]``) are indexed by ``row * frames + frame``: measured 3x faster per
    selected thread than the N-d gathers and scatters.
    """

    __slots__ = ("rows", "_count", "_flat")

    def __init__(self, rows: tf.Tensor) -> None:
        self.rows = rows
        self._count: Optional[tf.Tensor] = None
        self._flat: Dict[Tuple[int, int], Tuple[Any, tf.Tensor]] = {}

    def count(self) -> tf.Tensor:
        """``[n]``: the shape of a value of the selection (as a 1-element tensor)."""
        if self._count is None:
            self._count = tf.shape(self.rows, out_type=tf.int64)
        return self._count

    def flat_indices(self, frame: tf.Tensor, frames: int) -> tf.Tensor:
        """``[n]`` indices ``row * frames + frame`` into a flattened
        ``[batch * frames, ...]`` stack."""
        cached = self._flat.get((id(frame), frames))
        if cached is None or cached[0] is not frame:
            cached = (frame, self.rows * frames + tf.cast(frame, tf.int64))
            self._flat[(id(frame), frames)] = cached
        return cached[1]


class _Bucket:
    """A bucketing backend's selection (XLA): the selected threads packed
    first into ``rows``, ``[m]`` thread indices for a static bucket size
    ``m``, and ``valid`` (``[m]`` bool), which of those slots hold a
    selected thread.  Values read through it have ``m`` rows, so a block's
    primops compute on about as many threads as it runs, not on the whole
    batch; writes scatter the valid rows back (the others go out of range,
    which XLA's scatters drop)."""

    __slots__ = ("rows", "valid", "batch")

    def __init__(self, rows: tf.Tensor, valid: tf.Tensor, batch: int) -> None:
        self.rows, self.valid, self.batch = rows, valid, batch

    def targets(self) -> tf.Tensor:
        """``[m]`` rows to write: the thread, or ``batch`` (dropped) for an
        invalid slot."""
        return tf.where(self.valid, self.rows, self.batch)

    def narrowed(self, keep: tf.Tensor) -> "_Bucket":
        return _Bucket(self.rows, tf.logical_and(self.valid, keep), self.batch)


#: Bucket sizes as fractions of the batch (each costs a compiled copy of
#: every block).
BUCKET_DIVISORS = (4, 1)


def bucket_sizes(batch: int) -> List[int]:
    """The static bucket sizes for ``batch`` threads: ``ceil(batch / d)``
    for d in :data:`BUCKET_DIVISORS`, ascending, without repeats."""
    return sorted({max(1, -(-batch // d)) for d in BUCKET_DIVISORS})


class _CompiledBlock:
    """A block's code as one graph, called eagerly (eager mode).

    Traced once per set of state keys into a concrete function that takes
    the state's tensors positionally: a step then costs one graph call,
    without ``tf.function``'s per-call signature matching (most of an eager
    step's time otherwise).  Non-tensor state entries (the step count) pass
    around it.
    """

    def __init__(self, block: Callable[[dict], dict]) -> None:
        self.block = block
        self.__name__ = block.__name__
        self._concrete: Dict[Tuple[str, ...], Any] = {}

    @property
    def tracing_count(self) -> int:
        """How many graphs were traced for this block."""
        return len(self._concrete)

    def __call__(self, state: dict) -> dict:
        keys = tuple(k for k, v in state.items() if tf.is_tensor(v))
        compiled = self._concrete.get(keys)
        if compiled is None:
            out_keys: List[str] = []

            def flat(*tensors: tf.Tensor) -> List[tf.Tensor]:
                out = self.block(dict(zip(keys, tensors)))
                out_keys.extend(k for k, v in out.items() if tf.is_tensor(v))
                return [out[k] for k in out_keys]

            specs = [tf.TensorSpec.from_tensor(state[k]) for k in keys]
            concrete = tf.function(flat, autograph=False).get_concrete_function(*specs)
            compiled = self._concrete[keys] = (concrete, out_keys)
        concrete, out_keys = compiled
        inputs = [state[k] for k in keys]
        call_flat = getattr(concrete, "_call_flat", None)
        if call_flat is not None:  # no per-call signature binding
            values = call_flat(inputs, concrete.captured_inputs)
        else:
            values = concrete(*inputs)
        return {**state, **dict(zip(out_keys, values))}


def _scalar_program(lowered: Any) -> bool:
    """Whether every value of the lowered program is a scalar per thread."""
    return all(not leaf.shape for typ in lowered.var_types.values() for leaf in typ.leaves())


def _tf_dtype(dtype: Any) -> tf.DType:
    return tf.as_dtype(np.dtype(dtype))


def _is_python_scalar(value: Any) -> bool:
    return isinstance(value, (bool, numbers.Number)) and not isinstance(value, np.generic)


class TensorFlowBackend(Backend):
    """Runs autobatch programs on TensorFlow (see the module doc).

    Parameters
    ----------
    mode : ``"eager"``, ``"graph"`` (default) or ``"xla"``.
    selection : ``"gather"``, ``"mask"``, or for XLA ``"bucket"`` or
        ``"auto"``; default ``"auto"`` for XLA (buckets for the blocks that
        compute on or move per-thread vectors or matrices, masks for the
        others), else ``"gather"``.
    compile_blocks : eager mode only: run each block as one traced graph
        (default True) instead of op by op.
    safety_checks : TFP's switch (default True): False drops the
        stack-overflow checks; an overflowing thread's result is then wrong
        and nothing says so.  A bool as the first argument is this (TFP's
        order: ``TensorFlowBackend(safety_checks, ...)``).
    while_parallel_iterations, while_maximum_iterations,
    basic_block_xla_device : TFP's, by keyword: the first is accepted and
        not used; the others must be None (ValueError otherwise).

    Two backends with the same settings are equal (and hash alike), so
    compiled code cached for one is reused by the other.
    """

    name = "tensorflow"
    #: The value of type inference's placeholders (:meth:`placeholder`; weak
    #: Python scalars too): ones, as TFP's, since an integer ``a % b`` raises
    #: on a zero ``b`` here.
    placeholder_fill = 1
    #: TensorFlow refuses ``int64 < int32``: constants-only variables take
    #: their partner's dtype (see :class:`~autobatch.backends.base.Backend`).
    mixes_dtypes = False

    def __init__(self, mode: str = "graph", selection: Optional[str] = None,
                 compile_blocks: bool = True, safety_checks: bool = True, *,
                 while_parallel_iterations: int = 10,
                 while_maximum_iterations: Optional[int] = None,
                 basic_block_xla_device: Optional[str] = None) -> None:
        if isinstance(mode, bool):
            # TFP's TensorFlowBackend(safety_checks, ...): its first argument.
            mode, safety_checks = "graph", mode
        if while_maximum_iterations is not None or basic_block_xla_device is not None:
            raise ValueError(
                "TensorFlowBackend: TFP's while_maximum_iterations and "
                "basic_block_xla_device are not supported (autobatch bounds a run by "
                "max_stack_depth, and compiles with mode='xla'); leave them None")
        #: TFP's ``while_parallel_iterations``: accepted, not used (each
        #: iteration of autobatch's loop depends on the one before).
        self.while_parallel_iterations = int(while_parallel_iterations)
        if mode not in MODES:
            raise ValueError(f"TensorFlowBackend mode must be one of {MODES}, got {mode!r}")
        if selection is None:
            selection = "auto" if mode == "xla" else "gather"
        if selection not in SELECTIONS:
            raise ValueError(f"TensorFlowBackend selection must be one of {SELECTIONS}, "
                             f"got {selection!r}")
        if mode == "xla" and selection == "gather":
            raise ValueError("XLA needs static shapes: use selection='mask' or 'bucket' "
                             "with mode='xla' (gathering the selected threads makes shapes "
                             "data-dependent)")
        if mode != "xla" and selection in ("bucket", "auto"):
            raise ValueError(f"selection={selection!r} needs mode='xla' (buckets rely on "
                             f"XLA dropping out-of-range scatter updates)")
        self.mode = mode
        self.selection = selection
        self.compile_blocks = bool(compile_blocks)
        #: TFP's switch: False drops the stack-overflow checks (a thread that
        #: overflows then computes garbage, unreported).
        self.safety_checks = bool(safety_checks)
        #: Storage is whole-batch and written under a mask or a bucket.
        self.masked = selection in ("mask", "bucket", "auto")
        #: While tracing one bucket's branch of a block: its size.
        self._bucket: Optional[int] = None
        self._variables = mode == "graph" and not self.masked
        #: Whether the graph being built may hold resource variables: False
        #: in a user's TF1 graph (no automatic control dependencies order the
        #: variable reads and writes) and under a user's XLA.
        self._variables_ok = True
        #: VM steps per pass of the graph's while loop, for programs whose
        #: values are all scalars per thread (see :meth:`_graph_run`).
        self.unroll = 2 if mode == "xla" else 1
        self._steps_per_pass = 1
        self._pending_checks: List[Any] = []
        self._final_error: Any = None
        #: id(stack variable) -> (the variable, its frames per thread).
        self._stack_frames: Dict[int, Tuple[Any, int]] = {}

    @property
    def trace_count(self) -> int:
        """How many times a whole program run was traced into a graph, by any
        backend equal to this one."""
        return _TRACE_COUNTS.get(self._config(), 0)

    # -- identity -------------------------------------------------------------------
    def _config(self) -> Tuple[Any, ...]:
        return (type(self), self.mode, self.selection, self.compile_blocks,
                self.safety_checks)

    def cache_key(self) -> Tuple[Any, ...]:
        return self._config()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TensorFlowBackend) and self._config() == other._config()

    def __hash__(self) -> int:
        return hash(self._config())

    def __repr__(self) -> str:
        return f"TensorFlowBackend(mode={self.mode!r}, selection={self.selection!r})"

    # -- storage ----------------------------------------------------------------------
    def fill(self, tensor_type: TensorType, batch_size: int, value: Any = 0) -> Any:
        scalar = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        array = tf.fill((batch_size,) + tensor_type.shape, scalar)
        return self._maybe_variable(array)

    def stack(self, tensor_type: TensorType, batch_size: int, frames: int,
              value: Any = 0) -> Any:
        """``[batch, frames, ...]``; gathering backends add spare frames, so that
        the pushes of a step whose overflow check failed (the run stops after
        it) stay in range without clipping every frame index."""
        if not self.masked:
            frames += SPARE_FRAMES
        scalar = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        array = tf.fill((batch_size, frames) + tensor_type.shape, scalar)
        if not self._in_variables():
            return array
        # A variable cannot be reshaped: it holds the stack flat,
        # [batch * frames, ...], and the frame count is kept beside it.
        handle = self._maybe_variable(tf.reshape(array, (batch_size * frames,)
                                                 + tensor_type.shape))
        self._stack_frames[id(handle)] = (handle, frames)
        return handle

    def size(self, array: Any) -> int:
        """Threads in a register (not a stack)."""
        dim = _storage_shape(array)[0]
        return int(dim) if dim is not None else tf.shape(array)[0]

    def _frames_of(self, stack: Any) -> int:
        """Frames per thread of a stack (tensor ``[batch, frames, ...]`` or
        flat variable)."""
        if _is_variable(stack):
            kept = self._stack_frames[id(stack)]
            assert kept[0] is stack
            return kept[1]
        return stack.shape[1]

    def as_batched(self, value: Any, tensor_type: TensorType, batch_size: int) -> Any:
        dtype = _tf_dtype(tensor_type.dtype)
        if tf.is_tensor(value):
            tensor = tf.cast(value, dtype)
        else:
            tensor = tf.constant(np.asarray(value, dtype=tensor_type.dtype))
        if tensor.shape.rank == len(tensor_type.shape):
            tensor = tensor[None]
        # tf.identity: a new tensor even where no broadcast is needed (tensors
        # are immutable, so aliasing the user's value is harmless anyway).
        array = tf.identity(tf.broadcast_to(tensor, (batch_size,) + tensor_type.shape))
        return self._maybe_variable(array)

    def to_numpy(self, value: Any) -> Any:
        """Results stay tensors (EagerTensors outside a graph)."""
        if _is_variable(value):
            return tf.raw_ops.ReadVariableOp(resource=value, dtype=_variable_dtype(value))
        return value

    def _in_variables(self) -> bool:
        """Whether storage made now lives in resource variables (graph mode,
        gathering, while tracing)."""
        return self._variables and self._variables_ok and not tf.executing_eagerly()

    def _maybe_variable(self, array: tf.Tensor) -> Any:
        """``array``, or (graph mode, gathering, inside a graph) a new anonymous
        resource variable holding it.

        TensorFlow's graph executor copies a tensor that a scatter updates
        (inside a while loop the buffer is never forwarded), so every push to
        a tensor stack would cost the whole stack; a variable is updated in
        place (``ResourceScatterNdUpdate``): O(selected threads).  The loop
        captures variables instead of carrying them (fewer loop variables and
        graph nodes per step).  Anonymous: freed with the run's last handle.
        """
        if not self._in_variables():
            return array
        handle = tf.raw_ops.VarHandleOp(dtype=array.dtype, shape=array.shape,
                                        shared_name=_ANONYMOUS)
        tf.raw_ops.AssignVariableOp(resource=handle, value=array)
        return handle

    # -- TFP's backend methods (autobatch.backends.tfp_api), in TensorFlow --------------
    def executes_eagerly(self) -> bool:
        return tf.executing_eagerly()

    def full_mask(self, size: Any, name: Any = None) -> Any:
        """A tensor of ``size`` True values (never a resource variable)."""
        return tf.ones(tf.reshape(tf.convert_to_tensor(size), [1]), tf.bool)

    def tfp_fill(self, value: Any, size: Any, dtype: Any, shape: Any, name: Any = None) -> Any:
        dtype = _tf_dtype(dtype)
        size = tf.convert_to_tensor(size)
        dims = tf.concat([tf.reshape(size, [1]),
                          tf.cast(tf.reshape(tf.convert_to_tensor(shape, size.dtype), [-1]),
                                  size.dtype)], 0)
        return tf.fill(dims, tf.cast(value, dtype))

    def tfp_type_of(self, t: Any, dtype_hint: Any = None) -> TensorType:
        """TFP's ``type_of``: dtype and whole shape of ``t`` (converted with
        ``dtype_hint`` in a scratch graph where no eager context runs)."""
        if not tf.is_tensor(t):
            if tf.executing_eagerly():
                t = tf.convert_to_tensor(t, dtype_hint)
            else:
                with tf.Graph().as_default():
                    t = tf.convert_to_tensor(t, dtype_hint)
        # The batch dimension (the first) may be unknown, as a TF1
        # placeholder of shape [None, ...] leaves it: the signature drops it.
        if t.shape.rank is None or None in t.shape.as_list()[1:]:
            raise TypeError(f"type_of needs a static shape, got {t.shape}")
        return TensorType(t.dtype.as_numpy_dtype, tuple(t.shape.as_list()))

    def tfp_while_loop(self, cond: Callable[..., Any], body: Callable[..., Any],
                       loop_vars: Sequence[Any], name: Any = None) -> Any:
        if tf.executing_eagerly():
            while bool(cond(*loop_vars)):
                loop_vars = body(*loop_vars)
            return loop_vars
        return tf.while_loop(cond, body, loop_vars, name=name)

    def tfp_switch_case(self, branch_selector: Any, branch_callables: Sequence[Callable[[], Any]],
                        name: Any = None) -> Any:
        if tf.executing_eagerly():
            return branch_callables[int(branch_selector)]()
        return tf.switch_case(branch_selector, list(branch_callables), name=name)

    def batch_size(self, value: Any, name: Any = None) -> Any:
        """The leading dimension of ``value``: an int where it is static, else
        a scalar tensor; 1 for a scalar."""
        value = tf.convert_to_tensor(value)
        if value.shape.rank == 0:
            return 1
        if value.shape.rank is not None and value.shape[0] is not None:
            return int(value.shape[0])
        return tf.reduce_prod(tf.shape(value)[:1])

    def static_value(self, t: Any) -> Any:
        return t.numpy() if tf.executing_eagerly() and tf.is_tensor(t) else (
            None if tf.is_tensor(t) else np.asarray(t))

    def assert_matching_dtype(self, expected_dtype: Any, value: Any, message: str = "") -> None:
        if tf.is_tensor(value):
            found = np.dtype(value.dtype.as_numpy_dtype)
        elif hasattr(value, "dtype"):
            found = np.dtype(value.dtype)
        else:  # a Python constant takes the expected dtype where it can
            found = np.dtype(tf.convert_to_tensor(value, _tf_dtype(expected_dtype))
                             .dtype.as_numpy_dtype)
        if found != np.dtype(expected_dtype):
            raise ValueError(f"Mismatched dtype: expected {np.dtype(expected_dtype)} found "
                             f"{found}. {message}")

    def broadcast_to_shape_of(self, val: Any, target: Any, name: Any = None) -> Any:
        target = tf.convert_to_tensor(target)
        val = tf.cast(val, target.dtype) if not tf.is_tensor(val) else val
        return tf.broadcast_to(val, tf.shape(target))

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any],
             name: Any = None) -> Any:
        return tf.cond(pred, true_fn, false_fn, name=name)

    def equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return tf.equal(t1, t2, name=name)

    def not_equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return tf.not_equal(t1, t2, name=name)

    def any(self, t: Any, name: Any = None) -> Any:
        return tf.reduce_any(t, name=name)

    # -- types ---------------------------------------------------------------------------
    def type_of(self, value: Any, batch_size: int) -> TensorType:
        if _is_python_scalar(value):
            return TensorType(np.asarray(value).dtype, (), weak=True)
        if tf.is_tensor(value):
            shape = tuple(value.shape)
            dtype = value.dtype.as_numpy_dtype
        else:
            array = np.asarray(value)
            shape, dtype = array.shape, array.dtype
        if len(shape) == 0:  # a constant: takes its variable's dtype (see numpy_type_of)
            return TensorType(dtype, (), weak=True)
        if shape[0] != batch_size or None in shape[1:]:
            raise TypeError(f"a primop returned a value of shape {shape} for {batch_size} "
                            f"thread(s); outputs must have the batch dimension first, or "
                            f"be scalars, and a static shape per thread")
        return TensorType(dtype, shape[1:])

    def run_on_dummies(self, primitive_callable: Callable[..., Any],
                       input_types: Sequence[Any]) -> Any:
        """``primitive_callable(*input_types)``; in a TF1 graph, as TF2 code (eagerly), so
        that type inference sees what the run (traced as TF2 code, see
        :meth:`_run_in_users_graph`) computes: ``==`` on tensors is
        elementwise there, identity in TF1 graphs."""
        inputs = dummies_for(self, input_types)
        if _legacy_graph(tf.compat.v1.get_default_graph()):
            try:
                with context.eager_mode():
                    eager = tf.nest.map_structure(
                        lambda v: tf.ones(v.shape, v.dtype) if tf.is_tensor(v) else v, inputs)
                    return primitive_callable(*eager)
            except TypeError as exc:
                if "out of scope" not in str(exc):
                    raise
                # The primitive closes over a tensor of the user's TF1 graph
                # (TypeError "... is out of scope"): it runs in that graph, as
                # TFP's run_on_dummies always does.
        return primitive_callable(*inputs)

    # -- TFP's variable objects (autobatch.backends.variables) -------------------------
    def _var_zeros(self, tensor_type: TensorType, lead: Tuple[int, ...]) -> tf.Tensor:
        return tf.zeros(tuple(lead) + tensor_type.shape, _tf_dtype(tensor_type.dtype))

    def _var_where(self, mask: Any, new: Any, old: Any) -> tf.Tensor:
        old = tf.convert_to_tensor(old)
        mask = tf.convert_to_tensor(mask)
        extra = (old.shape.rank - mask.shape.rank
                 if old.shape.rank is not None and mask.shape.rank is not None
                 else tf.rank(old) - tf.rank(mask))
        mask = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([extra], tf.int32)], 0))
        out = tf.where(mask, tf.cast(new, old.dtype), old)
        if not tf.executing_eagerly():
            out.set_shape(old.shape)  # a value of unknown shape written to a known one
        return out

    def _var_step(self, index: Any, mask: Any, delta: int) -> tf.Tensor:
        return index + delta * tf.cast(mask, index.dtype)

    def _var_guard(self, values: Tuple[Any, ...], failed: Callable[[], Any],
                   make_error: Callable[[], Exception]) -> Tuple[Any, ...]:
        """Eagerly: raise now.  In a graph: ``values`` through an assertion
        whose message is the error (``tf.errors.InvalidArgumentError`` when
        the graph runs and the check fails), as TFP's stacks do.  Nothing
        with ``safety_checks=False``."""
        if not self.safety_checks:
            return values
        hit = tf.reduce_any(failed())
        if tf.executing_eagerly():
            if bool(hit):
                raise make_error()
            return values
        error = make_error()
        check = tf.debugging.Assert(tf.logical_not(hit), [f"{type(error).__name__}: {error}"])
        with tf.control_dependencies([check]):
            return tuple(tf.identity(v) for v in values)

    def _var_stack_read(self, stack: Any, index: Any) -> tf.Tensor:
        rows = tf.clip_by_value(index, 0, stack.shape[0] - 1)
        threads = tf.range(tf.shape(index)[0], dtype=rows.dtype)
        return tf.gather_nd(stack, tf.stack([rows, threads], axis=1))

    def _var_stack_write(self, stack: Any, index: Any, mask: Any, value: Any) -> tf.Tensor:
        frames = tf.range(stack.shape[0], dtype=index.dtype)[:, None]
        hit = tf.logical_and(tf.equal(frames, index[None, :]), tf.cast(mask, tf.bool)[None, :])
        return self._var_where(hit, tf.cast(value, stack.dtype)[None], stack)

    def placeholder(self, tensor_type: TensorType, batch_size: int) -> tf.Tensor:
        """Ones, not zeros: TensorFlow raises on an integer division by zero
        (``a % b`` in a primop), where NumPy only warns."""
        return tf.ones((batch_size,) + tensor_type.shape, _tf_dtype(tensor_type.dtype))

    # -- threads -------------------------------------------------------------------------
    def select(self, pc: Any, block: int) -> Any:
        hit = tf.equal(self.to_numpy(pc), block)
        if self._bucket is not None:
            return self._pack(hit, self._bucket)
        if self.masked:
            return hit
        return _Rows(tf.reshape(tf.where(hit), [-1]))

    @staticmethod
    def _pack(hit: tf.Tensor, size: int) -> _Bucket:
        """The threads where ``hit`` holds, packed in order into ``size``
        slots (a running count places each; the VM picks a bucket that holds
        them all)."""
        batch = hit.shape[0]
        hits = tf.cast(hit, tf.int32)
        slot = tf.where(hit, tf.cumsum(hits) - 1, size)
        rows = tf.tensor_scatter_nd_update(tf.zeros([size], tf.int32), slot[:, None],
                                           tf.range(batch, dtype=tf.int32))
        valid = tf.range(size, dtype=tf.int32) < tf.reduce_sum(hits)
        return _Bucket(rows, valid, batch)

    def read(self, array: Any, selection: Any) -> tf.Tensor:
        if isinstance(selection, _Bucket):
            return tf.gather(array, selection.rows)
        if self.masked:
            return array
        if _is_variable(array):
            return tf.raw_ops.ResourceGather(resource=array, indices=selection.rows,
                                             dtype=_variable_dtype(array))
        return tf.gather(array, selection.rows)

    @staticmethod
    def _cast(value: Any, dtype: tf.DType) -> tf.Tensor:
        if tf.is_tensor(value):
            return value if value.dtype == dtype else tf.cast(value, dtype)
        return tf.constant(np.asarray(value, dtype=dtype.as_numpy_dtype))

    @staticmethod
    def _rows(mask: tf.Tensor, rank: int) -> tf.Tensor:
        """``mask`` [n] reshaped to broadcast against a rank-``rank`` array."""
        for _ in range(rank - 1):
            mask = mask[..., None]
        return mask

    @staticmethod
    def _fill_shape(value: tf.Tensor, count: tf.Tensor, row_shape: Sequence[int]) -> tf.Tensor:
        """``value`` as ``count`` rows of ``row_shape`` (no-op when it has them)."""
        if value.shape.rank == 1 + len(row_shape):
            return value
        if not row_shape:
            return tf.fill(count, value)
        row = tf.constant(tuple(row_shape), tf.int64)
        return tf.broadcast_to(value, tf.concat([count, row], 0))

    def write(self, array: Any, selection: Any, value: Any) -> Any:
        if _is_variable(array):
            shape = _storage_shape(array)
            value = self._cast(value, _variable_dtype(array))
            value = self._fill_shape(value, selection.count(), shape[1:])
            tf.raw_ops.ResourceScatterUpdate(resource=array, indices=selection.rows,
                                             updates=value)
            return array
        value = self._cast(value, array.dtype)
        if isinstance(selection, _Bucket):
            value = self._fill_shape(value, tf.shape(selection.rows, out_type=tf.int64),
                                     array.shape[1:])
            return tf.tensor_scatter_nd_update(array, selection.targets()[:, None], value)
        if self.masked:
            return tf.where(self._rows(selection, array.shape.rank), value, array)
        value = self._fill_shape(value, selection.count(), array.shape[1:])
        return tf.tensor_scatter_nd_update(array, selection.rows[:, None], value)

    def _frames(self, stack: tf.Tensor, frame: Any) -> tf.Tensor:
        frame = self._cast(frame, tf.int32)
        if self.masked and self.mode != "xla":
            # Threads outside the selection hold any depth (-1 after main
            # returned); TensorFlow's gathers reject such indices, XLA's clamp
            # them and its scatters drop them.
            frame = tf.clip_by_value(frame, 0, stack.shape[1] - 1)
        return frame

    def read_frame(self, stack: Any, selection: Any, frame: Any) -> tf.Tensor:
        frame = self._frames(stack, frame)
        if isinstance(selection, _Bucket):
            frame = tf.broadcast_to(frame, tf.shape(selection.rows))
            return tf.gather_nd(stack, tf.stack([selection.rows, frame], axis=1))
        if self.masked:
            return tf.gather(stack, frame, batch_dims=1)
        flat = selection.flat_indices(frame, self._frames_of(stack))
        if _is_variable(stack):
            return tf.raw_ops.ResourceGather(resource=stack, indices=flat,
                                             dtype=_variable_dtype(stack))
        return tf.gather(self._flatten(stack), flat)

    def write_frame(self, stack: Any, selection: Any, frame: Any, value: Any) -> Any:
        frame = self._frames(stack, frame)
        if _is_variable(stack):
            flat = selection.flat_indices(frame, self._frames_of(stack))
            value = self._cast(value, _variable_dtype(stack))
            value = self._fill_shape(value, selection.count(), _storage_shape(stack)[1:])
            tf.raw_ops.ResourceScatterUpdate(resource=stack, indices=flat, updates=value)
            return stack
        value = self._cast(value, stack.dtype)
        if isinstance(selection, _Bucket):
            frame = tf.broadcast_to(frame, tf.shape(selection.rows))
            value = self._fill_shape(value, tf.shape(selection.rows, out_type=tf.int64),
                                     stack.shape[2:])
            indices = tf.stack([selection.targets(), frame], axis=1)
            return tf.tensor_scatter_nd_update(stack, indices, value)
        if not self.masked:
            flat = selection.flat_indices(frame, self._frames_of(stack))
            value = self._fill_shape(value, selection.count(), stack.shape[2:])
            updated = tf.tensor_scatter_nd_update(self._flatten(stack), flat[:, None], value)
            return tf.reshape(updated, tf.shape(stack))
        threads = tf.range(tf.shape(stack)[0], dtype=tf.int32)
        if self.mode == "xla":
            # Unselected threads point past the last frame: XLA drops those updates.
            frame = tf.where(selection, frame, stack.shape[1])
        else:
            old = tf.gather(stack, frame, batch_dims=1)
            value = tf.where(self._rows(selection, old.shape.rank), value, old)
        value = tf.broadcast_to(value, tf.concat([tf.shape(threads), tf.shape(stack)[2:]], 0))
        indices = tf.stack([threads, tf.broadcast_to(frame, tf.shape(threads))], axis=1)
        return tf.tensor_scatter_nd_update(stack, indices, value)

    @staticmethod
    def _flatten(stack: tf.Tensor) -> tf.Tensor:
        """A ``[batch, frames, ...]`` stack tensor as ``[batch * frames, ...]``."""
        return tf.reshape(stack, tf.concat([[-1], tf.shape(stack)[2:]], 0))

    def where(self, condition: Any, x: Any, y: Any, name: Any = None) -> tf.Tensor:
        return tf.where(condition, x, y)

    def split(self, selection: Any, cond: Any) -> Tuple[Any, ...]:
        """Mask and bucket: ``(selection, cond)``.  Gather: ``(selection, positions of
        the true threads in it, positions of the false ones)``, positions as
        ``[n]`` indices."""
        cond = tf.convert_to_tensor(cond, tf.bool)
        if self.masked:
            return selection, cond
        if cond.shape.rank == 0:
            cond = tf.fill(selection.count(), cond)
        return (selection, tf.reshape(tf.where(cond), [-1]),
                tf.reshape(tf.where(tf.logical_not(cond)), [-1]))

    def part(self, split: Tuple[Any, ...], side: bool) -> Any:
        if isinstance(split[0], _Bucket):
            selection, cond = split
            return selection.narrowed(cond if side else tf.logical_not(cond))
        if self.masked:
            selection, cond = split
            return tf.logical_and(selection, cond if side else tf.logical_not(cond))
        return _Rows(tf.gather(split[0].rows, split[1] if side else split[2]))

    def narrow(self, value: Any, split: Tuple[Any, ...], side: bool) -> Any:
        if self.masked or _is_python_scalar(value) or len(getattr(value, "shape", ())) == 0:
            return value
        return tf.gather(value, split[1] if side else split[2])

    def merge(self, split: Tuple[Any, ...], if_true: Any, if_false: Any,
              tensor_type: TensorType) -> tf.Tensor:
        dtype = _tf_dtype(tensor_type.dtype)
        if_true, if_false = self._cast(if_true, dtype), self._cast(if_false, dtype)
        if self.masked:
            cond = split[1]
            if cond.shape.rank:
                cond = self._rows(cond, 1 + len(tensor_type.shape))
            return tf.where(cond, if_true, if_false)
        rank = 1 + len(tensor_type.shape)
        positions, parts = [], []
        for at, value in ((split[1], if_true), (split[2], if_false)):
            index = tf.cast(at, tf.int32)
            if value.shape.rank != rank:
                value = tf.broadcast_to(value, tf.concat([tf.shape(index), tensor_type.shape],
                                                         axis=0))
            positions.append(index)
            parts.append(value)
        return tf.dynamic_stitch(positions, parts)

    def callee_pc(self, selection: Any, entry: int, halt: int) -> tf.Tensor:
        if isinstance(selection, _Bucket):
            selection = selection.valid
        if self.masked:
            return tf.where(selection, tf.constant(entry, tf.int32), tf.constant(halt, tf.int32))
        return tf.fill(selection.count(), tf.constant(entry, tf.int32))

    # -- phases (XLA: static shapes that shrink with the running threads) ---------------
    def phase_sizes(self, batch: int, lowered: Any) -> List[int]:
        """Row counts the VM packs the running threads into as they halt
        (:meth:`VirtualMachine._run_phases`): XLA runs of programs of
        per-thread scalars over at least :data:`PHASE_MIN_BATCH` threads get
        one phase at an eighth of the batch; nothing otherwise (each phase is
        one more compiled copy of the loop)."""
        if self.mode != "xla" or batch < PHASE_MIN_BATCH:
            return []
        if not _scalar_program(lowered):
            return []
        return [-(-batch // PHASE_DIVISOR)]

    def more_running(self, more: Any, pc: Any, halt: int, limit: int) -> tf.Tensor:
        """``more`` and more than ``limit`` threads still running."""
        running = tf.reduce_sum(tf.cast(tf.less(self.to_numpy(pc), halt), tf.int32))
        return tf.logical_and(more, running > limit)

    def pack_running(self, pc: Any, halt: int, size: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(rows, valid)``: the running threads packed into ``size`` slots."""
        packed = self._pack(tf.less(self.to_numpy(pc), halt), size)
        return packed.rows, packed.valid

    @staticmethod
    def inert_rows(rows: tf.Tensor, valid: tf.Tensor, batch: int) -> tf.Tensor:
        """``rows``, with ``batch`` (out of range: writes dropped) where not valid."""
        return tf.where(valid, rows, batch)

    @staticmethod
    def take_rows(array: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
        return tf.gather(array, rows)

    @staticmethod
    def put_rows(array: tf.Tensor, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """``array`` with ``values`` written at ``rows`` (out-of-range rows dropped)."""
        return tf.tensor_scatter_nd_update(array, rows[:, None], tf.cast(values, array.dtype))

    @staticmethod
    def is_storage(value: Any) -> bool:
        """A per-thread array of the loop state (not a scalar like the step count)."""
        return tf.is_tensor(value) and value.shape.rank is not None and value.shape.rank >= 1

    # -- control -------------------------------------------------------------------------
    def reduce_min(self, t: tf.Tensor, name: Any = None) -> tf.Tensor:
        smallest = tf.reduce_min(self.to_numpy(t))
        return int(smallest) if tf.executing_eagerly() else smallest

    def check(self, ok: Any, selection: Any, make_error: Callable[[], Exception]) -> None:
        """Eagerly: raise now.  In a graph: record the check; the block wrapper
        (:meth:`wrap_block`) turns it into the loop state's error code.  No
        check at all with ``safety_checks=False``."""
        if not self.safety_checks:
            return
        ok = tf.convert_to_tensor(ok)
        if isinstance(selection, _Bucket):
            selection = selection.valid
        if self.masked:
            ok = tf.logical_or(ok, tf.logical_not(selection))
        if tf.executing_eagerly():
            if not bool(tf.reduce_all(ok)):
                raise make_error()
            return
        code = _error_code(make_error)
        self._pending_checks.append(tf.where(tf.reduce_all(ok), 0, code))

    def wrap_block(self, function: Callable[[dict], dict], name: str) -> Callable[[dict], dict]:
        """Turn checks recorded while tracing a block into its state's error
        code; in eager mode, compile the block (:class:`_CompiledBlock`)."""
        pending = self._pending_checks

        def block(state: dict) -> dict:
            mark = len(pending)
            state = function(dict(state))
            if len(pending) > mark:
                codes = pending[mark:]
                del pending[mark:]
                error = state.get(ERROR_KEY, tf.constant(0))
                for code in codes:
                    error = tf.maximum(error, code)
                state[ERROR_KEY] = error
            return state

        block.__name__ = getattr(function, "__name__", "block")
        if self.mode == "eager" and self.compile_blocks:
            return _CompiledBlock(block)
        if self.selection == "bucket" or (self.selection == "auto"
                                           and getattr(function, "vector_work", True)):
            return self._bucketed(block)
        return block

    def _bucketed(self, block: Callable[[dict], dict]) -> Callable[[dict], dict]:
        """``block`` traced once per bucket size (:func:`bucket_sizes`); a
        step runs the smallest bucket that holds the threads at the block
        (``state["next"]``, the block the VM picked)."""
        backend = self

        def run(state: dict) -> dict:
            pc = backend.to_numpy(state["pc"])
            sizes = bucket_sizes(pc.shape[0])

            def branch(size: int) -> Callable[[], dict]:
                def traced() -> dict:
                    backend._bucket = size
                    try:
                        return block(dict(state))
                    finally:
                        backend._bucket = None
                return traced

            if len(sizes) == 1:
                return branch(sizes[0])()
            count = tf.reduce_sum(tf.cast(tf.equal(pc, state["next"]), tf.int32))
            index = tf.reduce_sum(tf.cast(count > tf.constant(sizes[:-1], tf.int32), tf.int32))
            return tf.switch_case(index, [branch(size) for size in sizes])

        run.__name__ = block.__name__
        return run

    def while_loop(self, cond: Callable[[Any], Any], body: Callable[[Any], Any],
                   state: Any) -> Any:
        state = dict(state)
        # A later phase's loop starts from the error of the one before in the
        # same graph (and so does not run after a failed check).
        previous = self._final_error
        same_graph = (previous is not None and not tf.executing_eagerly()
                      and getattr(previous, "graph", None) is tf.compat.v1.get_default_graph())
        state.setdefault(ERROR_KEY, previous if same_graph else tf.constant(0))
        if tf.executing_eagerly():
            no_error = state[ERROR_KEY]
            while bool(cond(state)):  # steps stay a Python int
                state = body(state)
                error = state[ERROR_KEY]
                if error is not no_error and int(error):  # set by a block's check
                    break
            raise_for_error_code(state.pop(ERROR_KEY))
            return state
        if not tf.is_tensor(state["steps"]):
            state["steps"] = tf.constant(state["steps"], tf.int32)

        def go_on(s: dict) -> Any:
            return tf.logical_and(cond(s), tf.equal(s[ERROR_KEY], 0))

        def unrolled(s: dict) -> dict:
            s = body(s)
            for _ in range(self._steps_per_pass - 1):
                # A pass after the last step runs a block no thread is at: a
                # no-op (empty or all-false selection), not counted as a step.
                more = go_on(s)
                steps = s["steps"]
                s = body(s)
                s["steps"] = steps + tf.cast(more, tf.int32)
            return s

        # Variables are updated in place: the loop captures them instead of
        # carrying them (fewer loop variables, fewer graph nodes per pass).
        handles = {k: v for k, v in state.items() if _is_variable(v)}

        def carried(s: dict) -> dict:
            return {k: v for k, v in s.items() if k not in handles}

        values, = tf.while_loop(lambda v: go_on({**handles, **v}),
                                lambda v: (carried(unrolled({**handles, **v})),),
                                (carried(state),), parallel_iterations=1)
        state = {**handles, **values}
        self._final_error = state.pop(ERROR_KEY)
        return state

    def switch_case(self, index: Any, branches: Sequence[Callable[[Any], Any]],
                    state: Any) -> Any:
        if tf.executing_eagerly():
            return branches[int(index)](dict(state))
        handles = {k: v for k, v in state.items() if _is_variable(v)}

        def branch(block: Callable[[dict], dict]) -> Callable[[], dict]:
            return lambda: {k: v for k, v in block(dict(state)).items() if k not in handles}

        out = tf.switch_case(index, [branch(b) for b in branches])
        if self.mode == "graph":
            _run_as_function(out, ("Case", "StatelessCase"))
        return {**handles, **out}

    # -- whole runs ------------------------------------------------------------------------
    def run_vm(self, vm: Any, args: Sequence[Any], cache: Optional[dict] = None) -> Any:
        """Run ``vm`` (a :class:`~autobatch.virtual_machine.VirtualMachine`
        built with this backend) over ``args``, as this backend's mode says.

        In graph and XLA mode the run is one ``tf.function``, kept in
        ``cache`` (a dict, e.g. the block_code_cache) under the VM's program,
        max_stack_depth and this backend, so a later call with arguments of
        the same shapes and dtypes neither traces nor compiles again.
        Sets ``vm.steps``.
        """
        if not tf.executing_eagerly():
            return self._run_in_users_graph(vm, args, cache)
        if self.mode == "eager":
            result = vm.run(args)
            vm.steps = int(vm.steps)
            return result
        inputs = [self._as_tensor(a) for a in args]
        result, steps, error = self._compiled_run(vm, cache)(*inputs)
        raise_for_error_code(error)
        vm.steps = int(steps)
        return result

    def _run_in_users_graph(self, vm: Any, args: Sequence[Any],
                            cache: Optional[dict]) -> Any:
        """Build the run into the graph the caller is building: a TF1
        ``tf.compat.v1.Graph``, the user's own ``tf.function``, or one with
        ``jit_compile=True``.

        - Graph and XLA modes call their compiled run (the ``tf.function`` of
          :meth:`_graph_run`, cached as when called eagerly) from the user's
          graph: a function call op, whose body orders its own variable
          reads and writes (a TF1 graph has no automatic control
          dependencies) and is compiled by XLA in XLA mode.
        - Under the user's XLA (``jit_compile``) resource variables cannot
          be created and shapes must be static: the run is built inline with
          masks and buckets (a gathering backend hands it to a twin of mode
          ``"xla"``).  Eager mode builds the run inline in a user's
          ``tf.function`` too; in a TF1 graph it calls a compiled run as the
          other modes do (built inline there, TF1's control flow never
          finished the loop of ``examples.even_odd``).
        - A failed check (stack overflow) cannot raise while the graph is
          built: the results then depend on a ``tf.debugging.Assert`` whose
          message is the engine's error (raised as
          ``tf.errors.InvalidArgumentError`` when the graph runs).  XLA drops
          assertions: under the user's ``jit_compile`` a stack overflow stops
          the run silently (the overflowing threads' results are wrong);
          call ``TensorFlowBackend("xla")`` outside the user's ``jit_compile``
          to have it raised.
        """
        graph = tf.compat.v1.get_default_graph()
        in_xla = _in_xla_context(graph)
        if in_xla and not self.masked:
            twin = TensorFlowBackend("xla")
            twin_vm = type(vm)(vm.lowered, twin, vm.max_stack_depth, cache)
            result = twin._run_in_users_graph(twin_vm, args, cache)
            vm.steps = twin_vm.steps
            return result
        from tensorflow.python.framework.func_graph import FuncGraph
        if in_xla or (self.mode == "eager" and isinstance(graph, FuncGraph)):
            saved = self._variables_ok
            self._variables_ok = False
            self._final_error = tf.constant(0)
            self._stack_frames.clear()
            try:
                result = vm.run(list(args))
            finally:
                self._variables_ok = saved
            error, self._final_error = self._final_error, None
            if in_xla:
                return result
        else:
            inputs = [self._as_tensor(a) for a in args]
            run = self._compiled_run(vm, cache)
            if _legacy_graph(graph):
                # TF1 graph semantics (``==`` on tensors is identity) would
                # reach the primops: trace the run as TF2 code, call it here.
                specs = tf.nest.map_structure(tf.TensorSpec.from_tensor, inputs)
                with context.eager_mode():
                    run = run.get_concrete_function(*specs)
            result, vm.steps, error = run(*inputs)
        messages = tf.constant([""] + [f"{type(e).__name__}: {e}"
                                       for e in (make() for make in _ERROR_MAKERS)])
        ok = tf.debugging.Assert(tf.equal(error, 0), [tf.gather(messages, error)])
        with tf.control_dependencies([ok]):
            return tf.nest.map_structure(tf.identity, result)

    def _compiled_run(self, vm: Any, cache: Optional[dict]) -> Callable[..., Any]:
        """The ``tf.function`` running ``vm`` (:meth:`_graph_run`), from
        ``cache`` when it holds one for the same program, depth and backend."""
        key = ("tf-run", vm.lowered, vm.max_stack_depth, self)
        run = cache.get(key) if cache is not None else None
        if run is None:
            run = self._graph_run(vm)
            if cache is not None:
                cache[key] = run
        return run

    def _graph_run(self, vm: Any) -> Callable[..., Any]:
        backend = self

        # Two VM steps per loop pass make XLA's loop ~40% faster on programs
        # of scalars; on programs of vectors (NUTS-shaped: [batch, 256]
        # registers and stacks) they gain less and multiply XLA's compile time.
        steps_per_pass = self.unroll if _scalar_program(vm.lowered) else 1

        def whole_run(*inputs: Any) -> Any:
            _TRACE_COUNTS[backend._config()] = backend.trace_count + 1
            log.debug("tracing a whole VM run (%s), trace %d", backend, backend.trace_count)
            backend._final_error = tf.constant(0)
            backend._stack_frames.clear()
            backend._steps_per_pass = steps_per_pass
            try:
                result = vm.run(list(inputs))
            finally:
                backend._steps_per_pass = 1
            error, backend._final_error = backend._final_error, None
            return result, vm.steps, error

        return tf.function(whole_run, jit_compile=self.mode == "xla", autograph=False)

    @staticmethod
    def _as_tensor(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return rebuild(value, (TensorFlowBackend._as_tensor(v) for v in value))
        if tf.is_tensor(value):
            return value
        return tf.constant(np.asarray(value))
