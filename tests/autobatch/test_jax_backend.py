"""The JAX backend (:mod:`autobatch.backends.jax`): call-free programs traced
into one jitted XLA loop over masked lanes, against the one-example
reference: the example programs, random call-free programs (nested if/else,
while loops, break, continue, early returns, tuple-typed variables), batch
1, empty batches, broadcast arguments, loops no lane enters; the Context
picks it; programs with calls are refused with a clear error."""
import numpy as np
import pytest
from conftest import need
from hypothesis import given, settings, strategies as st

import autobatch
from autobatch import examples, reference
from autobatch.errors import ProgramError
from autobatch.pipeline import argument_types, compile_program

from test_fused_engine import BINARY, _Generator, _same

#: The random programs' primops that use operators only (``np.maximum``
#: would turn a traced array into a NumPy one, which JAX refuses).
OPERATORS = [f for f in BINARY if "maximum" not in f.__code__.co_names]


@pytest.fixture(scope="module")
def backend():
    need("jax")
    from autobatch.backends.jax import JaxBackend
    return JaxBackend()


def _run(program, args, backend):
    compiled = compile_program(program, argument_types(args, backend), backend)
    assert compiled.engine(backend) == "compiled"
    return compiled.runner(backend).run(args)


def _check(program, args, backend):
    got = _run(program, args, backend)
    assert _same(got, reference.run_batch(program, args, max_stack_depth=4))
    return got


@pytest.mark.parametrize("batch", [1, 2, 9, 300])
def test_collatz_matches_the_reference(backend, batch):
    n = np.random.default_rng(batch).integers(1, 300, batch)
    n[0] = 1  # never enters the loop
    got = _check(examples.collatz(), [n], backend)
    assert got.tolist() == [examples.collatz_python(int(v)) for v in n]


@pytest.mark.parametrize("batch", [1, 5, 200])
def test_gcd_on_a_tuple_variable_matches_the_reference(backend, batch):
    rng = np.random.default_rng(batch)
    a, b = rng.integers(0, 1000, batch), rng.integers(0, 1000, batch)
    b[0] = 0  # never iterates (and would divide by zero in the body)
    _check(examples.gcd_pairs(), [(a, b)], backend)


def test_no_lane_enters_the_loop_and_empty_batches(backend):
    assert _check(examples.collatz(), [np.ones(4, np.int64)], backend).tolist() == [0] * 4
    got = _run(examples.collatz(), [np.zeros(0, np.int64)], backend)
    assert got.shape == (0,) and got.dtype == np.int64


def test_a_broadcast_scalar_argument(backend):
    assert _run(examples.collatz(), [np.int64(27)], backend).tolist() == \
        [examples.collatz_python(27)]


def test_programs_with_calls_are_refused_by_name(backend):
    with pytest.raises(ProgramError, match="calls 'fib'.*NumpyBackend"):
        _run(examples.fibonacci(), [np.arange(4)], backend)


def test_the_context_runs_a_decorated_loop_on_jax(backend):
    ctx = autobatch.Context()

    @ctx.batch()
    def steps_to_one(n):
        count = 0
        while n != 1:
            if n % 2 == 0:
                n = n // 2
            else:
                n = 3 * n + 1
            count = count + 1
            if count >= 60:
                return -count
        return count

    n = np.arange(1, 200)
    want = [steps_to_one.python(v) for v in n.tolist()]
    assert steps_to_one(n, backend=backend).tolist() == want
    assert steps_to_one(n + 0, backend=backend).tolist() == want  # cached: same result


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 40]))
def test_random_call_free_programs_match_the_reference(backend, seed, batch):
    program = _Generator(seed, OPERATORS).build()
    rng = np.random.default_rng(seed)
    args = [rng.integers(0, 1000, batch), rng.integers(0, 1000, batch)]
    _check(program, args, backend)


def test_loops_left_by_their_condition_and_by_break_to_the_same_block(backend):
    """A ``while`` left by its condition (frozen lanes, the head rerun after
    the loop) and by ``break`` (a collector) into one exit block, nested in
    an outer loop, with a value no iteration writes (``limit``)."""
    from autobatch.dsl import ProgramBuilder
    ab = ProgramBuilder()
    with ab.function("f", params=["n", "limit"]):
        ab.primop(lambda n: n * 0, "total")
        ab.primop(lambda n: n * 0, "outer")
        with ab.while_(lambda outer: outer < 3):
            ab.primop(lambda n, outer: n + outer, "m")
            with ab.while_(lambda m: m > 1):
                ab.primop(lambda m: m // 2 + (m % 3), "m")
                ab.primop(lambda total: total + 1, "total")
                ab.primop(lambda total, limit: total > limit, "over")
                with ab.if_("over"):
                    ab.break_()
            ab.primop(lambda total, m: total + m, "total")
            ab.primop(lambda outer: outer + 1, "outer")
        ab.return_(("total", "outer"))
    program = ab.program(main="f")
    rng = np.random.default_rng(3)
    n = rng.integers(0, 200, 64)
    limit = rng.integers(0, 30, 64)
    _check(program, [n, limit], backend)


def test_unrolled_loops_and_the_argument_fast_path(backend):
    from autobatch.backends.jax import JaxBackend
    unrolled = JaxBackend(unroll=3)
    assert unrolled.cache_key() != backend.cache_key()
    with pytest.raises(ValueError, match="unroll"):
        JaxBackend(unroll=0)
    rng = np.random.default_rng(5)
    n = rng.integers(1, 300, 50)
    _check(examples.collatz(), [n], unrolled)
    a, b = rng.integers(0, 1000, 30), rng.integers(0, 1000, 30)
    want = reference.run_batch(examples.gcd_pairs(), [(a, b)], max_stack_depth=4)
    # a list of arrays (fast path); a JAX array and a broadcast scalar (general path)
    import jax.numpy as jnp
    for args in ([[a, b]], [(jnp.asarray(a), b)], [(a, np.int64(7))]):
        got = _run(examples.gcd_pairs(), args, unrolled)
        ref = reference.run_batch(examples.gcd_pairs(), args, max_stack_depth=4)
        assert _same(got, ref)
    assert _same(_run(examples.gcd_pairs(), [(a, b)], unrolled), want)
