"""The VM's loop and branches in TensorFlow: checks, blocks (compiled
eagerly, bucketed under XLA), ``while_loop`` and ``switch_case``."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

from autobatch.backends.tf.selections import Bucket, bucket_sizes
from autobatch.backends.tf.support import (
    ERROR_KEY,
    _error_code,
    _is_variable,
    _run_as_function,
    raise_for_error_code,
)
from autobatch.backends.tfp_api import accept_tfp_arguments


class Control:
    """The VM's loop and branches in TensorFlow: checks, blocks (compiled
    eagerly, bucketed under XLA), ``while_loop`` and ``switch_case``."""

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
        if isinstance(selection, Bucket):
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


# Control's own definitions of TFP's shared names (fill, type_of, while_loop,
# switch_case) also take TFP's argument lists (autobatch.backends.tfp_api).
accept_tfp_arguments(Control)


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
