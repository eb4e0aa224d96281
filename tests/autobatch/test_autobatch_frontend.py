"""The Python frontend (Context, @ctx.batch) on the NumPy backend: every
accepted construct gives what plain Python gives, every rejected one an error
naming the function, the line and the construct; dry runs; caching."""
import inspect

import numpy as np
import pytest

import autobatch
from autobatch.backends.numpy import MaskedNumpyBackend
from autobatch.errors import ProgramError, StackOverflowError, TypeInferenceError
from autobatch.frontend import FrontendError
from autobatch.instructions import TensorType, Type, VariableAllocation

import test_autobatch_frontend_programs as P

RNG = np.random.default_rng(0)


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert np.array_equal(np.asarray(got), np.asarray(want)), (got, want)


def check(batched, *args, **options):
    """The batched run (VM and stackless) equals the plain function per example."""
    want = P.plain(batched, *args)
    assert_same(batched(*args, **options), want)
    assert_same(batched(*args, stackless=True, **options), want)
    return want


def line_of(function, text):
    """The file line of the first source line of ``function`` containing ``text``."""
    lines, first = inspect.getsourcelines(function)
    for i, line in enumerate(lines):
        if text in line:
            return first + i
    raise AssertionError(f"{text!r} not in the source of {function.__name__}")


# -- the engine issue's programs as Python --------------------------------------------------

def test_fib_example_from_the_issue():
    def fib(n):
        return fib(n - 1) + fib(n - 2) if n > 1 else 1

    got = P.fib(np.arange(20), max_stack_depth=20)
    assert_same(got, [fib(n) for n in range(20)])
    assert got.dtype == np.int64


def test_fib_recursion_over_a_random_batch():
    check(P.fib, RNG.integers(0, 14, 64), max_stack_depth=15)


def test_mutual_recursion_is_even_is_odd():
    n = RNG.integers(0, 30, 50)
    want = check(P.is_even, n, max_stack_depth=2)  # tail calls need no stack
    assert_same(want, n % 2 == 0)
    assert_same(P.is_odd(n), n % 2 == 1)


def test_collatz_while_loop_conditional_expression_and_x_equals_x_plus_1():
    n = RNG.integers(1, 300, 80)
    want = check(P.collatz, n)
    assert want[n == 27][0] == 111 if (n == 27).any() else want.max() > 50


def test_tuple_typed_argument_destructuring_and_tuple_return():
    a, b = RNG.integers(1, 500, 40), RNG.integers(0, 500, 40)
    g, steps = check(P.gcd, (a, b))
    assert_same(g, np.gcd(a, b))
    assert steps.dtype == np.int64


def test_for_range_loop_and_augmented_assignment():
    n = RNG.integers(0, 40, 30)
    want = check(P.sum_of_squares, n)
    assert_same(want, [sum(i * i for i in range(k)) for k in n])


def test_nuts_shaped_program_bit_for_bit():
    x = RNG.integers(0, 1009, (24, P.NUTS_SIZE)).astype(np.float64)
    y, depth = check(P.nuts, x, max_stack_depth=8)
    assert len(set(depth.tolist())) > 1  # threads really take different paths
    assert y.shape == x.shape


def test_scalar_and_size_one_arguments_broadcast():
    assert_same(P.fib(7), [21])
    assert_same(P.gcd((np.array([12, 18, 35]), 6))[0], [6, 6, 1])
    assert_same(P.gcd((np.array([12, 18, 35]), np.array([6])))[0], [6, 6, 1])
    with pytest.raises(ProgramError, match="different batch sizes"):
        P.gcd((np.arange(3), np.arange(4)))


def test_keyword_arguments_when_calling_a_batched_function():
    assert_same(P.fib(n=np.arange(6)), [1, 1, 2, 3, 5, 8])
    with pytest.raises(TypeError, match="unexpected keyword argument 'm'"):
        P.fib(m=np.arange(3))


def test_stack_overflow_names_the_function():
    with pytest.raises(StackOverflowError, match="'fib' exceeds max_stack_depth=3"):
        P.fib(np.array([1, 9]), max_stack_depth=3)


# -- constructs, one by one ----------------------------------------------------------------------

