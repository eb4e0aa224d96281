"""Whole runs: eagerly, one ``tf.function`` (graph, XLA), or inside the
graph a user is building (TF1, ``tf.function``, ``jit_compile``)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from autobatch.backends.tf.support import (
    _ERROR_MAKERS,
    _TRACE_COUNTS,
    _in_xla_context,
    _legacy_graph,
    _scalar_program,
    raise_for_error_code,
)
from autobatch.ir import rebuild

log = logging.getLogger("autobatch.backends.tf")


class Runs:
    """Whole runs: eagerly, one ``tf.function`` (graph, XLA), or inside the
    graph a user is building (TF1, ``tf.function``, ``jit_compile``)."""

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
            twin = type(self)("xla")
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
            return rebuild(value, (Runs._as_tensor(v) for v in value))
        if tf.is_tensor(value):
            return value
        return tf.constant(np.asarray(value))
