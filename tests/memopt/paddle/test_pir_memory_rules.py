"""PIR's per-op memory rules are a table, one rule per op, registered
beside each rule (:data:`memopt.paddle.pir.program.MEMORY_RULES`)."""
import pytest

from memopt.paddle.pir import program as pir


def test_the_table_names_each_op_with_a_kernel_memory_rule():
    assert {op: rule.__name__ for op, rule in sorted(pir.MEMORY_RULES.items())} == {
        "pd_op.add_grad": "_add_grad_memory",
        "pd_op.conv2d": "_conv_memory",
        "pd_op.conv2d_grad": "_conv_memory",
        "pd_op.depthwise_conv2d": "_conv_memory",
        "pd_op.depthwise_conv2d_grad": "_conv_memory",
        "pd_op.dropout": "_dropout_memory",
        "pd_op.index_put": "_index_put_memory",
        "pd_op.index_put_": "_index_put_memory",
        "pd_op.lamb": "_update_memory",
        "pd_op.lamb_": "_update_memory",
        "pd_op.layer_norm_grad": "_layer_norm_grad_memory",
        "pd_op.rnn": "_rnn_memory",
        "pd_op.rnn_grad": "_rnn_memory",
        "pd_op.rprop": "_update_memory",
        "pd_op.rprop_": "_update_memory",
        "pd_op.set_value_with_tensor": "_set_value_memory",
        "pd_op.set_value_with_tensor_": "_set_value_memory",
    }


def test_an_op_gets_one_rule():
    with pytest.raises(ValueError, match="pd_op.dropout has a memory rule already"):
        pir.memory_rule("pd_op.dropout")(lambda converter, op, block, facts: None)
    assert pir.MEMORY_RULES["pd_op.dropout"].__name__ == "_dropout_memory"