def test_if_elif_else_and_early_returns():
    ctx = autobatch.Context()

    @ctx.batch()
    def sign_class(x):
        if x < -10:
            return -2
        elif x < 0:
            return -1
        elif x == 0:
            return 0
        else:
            if x > 10:
                return 2
        return 1

    check(sign_class, np.arange(-15, 16))


def test_variable_assigned_in_one_branch_only_when_not_read_after():
    ctx = autobatch.Context()

    @ctx.batch()
    def f(x):
        if x > 0:
            tmp = x * 2
            return tmp + 1
        return x

    check(f, np.arange(-3, 4))


def test_conditional_expressions_pure_and_with_calls():
    ctx = autobatch.Context()

    @ctx.batch()
    def fib2(n):
        return fib2(n - 1) + fib2(n - 2) if n > 1 else 1

    @ctx.batch()
    def clipped(x):
        return 0 if x < 0 else (10 if x > 10 else x)

    check(fib2, np.arange(12))
    check(clipped, np.arange(-5, 15))


def test_and_or_not_on_batched_conditions():
    ctx = autobatch.Context()

    @ctx.batch()
    def classify(x, y):
        if x > 0 and y > 0 or not x > -5:
            return 1
        if x == 0 or y == 0 and not x < 0:
            return 2
        return 3

    @ctx.batch()
    def in_range(x):
        return 0 < x <= 5 != x

    @ctx.batch()
    def pick(x, y):
        return (x and y) + 10 * (x or y)  # Python's value semantics, per thread

    x, y = np.meshgrid(np.arange(-6, 4), np.arange(-2, 3))
    check(classify, x.ravel(), y.ravel())
    check(in_range, np.arange(-2, 9))
    check(pick, x.ravel(), y.ravel())


def test_short_circuit_skips_calls_for_threads_python_would_skip():
    ctx = autobatch.Context()

    @ctx.batch()
    def countdown(n):
        # Without short-circuiting, countdown(n - 1) would recurse forever at n <= 0.
        return n <= 0 or countdown(n - 1)

    @ctx.batch()
    def all_positive_below(n):
        return n < 1 or (n > 0 and all_positive_below(n - 1))

    check(countdown, np.arange(-3, 10), max_stack_depth=12)
    check(all_positive_below, np.arange(-3, 10), max_stack_depth=12)


def test_while_loop_with_break_continue_and_a_batched_call_in_the_test():
    ctx = autobatch.Context()

    @ctx.batch()
    def is_small(x):
        return x < 50

    @ctx.batch()
    def odd_sum(n):
        total = 0
        i = 0
        while is_small(total):
            i += 1
            if i % 2 == 0:
                continue
            if i > n:
                break
            total = total + i
        return total, i

    check(odd_sum, np.arange(0, 20))


def test_for_range_with_start_stop_step_and_nested_loops():
    ctx = autobatch.Context()

    @ctx.batch()
    def ranges(n, step):
        a = 0
        for i in range(2, n):
            a += i
        b = 0
        for i in range(n, -3, -2):
            b = b * 2 + i
        c = 0
        for i in range(0, n, step):  # the sign of step is known only at run time
            for j in range(i):
                c += j
        d = 0
        for k in range(3):
            k = k * 100  # does not change the iteration (as in Python)
            d += k
        return a, b, c, d

    n = np.arange(0, 12)
    check(ranges, n, np.where(n % 3 == 0, -1, 2))


def test_chained_and_annotated_assignment_and_swaps():
    ctx = autobatch.Context()

    @ctx.batch()
    def f(x):
        a = b = x + 1
        c: int = a * b
        a, b = b - 1, a
        (p, q), r = (a, b), c
        return p + q + r

    check(f, np.arange(5))


def test_calls_with_keyword_arguments_and_dropped_results():
    ctx = autobatch.Context()

    @ctx.batch()
    def power(base, exponent):
        if exponent == 0:
            return 1
        return base * power(exponent=exponent - 1, base=base)

    @ctx.batch()
    def caller(x):
        power(x, 2)  # a batched call whose value is dropped is allowed
        return power(base=x, exponent=3)

    check(caller, np.arange(-4, 5))


def test_closures_globals_and_ordinary_function_calls_are_primops():
    scale = 3

    def helper(v):
        return np.abs(v) * scale

    ctx = autobatch.Context()

    @ctx.batch()
    def f(x):
        return helper(x) + np.int64(P.NUTS_SIZE)

    check(f, np.arange(-3, 3))


