"""TFP's backend API (``numpy_backend``/``tf_backend`` of
``tfp.experimental.auto_batching``) on autobatch's backends: ``fill(value,
size, dtype, shape)``, ``type_of(t, dtype_hint)``, ``batch_size``, ``cond``,
``while_loop(cond, body, loop_vars)``, ``switch_case(selector, callables)``,
``equal``/``not_equal``/``any``, ``broadcast_to_shape_of``,
``assert_matching_dtype``, ``static_value``, ``variable_class``; beside
autobatch's own argument lists of the same methods (the VM's).  And the
variable objects' stack check inside graphs (TFP: an assertion)."""
import numpy as np
import pytest

from autobatch import instructions as inst
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend


def check_tfp_api(b, value):
    """TFP's backend methods on backend ``b``; ``value`` turns results into
    NumPy arrays."""
    filled = value(b.fill(7, 2, np.int32, [3]))
    assert filled.shape == (2, 3) and filled.dtype == np.int32 and (filled == 7).all()
    ours = value(b.fill(inst.TensorType(np.float32, (2,)), 3, 1.5))     # autobatch's form
    assert ours.shape == (3, 2) and ours.dtype == np.float32 and (ours == 1.5).all()
    assert b.type_of(np.zeros((4, 2), np.float32)) == inst.TensorType(np.float32, (4, 2))
    assert b.type_of(3, np.int16) == inst.TensorType(np.int16, ())
    assert b.type_of(np.zeros((4, 2)), 4) == inst.TensorType(np.float64, (2,))   # ours
    assert b.batch_size(np.zeros((5, 2))) == 5 and b.batch_size(3.0) == 1
    assert value(b.cond(True, lambda: np.int32(1), lambda: np.int32(2))) == 1
    assert value(b.cond(False, lambda: np.int32(1), lambda: np.int32(2))) == 2
    i, acc = b.while_loop(lambda i, a: i < 4, lambda i, a: (i + 1, a * 2),
                          [np.int32(0), np.int32(1)])
    assert (int(value(i)), int(value(acc))) == (4, 16)
    assert int(value(b.switch_case(np.int32(1), [lambda: np.int32(10),
                                                 lambda: np.int32(20)]))) == 20
    assert value(b.equal(np.array([1, 2]), 2)).tolist() == [False, True]
    assert value(b.not_equal(np.array([1, 2]), 2)).tolist() == [True, False]
    assert bool(value(b.any(np.array([False, True]))))
    broadcast = value(b.broadcast_to_shape_of(3, np.zeros((2, 2), np.int64)))
    assert broadcast.tolist() == [[3, 3], [3, 3]]
    b.assert_matching_dtype(np.int32, np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="Mismatched dtype: expected int32 found float32"):
        b.assert_matching_dtype(np.int32, np.zeros(2, np.float32))
    assert value(b.static_value(np.array([4]))).tolist() == [4]
    assert len(b.variable_class) == 4
    assert b.wrap_straightline_callable(len) is len and b.prepare_for_cond({"a": 1}) == {"a": 1}


@pytest.mark.parametrize("backend", [NumpyBackend(), MaskedNumpyBackend()],
                         ids=["numpy", "masked"])
def test_tfp_backend_api_numpy(backend):
    check_tfp_api(backend, np.asarray)


def test_tfp_backend_api_tensorflow_eager_and_in_a_function(tf):
    from autobatch.backends.tf import TensorFlowBackend
    b = TensorFlowBackend()
    check_tfp_api(b, lambda t: t.numpy() if tf.is_tensor(t) else np.asarray(t))
    assert b.type_of(tf.zeros([4, 2])) == inst.TensorType(np.float32, (4, 2))

    @tf.function(autograph=False)
    def staged(n):
        count = b.while_loop(lambda i: i < n, lambda i: (i + 1,), [tf.constant(0)])[0]
        picked = b.switch_case(tf.constant(1), [lambda: tf.constant(10),
                                                lambda: tf.constant(20)])
        chosen = b.cond(count > 2, lambda: tf.constant(1), lambda: tf.constant(0))
        return count, picked, chosen, b.batch_size(tf.zeros([n, 2]))

    count, picked, chosen, size = staged(tf.constant(5))
    assert (int(count), int(picked), int(chosen), int(size)) == (5, 20, 1, 5)


def test_variable_overflow_inside_graphs_raises_as_tfp(tf):
    """A push past the depth: raised now eagerly; inside a tf.function or a
    TF1 graph, an assertion the variable depends on, failing when run
    (InvalidArgumentError naming VariableStackOverflow), as TFP's stacks;
    nothing with safety_checks=False (TFP's UnsafeStack)."""
    from autobatch.backends.tf import TensorFlowBackend
    from autobatch.backends.variables import VariableStackOverflow

    def pushes(b, depth):
        v = b.create_variable("x", inst.VariableAllocation.FULL,
                              inst.TensorType(np.int32, ()), depth, 3)
        mask = b.full_mask(3)
        v = v.push(mask).update(1, mask)
        return v.push(mask).update(2, mask).read()

    checked, unchecked = TensorFlowBackend(), TensorFlowBackend(safety_checks=False)
    assert pushes(checked, 3).numpy().tolist() == [2, 2, 2]
    with pytest.raises(VariableStackOverflow, match="variable 'x' exceeds max_stack_depth=2"):
        pushes(checked, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="VariableStackOverflow"):
        tf.function(lambda: pushes(checked, 2), autograph=False)()
    with tf.compat.v1.Graph().as_default():
        out = pushes(checked, 2)
        with tf.compat.v1.Session() as session:
            with pytest.raises(tf.errors.InvalidArgumentError, match="VariableStackOverflow"):
                session.run(out)
    assert tf.function(lambda: pushes(unchecked, 2), autograph=False)().numpy().shape == (3,)
