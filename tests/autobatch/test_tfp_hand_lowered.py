"""Programs lowered by hand in TFP's IR (``PushGotoOp``/``IndirectGotoOp``,
per-variable stacks, pops) and TFP's reference interpreter, on autobatch's
modules: rewritten from TFP's ``instructions_test.py`` (interpret),
``virtual_machine_test.py`` (the batched VM on NumPy and TensorFlow, in
each regime TFP runs it) and ``lowering_test.py`` (``optimize`` ->
``lower_function_calls`` -> ``execute`` on a program typed by its
``var_defs``)."""
import numpy as np
import pytest

import tfp_programs as tp
from conftest import need
from autobatch import allocation_strategy, lowering, stack_optimization, type_inference
from autobatch import instructions as inst
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.errors import ProgramError, StackOverflowError

NP = NumpyBackend()


# -- instructions.interpret (TFP's instructions_test) ------------------------------------

def test_interpret_runs_tfp_test_programs():
    assert inst.interpret(tp.constant_program(), 5) == 2
    assert inst.interpret(tp.single_if_program(), 1) == 0
    assert inst.interpret(tp.single_if_program(), 3) == 2
    assert tuple(int(v) for v in inst.interpret(tp.pattern_variable_program(), 5)) == (7, 8)
    assert inst.interpret(tp.fibonacci_by_hand(), 5) == 8
    assert int(inst.interpret(tp.fibonacci_calls(), 5)) == 8
    assert bool(inst.interpret(tp.is_even_calls(), 6)) is True
    assert bool(inst.interpret(tp.is_even_calls(), 7)) is False
    got = inst.interpret(tp.pattern_program())
    assert inst.pattern_map(int, inst.as_pattern(got)) == ((1, 3), 4, (5, 6))


def test_hand_lowered_graph_is_kept_with_pc_var():
    var_defs = {"n": tp.I64}
    program = tp.fibonacci_by_hand()
    assert program.lowered_by_hand is not None and program.functions == ()
    assert program.var_defs[inst.pc_var] == inst.single_type(np.int32, ())
    assert inst.pc_var == "__program_counter__"
    assert set(program.lowered_by_hand.var_alloc.values()) == {inst.VariableAllocation.FULL}
    # As TFP's Program, the caller's var_defs gains the program counter.
    inst.Program(inst.ControlFlowGraph([inst.Block([], inst.halt_op())]), [], var_defs,
                 ["n"], "n")
    assert inst.pc_var in var_defs
    # A graph without pushes, pops or push-gotos is a program of functions.
    assert tp.single_if_program().lowered_by_hand is None


def test_referenced_variables_and_return_ops():
    program = tp.fibonacci_by_hand()
    blocks = {b.name: b for b in program.lowered_by_hand.blocks}
    assert inst.extract_referenced_variables(blocks["recur3"]) == {
        "ans", "fibm1", "fibm2", inst.pc_var}
    assert inst.extract_referenced_variables(blocks["enter_fib"]) == {"n", "cond"}
    everything = inst.extract_referenced_variables(inst.ControlFlowGraph(list(blocks.values())))
    assert everything == set(program.var_defs)
    assert inst.is_return_op(blocks["finish"].terminator)
    assert inst.is_return_op(inst.halt_op())
    assert not inst.is_return_op(blocks["entry"].terminator)
    with pytest.raises(ValueError, match="unexpected int"):
        inst.extract_referenced_variables(3)


def _skip_push_program(skip):
    """x = x + 10 (push); x = x + 1 (push, or in place if skipped); pop x."""
    block = inst.Block([
        inst.prim_op(["x"], "x", lambda x: x + 10),
        inst.prim_op(["x"], "x", lambda x: x + 1, skip_push_mask={"x"} if skip else None),
        inst.PopOp(["x"]),
    ], inst.halt_op())
    return inst.Program(inst.ControlFlowGraph([block]), [], {"x": tp.I64}, ["x"], "x")


@pytest.mark.parametrize("skip,added", [(True, 0), (False, 10)])
def test_writes_push_unless_skip_push_mask(skip, added):
    assert inst.interpret(_skip_push_program(skip), 5) == 5 + added
    got = vm.execute(_skip_push_program(skip), [np.array([1, 2], np.int64)], 4, NP)
    assert got.tolist() == [1 + added, 2 + added]


