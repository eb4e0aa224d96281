"""TFP's IR object graph, as a TFP user writes it by hand: unnamed blocks
``Block(instructions, terminator)``, ``assign_instructions``, jumps to Block
objects, ``Function(graph, vars_in, vars_out, type_inference, name=None)``
given its graph after the calls to it are written, ``halt_op()`` returning
``vars_out``, ``FunctionCallOp`` of a Function object, and
``Program(graph, functions, var_defs, vars_in, vars_out)``; then TFP's
pipeline on autobatch's modules."""
import numpy as np
import pytest

from autobatch import allocation_strategy, lowering, stack_optimization, type_inference
from autobatch import instructions as inst
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import NumpyBackend


def fibonacci_ir():
    fib = inst.Function(None, ["n"], "ans", lambda types: types[0], name="fibonacci")
    enter, recur, finish = inst.Block(), inst.Block(name="recur"), inst.Block()
    enter.assign_instructions([
        inst.prim_op(["n"], "cond", lambda n: n > 1),
        inst.BranchOp("cond", recur, finish),
    ])
    recur.assign_instructions([
        inst.prim_op(["n"], "nm1", lambda n: n - 1),
        inst.FunctionCallOp(fib, ["nm1"], "fibm1"),
        inst.prim_op(["n"], "nm2", lambda n: n - 2),
        inst.FunctionCallOp(fib, ["nm2"], "fibm2"),
        inst.prim_op(["fibm1", "fibm2"], "ans", lambda a, b: a + b),
        inst.halt_op(),
    ])
    finish.assign_instructions([inst.prim_op([], "ans", lambda: 1), inst.halt_op()])
    fib.graph = inst.ControlFlowGraph([enter, recur, finish])
    main = inst.ControlFlowGraph([
        inst.Block([inst.FunctionCallOp(fib, ["n1"], "ans")], inst.halt_op()),
    ])
    return inst.Program(main, [fib], {}, ["n1"], "ans")


def fib(n):
    return 1 if n <= 1 else fib(n - 1) + fib(n - 2)


def test_tfp_object_graph_becomes_a_named_program():
    program = fibonacci_ir()
    assert program.main == "main"
    fn = program.function("fibonacci")
    assert fn.vars_in == ("n",)
    assert [b.name for b in fn.blocks] == ["block_0", "recur", "block_2"]
    assert fn.blocks[0].terminator.targets == ("recur", "block_2")
    assert isinstance(fn.blocks[1].terminator, inst.ReturnOp)
    assert fn.blocks[1].instructions[1].function == "fibonacci"
    assert isinstance(fn.graph, inst.ControlFlowGraph) and fn.graph.enter_block() is fn.blocks[0]
    assert fn.graph.block_index(fn.blocks[2]) == 2


@pytest.mark.parametrize("backend_name", ["numpy", "tensorflow"])
def test_tfp_object_graph_runs_through_tfp_pipeline(backend_name, request):
    if backend_name == "numpy":
        backend = NumpyBackend()
    else:
        request.getfixturevalue("tf")
        from autobatch.backends.tf import TensorFlowBackend
        backend = TensorFlowBackend("eager")
    n = np.array([0, 2, 6, 9], dtype=np.int32)
    typed = type_inference.infer_types(fibonacci_ir(), [n], backend)
    lowered = stack_optimization.fuse_pop_push(
        lowering.lower_function_calls(allocation_strategy.optimize(typed)))
    got = vm.execute(lowered, [n], 15, backend)
    assert np.asarray(got).tolist() == [fib(int(v)) for v in n]


