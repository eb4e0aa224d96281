"""A variable written with shapes that broadcast together ((), (1, 3, 1),
(5, 3, 2)) has the broadcast shape, as in TFP; every write of a smaller shape
is broadcast to it (primop outputs, call arguments and results, returns), on
every backend."""
import numpy as np
import pytest

import autobatch
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.errors import TypeInferenceError
from autobatch import instructions as inst
from autobatch.instructions import TensorType, Type
from autobatch.type_inference import infer_types, merge_types

BIG = np.arange(30.0).reshape(5, 3, 2)
MID = np.array([2.0, 3.0, 4.0]).reshape(1, 3, 1)


def three_shapes():
    """``x`` is () where n == 0, (1, 3, 1) where n == 1, (5, 3, 2) elsewhere."""
    ab = ProgramBuilder()
    with ab.function("f", params=["n"]):
        ab.primop(lambda n: n == 0, "c0")
        with ab.if_("c0"):
            ab.primop(lambda n: n + 1.0, "x")
        with ab.else_():
            ab.primop(lambda n: n == 1, "c1")
            with ab.if_("c1"):
                ab.primop(lambda n: n[:, None, None, None] + MID, "x")
            with ab.else_():
                ab.primop(lambda n: n[:, None, None, None] + BIG, "x")
        ab.return_("x")
    return ab.program("f")


def expected(n):
    out = []
    for v in n:
        small = {0: np.float64(v + 1.0), 1: v + MID[0]}.get(int(v), v + BIG)
        out.append(np.broadcast_to(small, (5, 3, 2)))
    return np.stack(out)


def test_merge_types_gives_the_broadcast_shape():
    a, b, c = (Type(TensorType(np.float32, s)) for s in [(), (1, 3, 1), (5, 3, 2)])
    assert merge_types(merge_types(a, b, "x"), c, "x") == c
    with pytest.raises(TypeInferenceError, match=r"\(2,\).*\(3,\).*broadcast"):
        merge_types(Type(TensorType(np.float32, (2,))), Type(TensorType(np.float32, (3,))), "x")


def test_the_variable_gets_the_broadcast_shape():
    typed = infer_types(three_shapes(), [Type(TensorType(np.float64, ()))])
    assert typed.main_function().var_types["x"] == Type(TensorType(np.float64, (5, 3, 2)))
    assert typed.main_function().return_type.tensors.shape == (5, 3, 2)


@pytest.mark.parametrize("backend", [NumpyBackend(), MaskedNumpyBackend()],
                         ids=["numpy", "masked"])
def test_three_shapes_on_numpy(backend):
    n = np.array([0.0, 1.0, 2.0, 1.0, 0.0, 7.0])
    np.testing.assert_array_equal(vm.execute(three_shapes(), [n], backend), expected(n))


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_three_shapes_on_tensorflow(tf, mode):
    from autobatch.backends.tf import TensorFlowBackend
    n = np.array([0.0, 1.0, 2.0, 0.0])
    got = vm.execute(three_shapes(), [n], TensorFlowBackend(mode))
    np.testing.assert_array_equal(np.asarray(got), expected(n))


def calls_and_returns():
    """A scalar argument to a parameter a (3,)-vector also reaches, a call
    whose () result lands in a (3,) variable, and two returns of () and (3,)."""
    ab = ProgramBuilder()
    with ab.function("g", params=["v"]):
        ab.primop(lambda v: v * 2.0, "w")
        ab.return_("w")
    with ab.function("h", params=["s"]):
        ab.primop(lambda s: s > 0, "pos")
        with ab.if_("pos"):
            ab.primop(lambda s: s - 1.0, "t")
            ab.return_("t")
        ab.primop(lambda s: s[:, None] + np.array([10.0, 20.0, 30.0]), "u")
        ab.return_("u")
    with ab.function("main", params=["s"]):
        ab.primop(lambda s: s > 1, "big")
        with ab.if_("big"):
            ab.call("g", ["s"], "y")                      # () argument, () result
        with ab.else_():
            ab.primop(lambda s: s[:, None] + np.ones(3), "vec")
            ab.call("g", ["vec"], "y")                    # (3,) argument
        ab.call("h", ["s"], "z")                          # (3,) result, one return is ()
        ab.primop(lambda y, z: y + z, "out")
        ab.return_("out")
    return ab.program("main")


def test_call_arguments_results_and_returns_are_broadcast():
    s = np.array([0.0, 2.0, 3.0, -1.0])
    want = []
    for v in s:
        y = np.full(3, 2 * v) if v > 1 else 2 * (v + np.ones(3))
        z = np.full(3, v - 1.0) if v > 0 else v + np.array([10.0, 20.0, 30.0])
        want.append(y + z)
    got = vm.execute(calls_and_returns(), [s], NumpyBackend())
    np.testing.assert_array_equal(got, np.stack(want))


def test_frontend_variable_with_broadcast_shapes():
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda arg_types: [TensorType(np.float64, (2, 3))])
    def spread(x):
        if x > 0:
            y = x * 1.0
        else:
            y = x[..., None, None] * np.ones((1, 3)) + np.zeros((2, 1))
        return y

    x = np.array([1.0, -1.0, 2.0])
    got = spread(x)
    assert got.shape == (3, 2, 3)
    np.testing.assert_array_equal(got, np.broadcast_to(x[:, None, None], (3, 2, 3)))


def _zeros_of(shape):
    """A primop (TFP style: a 1-tuple result) writing zeros of ``shape``,
    batch dimension included, of its input's dtype."""
    def op(ans):
        return (np.zeros(shape, dtype=np.asarray(ans).dtype),)
    return op


def shape_sequence_program(shapes):
    """TFP's IR objects: one block writing ``ans`` with each shape in turn."""
    ops = [inst.prim_op(["ans"], ["ans"], _zeros_of(shape)) for shape in shapes]
    block = inst.Block(ops, inst.halt_op())
    return inst.Program(inst.ControlFlowGraph([block]), [], {"ans": inst.Type(None)},
                        ["ans"], ["ans"])


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_shape_sequence_gives_the_broadcast_of_all_shapes(dtype):
    shapes = [(1, 1, 3, 1), (1, 1, 1, 2), (1, 1, 3, 2), (1, 5, 1, 1)]
    start = np.zeros([1], dtype=dtype)
    program = shape_sequence_program(shapes)
    typed = infer_types(program, [start], NumpyBackend())
    assert typed.var_defs["ans"].tensors.dtype == dtype
    assert typed.var_defs["ans"].tensors.shape == (5, 3, 2)
    (out,) = vm.execute(program, [start], NumpyBackend())
    assert out.shape == (1, 5, 3, 2) and out.dtype == dtype and not out.any()