def test_type_inference_callable_may_be_a_lambda_and_is_used():
    ctx = autobatch.Context()

    @ctx.batch(type_inference=lambda types: types[0])
    def forever(n):
        return forever(n)  # no base case: only the lambda gives the type

    compiled = ctx.program_compiled("forever", [TensorType(np.int32)])
    assert compiled.function("forever").return_type == Type(TensorType(np.int32))
    ctx2 = autobatch.Context()

    @ctx2.batch()
    def forever2(n):
        return forever2(n)

    with pytest.raises(TypeInferenceError, match="type_inference"):
        ctx2.program_compiled("forever2", [TensorType(np.int32)])


# -- rejected constructs ---------------------------------------------------------------------------

def _bad_try(x):
    try:
        return x
    except ValueError:
        return x


def _bad_with(x):
    with open("f"):
        return x


def _bad_raise(x):
    if x < 0:
        raise ValueError("negative")
    return x


def _bad_assert(x):
    assert x > 0
    return x


def _bad_def(x):
    def inner(y):
        return y
    return inner(x)


def _bad_import(x):
    import math
    return math.floor(x)


def _bad_global(x):
    global RNG
    return x


def _bad_del(x):
    y = x
    del y
    return x


def _bad_listcomp(x):
    return sum([v for v in x])


def _bad_genexp(x):
    return sum(v for v in x)


def _bad_walrus(x):
    return (y := x + 1) * y


def _bad_is(x):
    if x is None:
        return 0
    return x


def _bad_in(x):
    if x in (1, 2):
        return 0
    return x


def _bad_for_list(x):
    total = 0
    for v in x:
        total += v
    return total


def _bad_for_else(x):
    for i in range(x):
        pass
    else:
        return 1
    return 0


def _bad_while_else(x):
    while x > 0:
        x -= 1
    else:
        return 1
    return 0


def _bad_starred(x):
    a, *rest = x
    return a


def _bad_subscript(x):
    x[0] = 1
    return x


def _bad_attribute(x):
    x.value = 1
    return x


def _bad_bare_return(x):
    if x > 0:
        return
    return x


def _bad_no_return(x):
    if x > 0:
        return x
    x = x + 1


def _bad_maybe_unassigned(x):
    if x > 0:
        y = x
    return y


def _bad_loop_unassigned(x):
    for i in range(x):
        y = i
    return y


def _bad_defaults(x, y=1):
    return x + y


def _bad_varargs(*xs):
    return xs


def _bad_range_step(x):
    for i in range(0, x, 0):
        pass
    return x


def _bad_for_tuple(x):
    for i, j in range(x):
        pass
    return x


def _bad_expression_statement(x):
    print(x)
    return x


def _bad_match(x):
    match x:
        case 1:
            return 1
    return x


REJECTED = [
    (_bad_try, "try:", "a try statement"),
    (_bad_with, "with open", "a with statement"),
    (_bad_raise, "raise ValueError", "a raise statement"),
    (_bad_assert, "assert x", "an assert statement"),
    (_bad_def, "def inner", "a nested function definition"),
    (_bad_import, "import math", "an import statement"),
    (_bad_global, "global RNG", "a global declaration"),
    (_bad_del, "del y", "a del statement"),
    (_bad_listcomp, "[v for v in x]", "a list comprehension"),
    (_bad_genexp, "sum(v for", "a generator expression"),
    (_bad_walrus, ":=", "an assignment expression"),
    (_bad_is, "is None", "an identity test"),
    (_bad_in, "in (1, 2)", "a membership test"),
    (_bad_for_list, "for v in x", "a for loop over x"),
    (_bad_for_else, "for i in range(x)", "a for ... else loop"),
    (_bad_while_else, "while x > 0", "a while ... else loop"),
    (_bad_starred, "*rest", "a starred assignment target"),
    (_bad_subscript, "x[0] = 1", "an assignment to an element (x[0] = ...)"),
    (_bad_attribute, "x.value", "an assignment to an attribute (x.value = ...)"),
    (_bad_bare_return, "return\n", "a return without a value"),
    (_bad_no_return, "x = x + 1", "the end of the function can be reached without a return"),
    (_bad_maybe_unassigned, "return y", "variable 'y' may be used before it is assigned"),
    (_bad_loop_unassigned, "return y", "variable 'y' may be used before it is assigned"),
    (_bad_defaults, "def _bad_defaults", "a default parameter value"),
    (_bad_varargs, "def _bad_varargs", "*args or **kwargs"),
    (_bad_range_step, "range(0, x, 0)", "range() with a step of 0"),
    (_bad_for_tuple, "for i, j", "a for loop with target (i, j)"),
    (_bad_expression_statement, "print(x)", "an expression statement (print(x))"),
    (_bad_match, "match x", "a match statement"),
]


