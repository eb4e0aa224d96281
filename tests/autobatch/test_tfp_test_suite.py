"""What TFP's own ``auto_batching`` tests (frontend, stackless, tf_backend,
...) do that autobatch failed at, each written here as a TFP user would:
a TF1 graph fed a placeholder whose batch dimension is unknown; int32
meeting int64 on the NumPy backend, which promotes as TFP's ``merge_dtypes``;
..."""

import numpy as np
import pytest

import autobatch
from autobatch import instructions
from autobatch.backends.numpy import NumpyBackend
from autobatch.errors import TypeInferenceError
import tfp_programs as tp

# The tests that run TensorFlow ask for it through conftest's ``tf`` fixture:
# a skip where it is missing, a failure under MEMOPT_REQUIRE_ALL=1; the
# others run without it.


def _fibonacci(n):
    if n <= 1:
        return 1
    else:
        return _fibonacci(n - 2) + _fibonacci(n - 1)


def test_tf1_graph_input_with_unknown_batch_dimension(tf):
    """``placeholder_with_default(x, shape=[None])`` in a TF1 graph: the
    batch size is only known when the graph runs (was: TypeError "type_of
    needs a static shape")."""
    from autobatch.backends.tf import TensorFlowBackend

    batched = autobatch.Context().batch_uncurried(
        _fibonacci, lambda *args: instructions.TensorType(np.int64, ()))
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder_with_default(np.array([6, 7, 8], np.int64), shape=[None])
        answer = batched(x, max_stack_depth=15, backend=TensorFlowBackend())
        assert answer.shape.as_list() == [None]
        with tf.compat.v1.Session(graph=graph) as sess:
            assert sess.run(answer).tolist() == [13, 21, 34]
            assert sess.run(answer, {x: np.array([1, 9], np.int64)}).tolist() == [1, 55]


def test_numpy_backend_promotes_int32_meeting_int64_as_tfp():
    """``x + np.array(1)`` is int64 for int32 ``x`` in NumPy; the declared
    type (int32) and the body's (int64) merge by the backend's merge_dtypes
    (was TypeInferenceError "int32 in one place and int64 in another")."""
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda args: args[0])
    def plus_one(x):
        return x + np.array(1)

    got = plus_one(np.array([1, 5, 60], np.int32), max_stack_depth=3, backend=NumpyBackend())
    assert got.tolist() == [2, 6, 61] and got.dtype == np.int64


def test_tensorflow_backend_still_refuses_two_dtypes(tf):
    """TensorFlow's merge_dtypes refuses two dtypes, as TFP's."""
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda args: args[0])
    def to_float(x):
        return tf.cast(x, tf.float32)

    from autobatch.backends.tf import TensorFlowBackend

    with pytest.raises(TypeInferenceError, match="int32 in one place and float32"):
        to_float(np.array([1, 5], np.int32), max_stack_depth=3, backend=TensorFlowBackend())


def test_stackless_execute_takes_a_list_batch_in_tfps_order():
    """TFP's ``stackless.execute(program, backend, None, [5, 6, 8, 9])``: a
    list for a parameter typed as one tensor is that batch (was
    ProgramError "an argument has 4 part(s)"), as ``vm.execute`` takes it."""
    from autobatch import allocation_strategy, stackless

    program = allocation_strategy.optimize(tp.fibonacci_calls())
    got = stackless.execute(program, NumpyBackend(), None, [5, 6, 8, 9])
    assert list(got) == [8, 13, 34, 55]


def test_lowered_program_has_tfps_graph_view():
    """``ctx.lowered_for_args(...).graph``: TFP's tests walk a lowered
    program's ``graph.block(i).terminator`` (was AttributeError: no
    ``graph``).  A self tail call pushes no return address; fibonacci's
    calls do."""
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda args: args[0])
    def iota_sum(n, acc):
        if n <= 0:
            return acc
        else:
            return iota_sum(n - 1, acc + n)

    ctx.batch_uncurried(_fibonacci, lambda args: args[0])

    def pushes(name, inputs):
        graph = ctx.lowered_for_args(name, inputs, backend=NumpyBackend()).graph
        terminators = [graph.block(i).terminator for i in range(graph.exit_index())]
        return sum(isinstance(t, instructions.PushGotoOp) for t in terminators)

    assert pushes("iota_sum", [np.array([3, 0], np.int32), np.array([0, 0], np.int32)]) == 0
    assert pushes("_fibonacci", [np.array([3, 5], np.int64)]) > 0


def test_tf1_graph_primop_closing_over_a_graph_tensor(tf):
    """A primop that closes over a tensor of the user's TF1 graph: type
    inference runs it in that graph, as TFP's ``run_on_dummies`` (was
    TypeError "... is out of scope", TFP's testClosingOverTensorDoesntRaise,
    and the same through the frontend)."""
    from autobatch.backends.tf import TensorFlowBackend

    graph = tf.Graph()
    with graph.as_default():
        scale = tf.constant(3, tf.int64)
        backend = TensorFlowBackend()
        out = backend.run_on_dummies(lambda y: y * tf.cast(scale, tf.float32),
                                     [instructions.Type(instructions.TensorType(np.float32, ()))])
        assert out.graph is graph
        ctx = autobatch.Context()

        @ctx.batch(type_inference=lambda args: args[0])
        def times_scale(x):
            return x * scale

        answer = times_scale(np.array([1, 2], np.int64), backend=backend)
        with tf.compat.v1.Session(graph=graph) as sess:
            assert sess.run(answer).tolist() == [3, 6]


def test_push_op_prints_as_tfps_copy():
    """``str(program)`` of a program with TFP's ``push_op`` prints the copy
    as TFP writes it (TFP's instructions_test / stack_optimization_test
    compare the whole text; was autobatch's own ``assign`` source)."""
    block = instructions.Block([instructions.push_op(["a"], ["b"])], instructions.halt_op())
    program = instructions.Program(
        instructions.ControlFlowGraph([block]), [],
        {"a": instructions.single_type(np.int64, ()), "b": instructions.single_type(np.int64, ())},
        ["a"], "b")
    assert "    b = prim(a) by\n      def assign(*x):\n        return x\n" in str(program)
    assert instructions.interpret(program, 7) == 7


def test_first_call_inside_an_autograph_tf_function(tf):
    """A batched function first called inside ``tf.function`` (AutoGraph on,
    the default; also under ``jit_compile``): autobatch's own code is not
    converted, as TensorFlow leaves TFP's (was TypeError "tf__fibonacci()
    missing 1 required positional argument" while compiling)."""
    from autobatch.backends.tf import TensorFlowBackend

    for jit in (False, True):
        batched = autobatch.Context().batch_uncurried(
            _fibonacci, lambda *args: instructions.TensorType(np.int64, ()))
        run = tf.function(lambda x: batched(x, max_stack_depth=15,
                                            backend=TensorFlowBackend(safety_checks=False)),
                          jit_compile=jit)
        assert run(tf.constant([3, 7, 4], tf.int64)).numpy().tolist() == [3, 21, 5]
