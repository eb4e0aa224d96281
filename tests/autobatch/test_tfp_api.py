"""A TFP user's lower-level code, written in TFP's style (not copied),
running on autobatch's modules: IR built with ``instructions.prim_op``,
``push_op``, ``Type``/``single_type`` with list patterns; ``execute`` called
with TFP's argument order ``(program, args, max_stack_depth, backend)``;
the backends' helpers ``full_mask``, ``merge_dtypes``, ``merge_shapes``,
``run_on_dummies``; ``TensorFlowBackend(safety_checks=...)``."""
import numpy as np
import pytest

from autobatch import instructions as inst
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import NumpyBackend
from autobatch.errors import StackOverflowError


def countdown_program():
    """``count(n) = 0 if n <= 0 else 1 + count(n - 1)``, as a TFP user
    writes IR by hand: list patterns, prim_op, push_op for a copy."""
    entry = inst.Block(name="entry", instructions=[
        inst.prim_op(["n"], "done", lambda n: n <= 0),
    ], terminator=inst.BranchOp("done", "base", "recur"))
    base = inst.Block(name="base", instructions=[
        inst.prim_op([], "zero", lambda: 0),
        inst.push_op(["zero"], ["out"]),
    ], terminator=inst.ReturnOp("out"))
    recur = inst.Block(name="recur", instructions=[
        inst.prim_op(["n"], ["m", "m2"], lambda n: (n - 1, n)),
        inst.FunctionCallOp("count", ["m"], "sub"),
        inst.prim_op(["sub"], "out", lambda sub: sub + 1),
    ], terminator=inst.ReturnOp("out"))
    count = inst.Function(name="count", params=["n"], blocks=[entry, base, recur])
    return inst.Program([count], main="count")


def test_hand_written_ir_with_tfp_helpers_and_argument_order():
    n = np.array([0, 3, 5, 1])
    out = vm.execute(countdown_program(), [n], 8, NumpyBackend())   # TFP's order
    assert out.tolist() == [0, 3, 5, 1]
    assert vm.execute(countdown_program(), [n], NumpyBackend(), 8).tolist() == [0, 3, 5, 1]
    with pytest.raises(StackOverflowError):
        vm.execute(countdown_program(), [n], 4, NumpyBackend())


def test_types_with_list_patterns():
    pair = inst.Type([inst.TensorType(np.int32, ()), inst.TensorType(np.float64, (3,))])
    assert pair == inst.Type((inst.TensorType(np.int32, ()), inst.TensorType(np.float64, (3,))))
    assert [t.dtype for t in pair.leaves()] == [np.dtype(np.int32), np.dtype(np.float64)]
    one = inst.single_type(np.float32, [2])
    assert one.tensors.dtype == np.float32 and one.tensors.shape == (2,)


def test_backend_helpers_numpy():
    b = NumpyBackend()
    assert b.full_mask(3).tolist() == [True, True, True]
    assert b.merge_dtypes(np.int32, np.int64) == np.int64       # TFP's NumPy promotes
    assert b.merge_dtypes(None, np.float32) == np.float32
    assert b.merge_shapes((1, 3, 1), (5, 3, 2)) == (5, 3, 2)
    with pytest.raises(ValueError):
        b.merge_shapes((2,), (3,))
    assert b.run_on_dummies(lambda x, y: x + y, [np.ones(2), 1]).tolist() == [2.0, 2.0]


def test_backend_helpers_and_safety_checks_tensorflow(tf):
    from autobatch.backends.tf import TensorFlowBackend
    b = TensorFlowBackend()
    assert b.full_mask(2).numpy().tolist() == [True, True]
    assert b.merge_dtypes(np.int32, np.int32) == np.int32
    with pytest.raises(ValueError, match="Mismatched dtypes"):
        b.merge_dtypes(np.int32, np.int64)                      # TFP's TF backend insists
    n = np.array([2, 4])
    assert vm.execute(countdown_program(), [n], 8, b).numpy().tolist() == [2, 4]
    with pytest.raises(StackOverflowError):
        vm.execute(countdown_program(), [n], 3, TensorFlowBackend(safety_checks=True))
    unchecked = TensorFlowBackend(safety_checks=False, mode="eager")   # TFP's order first
    assert unchecked != TensorFlowBackend("eager")
    assert vm.execute(countdown_program(), [np.array([1, 2])], 8, unchecked).numpy().tolist() \
        == [1, 2]
