"""What TFP's own ``auto_batching`` tests (frontend, stackless, tf_backend,
...) do that autobatch failed at, each written here as a TFP user would:
a TF1 graph fed a placeholder whose batch dimension is unknown, ..."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import autobatch  # noqa: E402
from autobatch import instructions  # noqa: E402
from autobatch.backends.tf import TensorFlowBackend  # noqa: E402


def _fibonacci(n):
    if n <= 1:
        return 1
    else:
        return _fibonacci(n - 2) + _fibonacci(n - 1)


def test_tf1_graph_input_with_unknown_batch_dimension():
    """``placeholder_with_default(x, shape=[None])`` in a TF1 graph: the
    batch size is only known when the graph runs (was: TypeError "type_of
    needs a static shape")."""
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
