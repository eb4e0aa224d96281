"""Every example program (:mod:`autobatch.examples`) in every TensorFlow
regime a user may call it from, checked against plain Python one example at
a time:

- eager TF2 with each backend mode (``"eager"``, ``"graph"``, ``"xla"``);
- inside the user's own ``tf.function``;
- inside a ``tf.compat.v1.Graph`` run by a ``Session`` (placeholders fed);
- inside the user's own ``tf.function(jit_compile=True)``.

The default backend (``TensorFlowBackend()``) once returned tensors that
evaluated to empty arrays in a TF1 graph, and failed under the user's XLA
("VarHandleOp" is not supported): both are covered here.
"""
import numpy as np
import pytest

from autobatch import examples
from autobatch.virtual_machine import execute

RNG = np.random.default_rng(12)
NUTS_MATRIX, NUTS_WEIGHTS = examples.nuts_problem(size=6, seed=3)


def _case(name):
    """``(program, args, expected)`` for one example: args are NumPy arrays
    (a tuple for a tuple-typed parameter), expected the plain-Python results
    stacked on the batch axis."""
    if name == "fib":
        n = RNG.integers(0, 10, 12)
        return examples.fibonacci(), [n], np.array([examples.fib_python(int(v)) for v in n])
    if name in ("even_odd_tail", "even_odd_work"):
        n = RNG.integers(0, 12, 10)
        program = examples.even_odd(tail_calls=name == "even_odd_tail")
        return program, [n], np.array([examples.is_even_python(int(v)) for v in n])
    if name == "collatz":
        n = RNG.integers(1, 40, 12)
        return examples.collatz(), [n], np.array([examples.collatz_python(int(v)) for v in n])
    if name == "gcd":
        a, b = RNG.integers(1, 60, 10), RNG.integers(0, 60, 10)
        want = [examples.gcd_python((int(x), int(y))) for x, y in zip(a, b, strict=True)]
        return (examples.gcd_pairs(), [(a, b)],
                (np.array([w[0] for w in want]), np.array([w[1] for w in want])))
    if name == "nuts":
        x = RNG.integers(-3, 4, (5, 6)).astype(np.float64)
        want = [examples.nuts_python(row, NUTS_MATRIX, NUTS_WEIGHTS, max_depth=4)
                for row in x]
        program = examples.nuts_shaped(NUTS_MATRIX, NUTS_WEIGHTS, max_depth=4)
        return program, [x], (np.stack([w[0] for w in want]), np.array([w[1] for w in want]))
    raise AssertionError(name)


PROGRAMS = ["fib", "even_odd_tail", "even_odd_work", "collatz", "gcd", "nuts"]
MAX_DEPTH = 12  # fib(9) and is_even(11) need at most 11 pending calls


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), got
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
        return
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(got, want), (got, want)


def _numpy(value):
    if isinstance(value, tuple):
        return tuple(_numpy(v) for v in value)
    return value.numpy()


def _tensors(tf, args):
    return [tuple(tf.constant(v) for v in a) if isinstance(a, tuple) else tf.constant(a)
            for a in args]


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_called_eagerly(tf, program, mode):
    from autobatch.backends.tf import TensorFlowBackend
    prog, args, want = _case(program)
    got = execute(prog, args, TensorFlowBackend(mode), MAX_DEPTH)
    assert tf.is_tensor(got if not isinstance(got, tuple) else got[0])
    assert_same(_numpy(got), want)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_inside_the_users_tf_function(tf, program, mode):
    from autobatch.backends.tf import TensorFlowBackend
    prog, args, want = _case(program)

    @tf.function(autograph=False)
    def users(*inputs):
        return execute(prog, list(inputs), TensorFlowBackend(mode), MAX_DEPTH)

    assert_same(_numpy(users(*_tensors(tf, args))), want)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_inside_a_tf1_graph_and_session(tf, program, mode):
    from autobatch.backends.tf import TensorFlowBackend
    prog, args, want = _case(program)
    graph = tf.Graph()
    with graph.as_default():
        feeds, inputs = {}, []
        for arg in args:
            parts = arg if isinstance(arg, tuple) else (arg,)
            holders = []
            for part in parts:
                holder = tf.compat.v1.placeholder(tf.as_dtype(part.dtype), part.shape)
                feeds[holder] = part
                holders.append(holder)
            inputs.append(tuple(holders) if isinstance(arg, tuple) else holders[0])
        out = execute(prog, inputs, TensorFlowBackend(mode), MAX_DEPTH)
        with tf.compat.v1.Session(graph=graph) as session:
            got = session.run(out, feed_dict=feeds)
    assert_same(tuple(got) if isinstance(want, tuple) else got, want)


@pytest.mark.parametrize("program", PROGRAMS)
def test_inside_the_users_jit_compile(tf, program):
    """The default backend (graph mode, gathering) hands the run to masks
    and buckets under XLA (the XLA mode itself is covered above)."""
    from autobatch.backends.tf import TensorFlowBackend
    prog, args, want = _case(program)

    @tf.function(jit_compile=True, autograph=False)
    def users(*inputs):
        return execute(prog, list(inputs), TensorFlowBackend(), MAX_DEPTH)

    assert_same(_numpy(users(*_tensors(tf, args))), want)


def test_the_frontend_in_a_tf1_session(tf):
    """``@ctx.batch`` functions called on TF1 placeholders: the TensorFlow
    backend is picked, and ``==``/``!=`` in the body stay elementwise."""
    import test_autobatch_frontend_programs as P
    n = np.arange(1, 9)
    graph = tf.Graph()
    with graph.as_default():
        holder = tf.compat.v1.placeholder(tf.int64, (8,))
        outs = [P.collatz(holder), P.fib(holder, max_stack_depth=12)]
        with tf.compat.v1.Session(graph=graph) as session:
            collatz, fib = session.run(outs, feed_dict={holder: n})
    assert_same(collatz, np.asarray(P.plain(P.collatz, n)))
    assert_same(fib, np.asarray(P.plain(P.fib, n)))
