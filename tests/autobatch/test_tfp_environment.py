"""TFP's ``instructions.Environment``, ``PythonBackend`` and
``PythonVMVariable`` on autobatch's modules."""
import numpy as np
import pytest

from autobatch import instructions as inst
from autobatch.backends.numpy import NumpyBackend

FULL = inst.VariableAllocation.FULL


def _env():
    var_defs = {"x": inst.single_type(np.int64, ()),
                "pair": inst.Type((inst.TensorType(np.int64, ()),
                                   inst.TensorType(np.float64, ())))}
    return inst.Environment.initialize(inst.PythonBackend(), {k: FULL for k in var_defs},
                                       var_defs)


def test_python_variable_is_a_stack():
    var = inst.PythonVMVariable("v")
    assert var.read() is None
    assert var.update(1) is var and var.push().update(2).read() == 2
    assert var.pop().read() == 1
    with pytest.raises(ValueError, match="Popped last value"):
        var.pop()
    assert inst.PythonBackend().variable_class is inst.PythonVMVariable


def test_environment_push_update_pop_read():
    env = _env()
    assert set(env.env_dict) == {"x", "pair"}
    assert isinstance(env.env_dict["pair"], tuple) and len(env.env_dict["pair"]) == 2
    env["x"] = env.update("x", 3)
    env["x"] = env.push("x", 4)
    assert env.read("x") == 4
    env["x"] = env.pop("x")
    assert env.read("x") == 3
    env["pair"] = env.push("pair", (1, 2.5))
    assert env.read("pair") == (1, 2.5)
    env["pair"] = env.pop("pair")
    assert env.read("pair") == (None, None)
    copy = inst.Environment(env.env_dict, env.backend, update={"y": inst.PythonVMVariable("y")})
    assert "y" in copy.env_dict and "y" not in env.env_dict
    with pytest.raises(ValueError, match="undeclared"):
        env.read("nope")
    with pytest.raises(ValueError, match="undeclared"):
        env.push("nope", 1)
    with pytest.raises(ValueError):
        env.push("pair", 1)                                  # structure mismatch


def test_environment_on_a_batched_backend():
    backend = NumpyBackend()
    var_defs = {"x": inst.single_type(np.int64, ())}
    env = inst.Environment.initialize(backend, {"x": FULL}, var_defs, 4, 3)   # depth, batch
    mask = np.array([True, False, True])
    env["x"] = env.update("x", np.array([1, 2, 3]), mask)
    assert np.asarray(env.read("x")).tolist() == [1, 0, 3]
