"""TFP's backend variable API on autobatch's backends, as TFP's VM and its
users call it: ``create_variable(name, alloc, type_, max_stack_depth,
batch_size)`` and the variables' ``update(value, mask)``, ``push(mask)``,
``pop(mask)``, ``read()``; ``run_on_dummies(callable, input_types)`` with
Types; ``stack_optimization.fuse_pop_push`` on a lowered program."""
import numpy as np
import pytest

from autobatch import examples, instructions as inst, stack_optimization
from autobatch.backends.numpy import NumpyBackend
from autobatch.errors import NullVariableError, StackOverflowError
from autobatch.pipeline import argument_types, compile_program

FULL, REGISTER = inst.VariableAllocation.FULL, inst.VariableAllocation.REGISTER




def _check_variables(b):
    t = inst.TensorType(np.float64, (2,))
    v = b.create_variable("x", FULL, t, 3, 4)
    v = v.update(np.ones((4, 2)), b.full_mask(4))
    v = v.push(np.array([True, False, True, False]))           # save 1s for threads 0, 2
    v = v.update(np.full((4, 2), 5.0), np.array([True, True, False, False]))
    assert np.asarray(v.read())[:, 0].tolist() == [5, 5, 1, 1]
    v = v.pop(np.array([True, False, True, False]))            # restore threads 0, 2
    assert np.asarray(v.read())[:, 0].tolist() == [1, 5, 1, 1]
    with pytest.raises(ValueError):
        v.pop(b.full_mask(4))                                   # nothing saved
    full = b.full_mask(4)
    with pytest.raises(StackOverflowError):
        v.push(full).push(full).push(full).push(full)
    r = b.create_variable("r", REGISTER, inst.single_type(np.int32, []), 3, 3)
    r = r.update(np.array([1, 2, 3], np.int32), np.array([True, False, True]))
    assert np.asarray(r.push(full).pop(full).read()).tolist() == [1, 0, 3]
    tmp = b.create_variable("t", inst.VariableAllocation.TEMPORARY, t, 3, 4)
    assert tmp.update(7, None).read() == 7
    null = b.create_variable("n", inst.VariableAllocation.NULL, t, 3, 4)
    with pytest.raises(NullVariableError):
        null.update(1, full).push(full).read()
    pair = b.create_variable("p", REGISTER, inst.Type([t, inst.TensorType(np.int32, ())]), 2, 4)
    assert isinstance(pair, tuple) and len(pair) == 2
    dummies = b.run_on_dummies(lambda x, y: x + y, [inst.single_type(np.float32, [3]),
                                                    inst.TensorType(np.float32, (3,))])
    assert np.asarray(dummies).tolist() == [0.0, 0.0, 0.0]


def test_variables_numpy():
    _check_variables(NumpyBackend())


def test_variables_tensorflow(tf):
    from autobatch.backends.tf import TensorFlowBackend
    _check_variables(TensorFlowBackend("eager"))


def test_fuse_pop_push_on_a_lowered_program():
    program = examples.fibonacci()
    args = [np.arange(6)]
    backend = NumpyBackend()
    lowered = compile_program(program, argument_types(args, backend), backend).lowered
    before = str(lowered)
    assert stack_optimization.fuse_pop_push(lowered) is lowered
    assert str(lowered) == before      # lowering already fused every pop+push
    block = inst.Block("b", [inst.PopOp(["x"]), inst.PrimOp(["x"], "y", lambda x: x),
                             inst.PushOp(["x", "y"])], inst.IndirectGotoOp())
    class Lowered:                     # any object with blocks
        blocks = [block]
    stack_optimization.fuse_pop_push(Lowered)
    assert [str(op) for op in block.instructions][-1] == "push y"


# -- model-based: a FULL variable against a list of stacks per thread ------------------------

from hypothesis import given, settings, strategies as st   # noqa: E402

BATCH, DEPTH = 3, 3
masks = st.lists(st.booleans(), min_size=BATCH, max_size=BATCH)
ops = st.lists(st.one_of(
    st.tuples(st.just("update"), st.lists(st.integers(-9, 9), min_size=BATCH,
                                          max_size=BATCH), masks),
    st.tuples(st.just("push"), masks),
    st.tuples(st.just("pop"), masks)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_full_variable_agrees_with_a_model_of_stacks(sequence):
    backend = NumpyBackend()
    var = backend.create_variable("v", FULL, inst.TensorType(np.int64, ()), DEPTH, BATCH)
    model = [[0] for _ in range(BATCH)]        # each thread: saved values then current
    for op in sequence:
        if op[0] == "update":
            values, mask = op[1], op[2]
            var = var.update(np.array(values), np.array(mask))
            for stack, v, m in zip(model, values, mask, strict=True):
                if m:
                    stack[-1] = v
        elif op[0] == "push":
            mask = op[1]
            if any(m and len(s) >= DEPTH for s, m in zip(model, mask, strict=True)):
                with pytest.raises(ValueError):
                    var.push(np.array(mask))
                continue
            var = var.push(np.array(mask))
            for stack, m in zip(model, mask, strict=True):
                if m:
                    stack.append(stack[-1])        # a duplicating push
        else:
            mask = op[1]
            if any(m and len(s) <= 1 for s, m in zip(model, mask, strict=True)):
                with pytest.raises(ValueError):
                    var.pop(np.array(mask))
                continue
            var = var.pop(np.array(mask))
            for stack, m in zip(model, mask, strict=True):
                if m:
                    stack.pop()
        assert var.read().tolist() == [s[-1] for s in model]


def _params(fn):
    import inspect
    return list(inspect.signature(fn).parameters)[1:]          # without self


@pytest.mark.parametrize("method, names", [
    ("create_variable", ["name", "alloc", "type_", "max_stack_depth", "batch_size"]),
    ("full_mask", ["size", "name"]),
    ("merge_dtypes", ["dt1", "dt2"]),
    ("merge_shapes", ["s1", "s2"]),
])
def test_backend_methods_take_tfps_parameter_names(method, names):
    assert _params(getattr(NumpyBackend, method)) == names


def test_full_variable_methods_take_tfps_parameters():
    from autobatch.backends.variables import FullVariable
    assert _params(FullVariable.update) == ["value", "mask", "name"]
    assert _params(FullVariable.push) == ["mask", "name"]
    assert _params(FullVariable.pop) == ["mask", "name"]
    assert _params(FullVariable.read) == ["name"]
