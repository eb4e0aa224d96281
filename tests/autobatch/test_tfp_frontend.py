"""TFP's documented frontend semantics, written as a TFP user writes them:
``dry_run`` calls the plain function directly, ``truthy`` makes ``if``
conditions of shape ``[1]`` work there, TensorFlow tensors in give the
TensorFlow backend and tensors out; ``type_inference`` callables get
TensorType patterns (``.dtype``, ``.shape``); a declared dtype wins over the
body's constants (Python, NumPy scalar, 0-d array, bool)."""

import numpy as np
import pytest

import autobatch
from autobatch.errors import ProgramError
from autobatch.frontend import truthy
from autobatch.instructions import TensorType


# -- dry_run and truthy --------------------------------------------------------------------

def _abs_context():
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0]])
    def my_abs(x):
        if truthy(x > 0):
            return x
        else:
            return -x

    return my_abs


def test_dry_run_calls_the_plain_function_directly():
    calls = []
    ctx = autobatch.Context()

    def record(n):
        calls.append(np.asarray(n).tolist())
        return n

    @ctx.batch()
    def countdown(n):
        if truthy(record(n) > 0):
            return countdown(n - 1)
        return n

    out = countdown(np.array([3]), dry_run=True)
    assert np.array_equal(out, [0])
    assert calls == [[3], [2], [1], [0]]  # the plain function, on the batch of one
    assert ctx.stats.compilations == 0
    with pytest.raises(ProgramError, match="batch dimension of size 1"):
        countdown(np.array([3, 4]), dry_run=True)


def test_truthy_in_a_dry_run_and_batched_numpy():
    my_abs = _abs_context()
    assert np.array_equal(my_abs(np.array([-5]), dry_run=True), [5])
    assert np.array_equal(my_abs(np.array([-5, 2, 0, -1])), [5, 2, 0, 1])


def test_truthy_in_a_dry_run_and_batched_tensorflow(tf):
    my_abs = _abs_context()
    out = my_abs(tf.constant([-5]), dry_run=True)  # TFP's docstring example
    assert tf.is_tensor(out) and out.numpy().tolist() == [5]
    out = my_abs(tf.constant([-5.0, 2.0, -0.5]))
    assert tf.is_tensor(out) and out.numpy().tolist() == [5.0, 2.0, 0.5]


def test_truthy_leaves_other_shapes_alone():
    assert truthy(np.array([True])).shape == ()
    assert truthy(np.array([True, False])).shape == (2,)
    assert truthy(True) is True


# -- TensorFlow tensors in: the TensorFlow backend, tensors out -----------------------------

def _fib_context():
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0]])
    def fib(n):
        if n > 1:
            return fib(n - 1) + fib(n - 2)
        return 1

    return fib


def test_tensors_in_give_tensors_out(tf):
    fib = _fib_context()
    n = np.arange(9, dtype=np.int32)
    want = [1, 1, 2, 3, 5, 8, 13, 21, 34]
    out = fib(tf.constant(n))
    assert tf.is_tensor(out) and not isinstance(out, np.ndarray)
    assert out.dtype == tf.int32  # the declared type: [arg_types[0]]
    assert out.numpy().tolist() == want
    assert isinstance(fib(n), np.ndarray)  # NumPy in, NumPy out

    @tf.function
    def twice(x):
        return 2 * fib(x)

    assert twice(tf.constant(n)).numpy().tolist() == [2 * w for w in want]
# -- type_inference callables and declared types ----------------------------------------------

def test_type_inference_gets_tensor_type_patterns():
    seen = []
    ctx = autobatch.Context()

    def declared(arg_types):
        n_type, pair_type = arg_types
        seen.append((n_type.dtype, n_type.shape, pair_type[1].dtype, pair_type[1].shape))
        return [TensorType(n_type.dtype, n_type.shape)]

    @ctx.batch(type_inference=declared)
    def down(n, pair):
        if n > 0:
            return down(n - 1, pair)
        return n + pair[1][..., 0]

    n = np.array([2, 0, 5], dtype=np.int32)
    pair = (np.zeros(3, np.float32), np.ones((3, 4), np.int32))
    assert np.array_equal(down(n, pair), [1, 1, 1])
    assert seen and seen[0] == (np.dtype(np.int32), (), np.dtype(np.int32), (4,))


def count_int(n):
    if n > 0:
        return count_int(n - 1) + 1
    return 1


def count_array(n):
    if n > 0:
        return count_array(n - 1) + 1
    return np.array(1)


def count_numpy_scalar(n):
    if n > 0:
        return count_numpy_scalar(n - 1) + 1
    return np.int64(1)


def count_bool(n):
    if n > 0:
        return count_bool(n - 1) + 1
    return True


@pytest.mark.parametrize("count", [count_int, count_array, count_numpy_scalar, count_bool])
def test_declared_int32_wins_over_the_bodys_constants(count):
    ctx = autobatch.Context()
    batched = ctx.batch_uncurried(count, type_inference=lambda t: [TensorType(np.int32, ())])
    out = batched(np.array([0, 3, 1], dtype=np.int64))
    assert out.dtype == np.int32
    assert np.array_equal(out, [1, 4, 2])
