"""TFP's ``dsl.ProgramBuilder`` style, written as a TFP user writes it, on
autobatch's modules: ``param``, ``ab.var``, ``local``/``locals_``, pattern
assignment ``ab(pattern).pattern = ...``, ``declare_function`` /
``define_function``, unnamed functions, and TFP's pipeline
``infer_types(program, inputs, backend)`` -> ``allocation_strategy.optimize``
-> ``lowering.lower_function_calls`` -> ``stack_optimization.fuse_pop_push``
-> ``virtual_machine.execute(program, inputs, max_stack_depth, backend)``."""
import numpy as np
import pytest

from autobatch import allocation_strategy, dsl, lowering, stack_optimization
from autobatch import instructions as inst, type_inference
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import NumpyBackend
from autobatch.errors import ProgramError


def run_like_tfp(program, inputs, backend, depth=15):
    typed = type_inference.infer_types(program, inputs, backend)
    allocated = allocation_strategy.optimize(typed)
    lowered = lowering.lower_function_calls(allocated)
    lowered = stack_optimization.fuse_pop_push(lowered)
    return vm.execute(lowered, inputs, depth, backend)


def fibonacci_program():
    ab = dsl.ProgramBuilder()

    def fib_type(arg_types):
        return arg_types[0]

    with ab.function(type_inference=fib_type) as fibonacci:
        ab.param("n")
        ab.var.cond = ab.primop(lambda n: n > 1)
        with ab.if_(ab.var.cond, then_name="recur", else_name="base"):
            ab.var.nm1 = ab.primop(lambda n: n - 1)
            ab.var.fibm1 = ab.call(fibonacci, [ab.var.nm1])
            ab.var.nm2 = ab.primop(lambda n: n - 2)
            ab.var.fibm2 = ab.call(fibonacci, [ab.var.nm2])
            ab.var.ans = ab.primop(lambda fibm1, fibm2: fibm1 + fibm2)
        with ab.else_():
            ab.var.ans = ab.const(1)
        ab.return_(ab.var.ans)
    return ab.program(main=fibonacci)


def fib(n):
    return 1 if n <= 1 else fib(n - 1) + fib(n - 2)


def test_fibonacci_in_tfp_style_through_tfp_pipeline():
    n = np.array([0, 1, 5, 8, 3], dtype=np.int64)
    got = run_like_tfp(fibonacci_program(), [n], NumpyBackend())
    assert got.tolist() == [fib(int(v)) for v in n]


def test_fibonacci_in_tfp_style_on_tensorflow(tf):
    from autobatch.backends.tf import TensorFlowBackend
    n = np.array([2, 6, 7], dtype=np.int32)
    got = run_like_tfp(fibonacci_program(), [n], TensorFlowBackend("eager"))
    assert np.asarray(got).tolist() == [fib(int(v)) for v in n]


def test_params_and_vars_get_unique_names():
    program = fibonacci_program()
    fn = program.main_function()
    assert len(fn.params) == 1 and fn.params[0].startswith("n_")
    assert all("_" in v for v in fn.variables())


def even_odd_program():
    """Mutual recursion with a forward declaration."""
    ab = dsl.ProgramBuilder()
    odd = ab.declare_function("odd", type_inference=lambda types: [types[0]])
    with ab.function("even", type_inference=lambda types: [types[0]]) as even:
        ab.param("n")
        ab.var.zero = ab.primop(lambda n: n == 0)
        with ab.if_(ab.var.zero):
            ab.var.ans = ab.const(True)
        with ab.else_():
            ab.var.m = ab.primop(lambda n: n - 1)
            ab.var.ans = ab.call(odd, [ab.var.m])
        ab.return_(ab.var.ans)
    with ab.define_function(odd):
        ab.param("n")
        ab.var.zero = ab.primop(lambda n: n == 0)
        with ab.if_(ab.var.zero):
            ab.var.ans = ab.const(False)
        with ab.else_():
            ab.var.m = ab.primop(lambda n: n - 1)
            ab.var.ans = ab.call(even, [ab.var.m])
        ab.return_(ab.var.ans)
    return ab.program(main=even)


