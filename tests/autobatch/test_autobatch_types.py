"""type_inference.infer_types."""
import numpy as np
import pytest

from autobatch import examples
from autobatch.dsl import ProgramBuilder
from autobatch.errors import TypeInferenceError
from autobatch.instructions import TensorType, Type
from autobatch.type_inference import as_type, infer_types, merge_types
from autobatch.virtual_machine import execute


def t(dtype, shape=()):
    return Type(TensorType(dtype, shape))


def test_fib_types():
    for dtype in (np.int64, np.int32, np.int16):
        fib = infer_types(examples.fibonacci(), [t(dtype)]).function("fib")
        assert fib.var_types["n"] == t(dtype) and fib.var_types["n1"] == t(dtype)
        assert fib.var_types["big"] == t(np.bool_)
        # the result is built from the constant 1 only: NumPy's default int
        assert fib.return_type == t(np.int64) and fib.var_types["sum"] == t(np.int64)
    out = execute(examples.fibonacci(), [np.arange(8, dtype=np.int16)])
    assert out.dtype == np.int64 and out.tolist() == [1, 1, 2, 3, 5, 8, 13, 21]


def test_collatz_types_follow_the_argument_dtype():
    collatz = infer_types(examples.collatz(), [t(np.int32)]).function("collatz")
    assert collatz.var_types["n"] == t(np.int32) and collatz.return_type == t(np.int32)
    out = execute(examples.collatz(), [np.array([6, 7], np.uint16)])
    assert out.dtype == np.uint16 and out.tolist() == [8, 16]


def test_python_constants_take_the_dtype_they_meet():
    ab = ProgramBuilder()
    with ab.function("halve", params=["x"]):
        ab.const(0.0, "acc")                 # weak float
        ab.primop(lambda x, acc: acc + x * 0.5, "acc")   # float32 (x is float32)
        ab.return_("acc")
    program = infer_types(ab.program("halve"), [t(np.float32)])
    assert program.function("halve").var_types["acc"] == t(np.float32)
    out = execute(ab.program("halve"), [np.array([1.0, 3.0], np.float32)])
    assert out.dtype == np.float32 and out.tolist() == [0.5, 1.5]


def test_tuple_types():
    gcd = infer_types(examples.gcd_pairs(), [Type((TensorType(np.int32), TensorType(np.int32)))])
    gcd = gcd.function("gcd")
    assert str(gcd.var_types["pair"]) == "(int32[], int32[])"
    assert str(gcd.return_type) == "(int32[], int32[])"  # steps = pair[0] * 0, then + 1


def test_shapes_exclude_the_batch_dimension():
    program = examples.nuts_shaped(*examples.nuts_problem(size=8))
    typed = infer_types(program, [t(np.float64, (8,))])
    assert str(typed.function("tree").return_type) == "(float64[8], bool[])"
    assert str(typed.function("nuts").var_types["depth"]) == "int64[]"


def _two_branch_program(other):
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        ab.primop(lambda x: x > 0, "pos")
        with ab.if_("pos"):
            ab.primop(lambda x: x, "y")
        with ab.else_():
            ab.primop(other, "y", vars_in=["x"])
        ab.return_("y")
    return ab.program("f")


def test_conflicting_dtypes_name_the_variable():
    program = _two_branch_program(lambda x: x.astype(np.float32))
    with pytest.raises(TypeInferenceError, match="variable 'y' of function 'f' is int64 in "
                                                 "one place and float32 in another"):
        infer_types(program, [t(np.int64)])
    # () and (2,) broadcast together (as in TFP): y is (2,)
    program = _two_branch_program(lambda x: np.stack([x, x], axis=1))
    assert infer_types(program, [t(np.int64)]).main_function().var_types["y"] == \
        Type(TensorType(np.int64, (2,)))
    program = _two_branch_program(lambda x: x[:, :2])
    with pytest.raises(TypeInferenceError, match="'y' of function 'f' has shape"):
        infer_types(program, [Type(TensorType(np.int64, (3,)))])


def test_branch_conditions_must_be_boolean():
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        with ab.if_("x"):
            ab.return_("x")
        ab.return_("x")
    with pytest.raises(TypeInferenceError, match="branch condition 'x' is int64"):
        infer_types(ab.program("f"), [t(np.int64)])


def _endless():
    ab = ProgramBuilder()
    with ab.function("down", params=["n"]):
        ab.primop(lambda n: n - 1, "m")
        ab.call("down", ["m"], "r")
        ab.primop(lambda r: r * 2, "s")
        ab.return_("s")
    return ab


def test_recursion_without_a_base_case_needs_type_inference():
    with pytest.raises(TypeInferenceError, match="return type of function 'down'.*"
                                                 "type_inference"):
        infer_types(_endless().program("down"), [t(np.int64)])


def test_type_inference_callable_in_tfp_style():
    ab = ProgramBuilder()
    with ab.function("down", params=["n"], type_inference=lambda arg_types: [arg_types[0]]):
        ab.primop(lambda n: n - 1, "m")
        ab.call("down", ["m"], "r")
        ab.primop(lambda r: r * 2, "s")
        ab.return_("s")
    typed = infer_types(ab.program("down"), [t(np.int32)])
    assert typed.function("down").return_type == t(np.int32)
    assert typed.function("down").var_types["s"] == t(np.int32)


def test_a_failing_primop_is_reported_with_its_inputs():
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        ab.primop(lambda x: x.no_such_method(), "y")
        ab.return_("y")
    with pytest.raises(TypeInferenceError, match=r"function 'f'.*x\.no_such_method\(\).*"
                                                 r"x: int64\[\].*AttributeError"):
        infer_types(ab.program("f"), [t(np.int64)])


def test_merge_rules():
    weak_int = Type(TensorType(np.int64, (), weak=True))
    weak_float = Type(TensorType(np.float64, (), weak=True))
    assert merge_types(weak_int, t(np.float32), "v") == t(np.float32)
    assert merge_types(weak_int, weak_float, "v") == weak_float
    with pytest.raises(TypeInferenceError, match="constant"):
        merge_types(weak_float, t(np.int32), "v")
    with pytest.raises(TypeInferenceError, match="tuple structure"):
        merge_types(t(np.int32), Type((TensorType(np.int32),)), "v")
    assert as_type([TensorType(np.int8)]) == t(np.int8)
    assert as_type([t(np.int8), t(np.bool_)]).is_tuple