def test_pop_push_fusion_on_a_hand_lowered_program():
    """TFP's stack_optimization_test: a pop followed by a write of the same
    variable becomes an in-place write; other pops move to the block's end
    or before the first read; the results do not change."""
    fused = stack_optimization.fuse_pop_push(tp.fibonacci_by_hand())
    blocks = {b.name: b.instructions for b in fused.lowered_by_hand.blocks}

    def shape(ops):
        return [("pop", tuple(op.vars)) if isinstance(op, inst.PopOp)
                else (inst.format_pattern(op.vars_out), tuple(sorted(op.skip_push_mask)))
                for op in ops]
    assert shape(blocks["recur1"]) == [("nm1", ()), ("(n,)", ()), ("pop", ("cond", "nm1"))]
    assert shape(blocks["recur2"]) == [("(fibm1,)", ()), ("nm2", ()), ("(n,)", ("n",)),
                                       ("pop", ("ans", "nm2"))]
    assert shape(blocks["recur3"]) == [("(fibm2,)", ()), ("ans", ("ans",)),
                                       ("pop", ("fibm1", "fibm2"))]
    assert shape(blocks["finish"]) == [("ans", ()), ("pop", ("n", "cond"))]
    n = [5, 6, 8, 9, 0, 1]
    assert vm.execute(fused, [n], 15, NP).tolist() == [tp.fib(k) for k in n]
    assert [inst.interpret(fused, k) for k in n] == [tp.fib(k) for k in n]


# -- the batched VM on NumPy (TFP's virtual_machine_test) ---------------------------------

@pytest.mark.parametrize("backend", [NP, MaskedNumpyBackend()], ids=["numpy", "masked"])
def test_vm_runs_tfp_test_programs(backend):
    assert vm.execute(tp.constant_program(), [[5]], 4, backend).tolist() == [2]
    assert vm.execute(tp.constant_program(), [[5, 10, 15]], 4, backend).tolist() == [2, 2, 2]
    assert vm.execute(tp.single_if_program(), [[0, 5, -15]], 3, backend).tolist() == [0, 2, 0]
    one, two = vm.execute(tp.pattern_variable_program(), [[3, 4, 5]], 4, backend)
    assert [one.tolist(), two.tolist()] == [[5, 6, 7], [6, 7, 8]]
    n = [5, 6, 8, 9, 0, 1]
    got = vm.execute(tp.fibonacci_by_hand(), [n], max_stack_depth=15, backend=backend)
    assert got.tolist() == [tp.fib(k) for k in n]
    assert got.tolist() == [inst.interpret(tp.fibonacci_by_hand(), k) for k in n]


def test_pea_nuts_by_hand_matches_python():
    rng = np.random.default_rng(0)
    state = rng.normal(size=(4, 3)).astype(np.float32)
    counts = np.array([3, 1, 0, 2])

    def halve(s):
        return s * np.float32(0.5)
    program = tp.pea_nuts_by_hand((3,), lambda count: 2, halve)
    got = vm.execute(program, [counts, state], 10, backend=NP)
    want = [tp.pea_nuts_reference(int(c), 2, state[i], halve) for i, c in enumerate(counts)]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-6)
    # TFP's own check: a step coupling the threads, depth 3, runs to the end.
    data = rng.normal(size=(10, 3)).astype(np.float32)
    coupled = tp.pea_nuts_by_hand((3,), lambda count: 3,
                                  lambda s: s + np.sum(np.tensordot(data, s, ([1], [1]))))
    assert vm.execute(coupled, [np.array([3] * 4), state], 10, backend=NP).shape == (4, 3)


def test_stack_overflow_names_the_variable():
    with pytest.raises(StackOverflowError, match="'__program_counter__' exceeds "
                                                 "max_stack_depth=4") as info:
        vm.execute(tp.fibonacci_by_hand(), [[5, 6]], 4, NP)
    assert isinstance(info.value, ValueError)   # as TFP's
    assert vm.execute(tp.fibonacci_by_hand(), [[1, 0]], 4, NP).tolist() == [1, 1]