def test_positional_forms_of_both_styles():
    ours = inst.Block("b", [], inst.ReturnOp("x"))
    assert ours.name == "b" and isinstance(ours.terminator, inst.ReturnOp)
    tfps = inst.Block([inst.prim_op([], "x", lambda: 1)], inst.halt_op(), "b2")
    assert tfps.name == "b2" and len(tfps.instructions) == 1
    f = inst.Function("f", ["x"], [ours])                 # autobatch's order
    assert f.params == ("x",) and f.blocks == [ours]
    g = inst.Function(inst.ControlFlowGraph([tfps]), [], "x", None)   # TFP's, unnamed
    program = inst.Program([g], main=g)
    assert program.main == g.name == "function_0"
    assert isinstance(program.main_function().blocks[0].terminator, inst.ReturnOp)
    op = inst.prim_op(["a"], [], lambda a: a).replace(vars_out="b")
    assert op.vars_out == "b"


def test_a_halt_without_vars_out_is_named():
    g = inst.Function(inst.ControlFlowGraph([inst.Block([], inst.halt_op())]), [], None, None,
                      name="g")
    with pytest.raises(ValueError, match="'g'.*vars_out"):
        inst.Program([g], main="g")


def is_even_ir():
    """Mutual recursion in TFP's objects: two unnamed functions declared
    before their graphs, "done with" PopOps in their bodies."""
    def pred_type(types):
        return inst.TensorType(np.bool_, types[0].shape)

    is_odd = inst.Function(None, ["n"], "ans", pred_type)
    is_even = inst.Function(None, ["n"], "ans", pred_type)

    def body(other, base):
        enter, finish, recur = inst.Block(), inst.Block(), inst.Block()
        enter.assign_instructions([inst.prim_op(["n"], "cond", lambda n: n < 1),
                                   inst.BranchOp("cond", finish, recur)])
        finish.assign_instructions([inst.PopOp(["n", "cond"]),
                                    inst.prim_op([], "ans", lambda: base), inst.halt_op()])
        recur.assign_instructions([inst.PopOp(["cond"]),
                                   inst.prim_op(["n"], "nm1", lambda n: n - 1),
                                   inst.PopOp(["n"]),
                                   inst.FunctionCallOp(other, ["nm1"], "ans"),
                                   inst.PopOp(["nm1"]), inst.halt_op()])
        return inst.ControlFlowGraph([enter, finish, recur])

    is_even.graph = body(is_odd, True)
    is_odd.graph = body(is_even, False)
    main = inst.ControlFlowGraph([inst.Block([inst.FunctionCallOp(is_even, ["n1"], "ans")],
                                             inst.halt_op())])
    untyped = {v: inst.Type(None) for v in ["n", "n1", "cond", "nm1", "ans"]}
    return inst.Program(main, [is_even, is_odd], untyped, ["n1"], "ans")


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_mutual_recursion_with_done_with_pops(dtype):
    n = np.array([5, 6, 0, 3], dtype=dtype)
    typed = type_inference.infer_types(is_even_ir(), [n], NumpyBackend())
    assert typed.var_defs["ans"] == inst.single_type(np.bool_, ())
    assert typed.var_defs["n1"].tensors.dtype == dtype
    lowered = lowering.lower_function_calls(allocation_strategy.optimize(typed))
    got = vm.execute(lowered, [n], int(n.max()) + 3, NumpyBackend())
    assert got.tolist() == [False, True, True, False]


def test_product_types_and_patterns_in_one_block():
    block = inst.Block([
        inst.prim_op(["inp"], "many", lambda x: (x + 1, (x + 2, x + 3))),
        inst.prim_op(["many"], ["one", "two"], lambda x: x),
    ], inst.halt_op())
    program = inst.Program(inst.ControlFlowGraph([block]), [], {}, ["inp"], "two")
    inp = np.array([4, 5], dtype=np.int64)
    typed = type_inference.infer_types(program, [inp], NumpyBackend())
    leaf = inst.TensorType(np.int64, ())
    assert typed.var_defs["many"] == inst.Type((leaf, (leaf, leaf)))
    assert typed.var_defs["two"] == inst.Type((leaf, leaf))
    got = vm.execute(program, [inp], 15, NumpyBackend())
    assert [g.tolist() for g in got] == [[6, 7], [7, 8]]
