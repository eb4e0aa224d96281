"""TFP's ``Program.main_function()``, ``Program.replace(var_defs, var_alloc)``,
``Program.var_alloc`` and ``virtual_machine.is_staging`` on autobatch's
modules (TFP's instructions.py / virtual_machine.py semantics)."""
import numpy as np
import pytest

from autobatch import allocation_strategy, type_inference
from autobatch import instructions as inst
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import NumpyBackend
from tests.autobatch.test_tfp_ir_objects import fib, fibonacci_ir


def _typed(n):
    return type_inference.infer_types(fibonacci_ir(), [n], NumpyBackend())


def test_main_function_is_a_method_returning_main():
    program = fibonacci_ir()
    main = program.main_function()
    assert isinstance(main, inst.Function) and main.name == "main"
    assert main.vars_in == ("n1",)
    assert isinstance(main.blocks[0].instructions[0], inst.FunctionCallOp)


def test_main_function_of_a_program_lowered_by_hand():
    block = inst.Block([inst.prim_op(["x"], "y", lambda x: x + 1)], inst.halt_op())
    program = inst.Program(inst.ControlFlowGraph([block, inst.Block([], inst.IndirectGotoOp())]),
                           [], {"x": inst.single_type(np.int64, ()),
                                "y": inst.single_type(np.int64, ())}, ["x"], "y")
    assert program.lowered_by_hand is not None
    main = program.main_function()
    assert main.name == "main" and main.vars_in == ("x",) and main.graph.blocks[0] is block


def test_replace_needs_something_to_replace():
    with pytest.raises(ValueError, match="Nothing to replace"):
        fibonacci_ir().replace()


def test_replace_var_alloc_returns_a_copy():
    n = np.array([0, 2, 6, 9], dtype=np.int32)
    allocated = allocation_strategy.optimize(_typed(n))
    before = dict(allocated.var_alloc)
    assert before[inst.pc_var] == inst.VariableAllocation.FULL
    assert before["n"] == inst.VariableAllocation.FULL
    assert before["nm1"] == inst.VariableAllocation.TEMPORARY
    full = {name: inst.VariableAllocation.FULL for name in before}
    replaced = allocated.replace(var_alloc=full)
    assert replaced is not allocated and replaced.var_alloc == full
    assert allocated.var_alloc == before                     # the original is unchanged
    got = vm.execute(replaced, [n], 15, NumpyBackend())
    assert np.asarray(got).tolist() == [fib(int(v)) for v in n]


def test_replace_var_defs():
    n = np.array([3], dtype=np.int32)
    typed = _typed(n)
    defs = dict(typed.var_defs)
    defs["ans"] = inst.single_type(np.float64, ())
    replaced = typed.replace(var_defs=defs)
    assert replaced.var_defs["ans"] == inst.single_type(np.float64, ())
    assert typed.var_defs["ans"] == inst.single_type(np.int32, ())
    assert replaced.var_defs[inst.pc_var] == inst.single_type(np.int32, ())
    # Before type inference, the var_defs a program is built with.
    untyped = fibonacci_ir().replace(var_defs={"n1": inst.single_type(np.int32, ())})
    assert untyped.given_var_defs["n1"] == inst.single_type(np.int32, ())


def test_is_staging_only_inside_the_vm():
    seen = []

    def record(x):
        seen.append(vm.is_staging())
        return x + 1

    fn = inst.Function("main", ["x"], [inst.Block("b", [inst.prim_op(["x"], "y", record)],
                                                  inst.ReturnOp("y"))])
    program = inst.Program([fn], "main")
    assert not vm.is_staging()
    got = vm.execute(program, [np.array([1, 2])], 15, NumpyBackend())
    assert np.asarray(got).tolist() == [2, 3]
    assert seen and seen[-1] is True
    assert not vm.is_staging()


def test_printing_takes_tfp_indent_and_width():
    program = fibonacci_ir()
    text = str(program)
    assert text == program.__str__(0, 80)
    # built TFP's way: TFP's text; format() keeps autobatch's own listing
    assert "ans = call(fibonacci, n1)" in text and "branch(cond, recur, block_2)" in text
    assert "ans = call fibonacci(n1)" in program.format()
    indented = program.__str__(indent=4)
    assert all(line.startswith("    ") for line in indented.split("\n") if line)
    fn = program.function("fibonacci")
    assert str(fn).startswith("function fibonacci(n)")
    assert fn.graph.__str__(2, 80).startswith("  block_0:")
    op = inst.prim_op(["alpha", "beta", "gamma", "delta", "epsilon"], "result", lambda *a: 0)
    narrow = op.__str__(indent=2, width=24)
    lines = narrow.split("\n")
    assert len(lines) > 1 and lines[0].startswith("  result = primop(")
    assert all(line.startswith("    ") for line in lines[1:])
    assert " ".join(narrow.split()) == " ".join(str(op).split())   # same words


def test_printing_a_program_lowered_by_hand():
    first, second = inst.Block(), inst.Block(name="ret")
    first.assign_instructions([inst.prim_op(["x"], "y", lambda x: x + 1),
                               inst.PushGotoOp(second, second)])
    second.assign_instructions([inst.PopOp(["y"]), inst.IndirectGotoOp()])
    program = inst.Program(inst.ControlFlowGraph([first, second]), [],
                           {"x": inst.single_type(np.int64, ()),
                            "y": inst.single_type(np.int64, ())}, ["x"], "y")
    text = str(program)
    assert "x :: full, Type(tensors=TensorType(int64()))" in text
    assert "y :: full, Type(tensors=TensorType(int64()))" in text
    assert "push_goto(ret, ret)" in text and "indirect_jump" in text
    assert "def main(x):\n  returns y\n  block_0:\n    y = prim(x) by" in text