def test_bad_hand_lowered_programs_are_refused_by_name():
    fn = inst.Function(inst.ControlFlowGraph([inst.Block([], inst.halt_op())]), ["a"], "a",
                       None, name="f")
    with pytest.raises(ProgramError, match="calls 'f' in a program lowered by hand"):
        inst.Program(inst.ControlFlowGraph([inst.Block(
            [inst.FunctionCallOp(fn, ["n"], "n"), inst.PopOp(["n"])], inst.halt_op())]),
            [], {"n": tp.I64}, ["n"], "n")
    untyped = tp.fibonacci_by_hand()
    del untyped.lowered_by_hand.var_defs["fibm2"]
    with pytest.raises(ProgramError, match=r"\['fibm2'\].*no Type in var_defs"):
        vm.execute(untyped, [[5]], 15, NP)
    with pytest.raises(ProgramError, match="lowered by hand.*virtual_machine.execute"):
        type_inference.infer_types(tp.fibonacci_by_hand(), [np.array([5])], NP)


def test_jax_backend_refuses_hand_lowered_programs():
    need("jax")
    from autobatch.backends.jax import JaxBackend
    with pytest.raises(ProgramError, match="runs on the NumPy or TensorFlow backend"):
        vm.execute(tp.fibonacci_by_hand(), [[3]], 15, JaxBackend())


# -- TFP's lowering_test: var_defs types the program ------------------------------------

def test_tfp_lowering_flow_on_declared_types():
    prog = tp.fibonacci_calls()
    lowered = lowering.lower_function_calls(allocation_strategy.optimize(prog))
    got = vm.execute(lowered, [[5, 6, 8, 9]], max_stack_depth=15, backend=NP)
    assert list(got) == [8, 13, 34, 55]
    lowered = lowering.lower_function_calls(allocation_strategy.optimize(tp.is_even_calls()))
    got = vm.execute(lowered, [[5, 6, 8, 9, 0]], max_stack_depth=12, backend=NP)
    assert [bool(v) for v in got] == [False, True, True, False, True]


# -- TensorFlow, in the regimes TFP's virtual_machine_test runs --------------------------

def test_hand_lowered_on_tensorflow_eager_xla_and_session(tf):
    from autobatch.backends.tf import TensorFlowBackend
    backend, unchecked = TensorFlowBackend(), TensorFlowBackend(safety_checks=False)
    n = tf.constant([5, 6, 8, 9], tf.int64)
    want = [8, 13, 34, 55]

    def fib(x, b=backend):
        return vm.execute(tp.fibonacci_by_hand(), [x], 15, b)

    eager = fib(tf.constant([3, 1], tf.int64))
    assert tf.is_tensor(eager) and eager.numpy().tolist() == [3, 1]
    # autograph=False, as TFP's tests (autograph would convert the whole
    # compile pipeline: 10-40 s).
    xla = tf.function(lambda x: fib(x, unchecked), jit_compile=True, autograph=False)
    assert xla(n).numpy().tolist() == want
    one, two = tf.function(lambda x: vm.execute(tp.pattern_variable_program(), [x], 4,
                                                backend), autograph=False)(
        tf.constant([3, 4, 5], tf.int64))
    assert [one.numpy().tolist(), two.numpy().tolist()] == [[5, 6, 7], [6, 7, 8]]
    with tf.compat.v1.Graph().as_default():
        ph = tf.compat.v1.placeholder_with_default(np.int64([0, 1, 3]), shape=None)
        out = fib(ph)
        with tf.compat.v1.Session() as session:
            assert session.run(out).tolist() == [1, 1, 3]


def test_hand_lowered_in_tf_function_overflow_is_an_assertion(tf):
    from autobatch.backends.tf import TensorFlowBackend
    run = tf.function(lambda x: vm.execute(tp.fibonacci_by_hand(), [x], 4,
                                           TensorFlowBackend()), autograph=False)
    assert run(tf.constant([1], tf.int64)).numpy().tolist() == [1]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="VariableStackOverflow: push to variable .*__program_counter__"):
        run(tf.constant([5], tf.int64))