@pytest.mark.parametrize("function, marker, construct", REJECTED,
                         ids=[f.__name__ for f, _, _ in REJECTED])
def test_rejected_construct_names_function_line_and_construct(function, marker, construct):
    ctx = autobatch.Context()
    with pytest.raises(FrontendError) as info:
        ctx.batch()(function)
    err = info.value
    line = line_of(function, marker)
    assert err.function == function.__name__
    assert err.line == line
    assert construct in err.construct
    assert str(err).startswith(f"function {function.__name__!r}, line {line}: {construct}")
    assert isinstance(err, ProgramError)
    assert ctx.function_names() == []  # nothing was registered


def test_errors_for_calls_of_batched_functions():
    ctx = autobatch.Context()

    @ctx.batch()
    def two(a, b):
        return a + b

    def arity(x):
        return two(x, x, x)

    def unknown_keyword(x):
        return two(x, c=x)

    def twice(x):
        return two(x, a=x)

    def missing(x):
        return two(b=x)

    def starred(x):
        return two(*x)

    def in_lambda(x):
        return (lambda v: two(v, v))(x)

    cases = [(arity, "with 3 positional arguments", "does not match: two takes 2"),
             (unknown_keyword, "with keyword 'c'", "has no parameter 'c'"),
             (twice, "giving 'a' twice", "give each argument once"),
             (missing, "without 'a'", "pass every argument"),
             (starred, "with *args or **kwargs", "by position or by name"),
             (in_lambda, "inside a lambda", "call it in the batched function's body")]
    for function, construct, hint in cases:
        with pytest.raises(FrontendError, match="line") as info:
            ctx.batch()(function)
        assert construct in info.value.construct and hint in str(info.value)
        assert info.value.line == line_of(function, "return two" if function is not in_lambda
                                          else "(lambda")


def test_calls_checked_at_first_call_when_the_callee_is_batched_later():
    ctx = autobatch.Context()

    @ctx.batch()
    def early(x):
        return later(x, x)

    @ctx.batch()
    def later(x):
        return x

    with pytest.raises(FrontendError, match="does not match: later takes 1") as info:
        early(np.arange(3))
    assert info.value.line == line_of(early.python, "later(x, x)")


def test_lambdas_and_non_functions_cannot_be_batched():
    ctx = autobatch.Context()
    with pytest.raises(FrontendError, match="a lambda cannot be batched"):
        ctx.batch_uncurried(lambda n: n)
    with pytest.raises(FrontendError, match="pass a plain function"):
        ctx.batch_uncurried(np.abs)


def test_a_name_batched_twice_is_an_error():
    ctx = autobatch.Context()
    ctx.batch()(P.fib.python)
    with pytest.raises(ProgramError, match="'fib' is already batched"):
        ctx.batch()(P.fib.python)


def test_batched_function_called_from_a_primop_is_an_error():
    ctx = autobatch.Context()

    @ctx.batch()
    def inner(x):
        return x + 1

    def helper(x):
        return inner(x)

    @ctx.batch()
    def outer(x):
        return helper(x)

    with pytest.raises(TypeInferenceError, match="was called while a batched program runs"):
        outer(np.arange(3))


def test_primop_failures_point_at_the_users_line():
    ctx = autobatch.Context()

    @ctx.batch()
    def bad(x):
        y = x + 1
        return y.no_such_attribute

    with pytest.raises(TypeInferenceError) as info:
        bad(np.arange(3))
    assert f"(line {line_of(bad.python, 'no_such_attribute')})" in str(info.value)
    assert "no_such_attribute" in str(info.value)


def test_condition_with_more_than_one_value_per_thread_is_explained():
    ctx = autobatch.Context()

    @ctx.batch()
    def vector_test(x):
        if x:
            return 1
        return 0

    with pytest.raises(TypeInferenceError, match="one boolean per thread"):
        vector_test(np.ones((3, 2)))