def test_declare_and_define_function_for_mutual_recursion():
    n = np.array([0, 1, 4, 7])
    got = run_like_tfp(even_odd_program(), [n], NumpyBackend())
    assert got.tolist() == [True, False, True, False]


def test_pattern_assignment_locals_and_multi_value_calls():
    ab = dsl.ProgramBuilder()
    with ab.function("divmod_") as divmod_:
        x, y = ab.param("x"), ab.param("y")
        q, r = ab.locals_(2, "out")
        ab.primop(lambda x, y: (x // y, x % y), vars_in=[x, y], vars_out=[q, r])
        ab.return_((q, r))
    with ab.function("main") as main:
        ab.param("a")
        ab.var.seven = ab.const(7)
        ab((ab.var.quot, ab.var.rem)).pattern = ab.call(divmod_, [ab.var.a, ab.var.seven])
        ab((ab.var.two, ab.var.three)).pattern = ab.const((2, 3))
        ab.var.out = ab.primop(lambda quot, rem, two, three: quot * 100 * two + rem * three)
        ab.return_(ab.var.out)
    program = ab.program(main)
    a = np.array([0, 8, 50, 13])
    want = (a // 7) * 200 + (a % 7) * 3
    assert run_like_tfp(program, [a], NumpyBackend()).tolist() == want.tolist()


def test_an_instruction_bound_twice_is_refused():
    ab = dsl.ProgramBuilder()
    with pytest.raises(ValueError, match="either"):     # ProgramError is a ValueError
        with ab.function("f"):
            ab.param("n")
            ab.var.m = ab.primop(lambda n: n + 1, vars_out="m")
    ab = dsl.ProgramBuilder()
    g = ab.declare_function("g")
    with ab.function("main") as main:
        ab.param("n")
        ab.var.m = ab.call(g, [ab.var.n])
        ab.return_(ab.var.m)
    with pytest.raises(ProgramError, match="never defined"):
        ab.program(main)


def nested_pattern_program():
    """Unnamed locals bound through nested patterns, a declared nested return type."""
    ab = dsl.ProgramBuilder()
    i64 = inst.TensorType(np.int64, ())

    with ab.function("nested", type_inference=lambda _: ((i64, i64), i64, (i64, i64))) as f:
        ab.param("unused")
        one, three, five = ab.locals_(3)
        ab((one, (five, three))).pattern = ab.primop(lambda: (1, (2, 3)))
        ab(((ab.var.four, five), ab.var.six)).pattern = ab.primop(lambda: ((4, 5), 6))
        ab.return_(((one, three), ab.var.four, (five, ab.var.six)))
    return ab.program(main=f)


def test_nested_patterns_and_constants_broadcast_to_the_batch():
    got = run_like_tfp(nested_pattern_program(), [np.array([7, 7, 7])], NumpyBackend())
    flat = [np.asarray(v).tolist() for v in inst.pattern_leaves(got)]
    assert flat == [[1] * 3, [3] * 3, [4] * 3, [5] * 3, [6] * 3]


def test_tfp_pipeline_with_tensors_and_the_default_tensorflow_backend(tf):
    from autobatch.backends.tf import TensorFlowBackend
    backend = TensorFlowBackend()
    n = tf.constant([5, 6, 8, 9], dtype=tf.int32)
    got = run_like_tfp(fibonacci_program(), [n], backend)
    assert got.numpy().tolist() == [8, 13, 34, 55]
    got = run_like_tfp(even_odd_program(), [n], backend)
    assert np.asarray(got).tolist() == [False, True, True, False]
    got = run_like_tfp(nested_pattern_program(), [tf.constant([1, 1], tf.int64)], backend)
    assert [np.asarray(v).tolist() for v in inst.pattern_leaves(got)][2] == [4, 4]