# -- dry run -------------------------------------------------------------------------------------------

def test_per_example_calls_the_plain_function_per_example():
    calls = []
    ctx = autobatch.Context()

    def record(n):
        calls.append(int(n))
        return n

    @ctx.batch()
    def countdown(n):
        if record(n) > 0:
            return countdown(n - 1)
        return n

    out = countdown.per_example(np.array([2, 0, 3]))
    assert_same(out, [0, 0, 0])
    assert calls == [2, 1, 0, 0, 3, 2, 1, 0]  # one example after another, plainly
    assert ctx.stats.compilations == 0  # nothing was compiled
    assert_same(countdown.per_example(np.int64(4)), [0])


def test_per_example_of_tuples_and_mismatched_batches():
    g, steps = P.gcd.per_example((np.array([12, 7]), np.array([8, 7])))
    assert_same(g, [4, 7])
    assert_same(steps, [2, 1])
    with pytest.raises(ProgramError, match="different batch sizes"):
        P.gcd.per_example((np.arange(2), np.arange(3)))


# -- Context API and caching --------------------------------------------------------------------

def test_context_methods_like_tfps():
    ctx = P.ctx
    assert ctx.function_names()[:3] == ["fib", "is_even", "is_odd"]
    module = ctx.module()
    assert module.function_names() == ctx.function_names()
    program = ctx.program("is_even")
    assert sorted(fn.name for fn in program.functions) == ["is_even", "is_odd"]
    sig = [TensorType(np.int64)]
    compiled = ctx.program_compiled("fib", sig)
    fib_fn = compiled.function("fib")
    assert fib_fn.return_type == Type(TensorType(np.int64))
    assert compiled.pc_alloc == VariableAllocation.FULL
    assert fib_fn.var_alloc["n"] == VariableAllocation.FULL  # live across the first call
    untyped = ctx.program_compiled("fib")
    assert untyped.function("fib").return_type is None
    lowered = ctx.program_lowered("fib", sig)
    assert lowered.inputs == ("fib/n",)
    assert ctx.lowered_for_args("fib", [np.arange(3)]) is lowered
    with pytest.raises(ProgramError, match="no function 'nope'"):
        ctx.program("nope")
    assert "function fib(n)" in str(module)


def test_second_call_compiles_nothing():
    ctx = autobatch.Context()

    @ctx.batch()
    def double(x):
        return x + x

    # On the VM (the masked backend never fuses): lowered once, block code cached.
    vm = MaskedNumpyBackend()
    n = np.arange(5)
    assert_same(double(n, backend=vm), 2 * n)
    first = (ctx.stats.translations, ctx.stats.compilations, ctx.stats.lowerings)
    assert first == (1, 1, 1)
    cached_blocks = len(ctx.block_code_cache)
    assert cached_blocks > 0
    assert_same(double(n + 1, backend=vm), 2 * n + 2)
    assert (ctx.stats.translations, ctx.stats.compilations, ctx.stats.lowerings) == first
    assert len(ctx.block_code_cache) == cached_blocks
    assert ctx.stats.hits >= 1
    double(n.astype(np.int32), backend=vm)  # new argument types: compiled once more
    assert ctx.stats.compilations == 2
    own = {}
    double(n, block_code_cache=own, backend=vm)
    assert own and len(ctx.block_code_cache) == cached_blocks * 2
    # The fused loop (NumPy): compiled once per backend and types, never lowered.
    assert_same(double(n), 2 * n)
    assert_same(double(n + 1), 2 * n + 2)
    assert (ctx.stats.compilations, ctx.stats.lowerings) == (3, 2)


def test_batching_a_new_function_invalidates_the_caches():
    ctx = autobatch.Context()

    @ctx.batch()
    def g(x):
        return h(x) + 1  # h is not batched yet: an ordinary call (a primop)

    def h(x):
        return x * 10

    assert_same(g(np.arange(3)), [1, 11, 21])

    @ctx.batch()
    def h(x):  # noqa: F811 - now batched: g calls it as a batched function
        return x * 100

    assert_same(g(np.arange(3)), [1, 101, 201])
    assert [f.name for f in ctx.program("g").functions] == ["g", "h"]
