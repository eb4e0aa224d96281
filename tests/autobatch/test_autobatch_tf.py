"""The TensorFlow backend: the frontend's programs eagerly, in tf.function and
with XLA, equal to plain Python; overflow errors in every mode; compiled code
reused across calls (traces counted)."""
import numpy as np
import pytest

import autobatch
from autobatch import examples
from autobatch.errors import StackOverflowError
from autobatch.virtual_machine import VirtualMachine, argument_types, prepare

import test_autobatch_frontend_programs as P

MODES = ["eager", "graph", "xla"]


@pytest.fixture(scope="module")
def tfb(tf):
    """The backend module (imports TensorFlow)."""
    from autobatch.backends import tf as tf_backend
    return tf_backend


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert np.array_equal(np.asarray(got), np.asarray(want)), (got, want)


RNG = np.random.default_rng(7)
FIB_N = RNG.integers(0, 11, 24)
COLLATZ_N = RNG.integers(1, 60, 24)
GCD_AB = (RNG.integers(1, 90, 16), RNG.integers(0, 90, 16))
EVEN_N = RNG.integers(0, 20, 16)


@pytest.mark.parametrize("mode", MODES)
def test_fib_recursion(tfb, mode):
    backend = tfb.TensorFlowBackend(mode)
    got = P.fib(FIB_N, backend=backend, max_stack_depth=11)
    assert got.dtype.name == "int64"
    assert_same(got, P.plain(P.fib, FIB_N))


@pytest.mark.parametrize("mode", MODES)
def test_collatz_loop_with_an_if_else_diamond(tfb, mode):
    got = P.collatz(COLLATZ_N, backend=tfb.TensorFlowBackend(mode))
    assert_same(got, P.plain(P.collatz, COLLATZ_N))


@pytest.mark.parametrize("mode", MODES)
def test_tuple_typed_gcd(tfb, mode):
    got = P.gcd(GCD_AB, backend=tfb.TensorFlowBackend(mode))
    assert_same(got, P.plain(P.gcd, GCD_AB))


@pytest.mark.parametrize("mode", MODES)
def test_mutual_recursion(tfb, mode):
    got = P.is_even(EVEN_N, backend=tfb.TensorFlowBackend(mode), max_stack_depth=2)
    assert_same(got, EVEN_N % 2 == 0)


@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_nuts_shaped_program_bit_for_bit(tfb, mode):
    x = RNG.integers(0, 1009, (12, P.NUTS_SIZE)).astype(np.float64)
    got = P.nuts(x, backend=tfb.TensorFlowBackend(mode), max_stack_depth=8)
    assert_same(got, P.plain(P.nuts, x))


@pytest.mark.parametrize("selection", ["mask", "bucket"])
def test_xla_selections_agree_bit_for_bit(tfb, selection):
    """Buckets pack the threads at a block into a quarter or the whole batch;
    both paths run here (a few threads at the leaf, all at the entry)."""
    x = RNG.integers(0, 1009, (12, P.NUTS_SIZE)).astype(np.float64)
    backend = tfb.TensorFlowBackend("xla", selection=selection)
    assert_same(P.nuts(x, backend=backend, max_stack_depth=8), P.plain(P.nuts, x))
    assert_same(P.fib(FIB_N, backend=backend, max_stack_depth=11), P.plain(P.fib, FIB_N))


def test_auto_buckets_exactly_the_steps_that_touch_vectors(tfb):
    """fib's steps are all scalar (masked under "auto"); the NUTS-shaped
    program's leaf computes on vectors, and calls push them."""
    from autobatch.virtual_machine import _BlockCompiler
    backend = tfb.TensorFlowBackend("xla")

    def flags(name, args):
        vm = VirtualMachine(P.ctx.lowered_for_args(name, args, backend), backend, 8)
        out = []
        for index in range(vm.halt):
            compiler = _BlockCompiler(vm, index)
            compiler.compile()
            out.append(compiler.vector_work)
        return out

    assert not any(flags("fib", [FIB_N]))
    nuts = flags("nuts", [np.zeros((3, P.NUTS_SIZE))])
    assert any(nuts) and not all(nuts)


def test_xla_phases_pack_the_running_threads(tfb, monkeypatch):
    """Once at most an eighth of the threads run, XLA packs them into arrays
    of that size; every result lands back in its own row."""
    monkeypatch.setattr(tfb.TensorFlowBackend, "phase_min_batch", 8)
    n = np.concatenate([np.zeros(30, np.int64), RNG.integers(0, 12, 10)])
    RNG.shuffle(n)
    backend = tfb.TensorFlowBackend("xla")
    lowered = P.ctx.lowered_for_args("fib", [n], backend)
    assert backend.phase_sizes(len(n), lowered) == [5]
    assert_same(P.fib(n, backend=backend, max_stack_depth=13), P.plain(P.fib, n))
    vectors = P.ctx.lowered_for_args("nuts", [np.zeros((40, P.NUTS_SIZE))], backend)
    assert backend.phase_sizes(40, vectors) == []      # buckets instead


def test_xla_overflow_in_a_later_phase_still_raises(tfb, monkeypatch):
    monkeypatch.setattr(tfb.TensorFlowBackend, "phase_min_batch", 8)
    n = np.zeros(40, np.int64)
    n[17] = 9                      # the one thread left; too deep for 6 frames
    with pytest.raises(StackOverflowError, match="'fib' exceeds max_stack_depth=6"):
        P.fib(n, backend=tfb.TensorFlowBackend("xla"), max_stack_depth=6)


def test_bucket_sizes_are_a_quarter_and_the_whole_batch(tfb):
    assert tfb.bucket_sizes(1000) == [250, 1000]
    assert tfb.bucket_sizes(1001) == [251, 1001]   # rounded up: a quarter fits
    assert tfb.bucket_sizes(3) == [1, 3]
    assert tfb.bucket_sizes(1) == [1]


def test_masked_selection_in_graph_mode_and_for_range(tfb):
    n = RNG.integers(0, 15, 20)
    backend = tfb.TensorFlowBackend("graph", selection="mask")
    assert_same(P.sum_of_squares(n, backend=backend), P.plain(P.sum_of_squares, n))
    assert_same(P.fib(FIB_N, backend=backend, max_stack_depth=11), P.plain(P.fib, FIB_N))


@pytest.mark.parametrize("mode", MODES)
def test_stack_overflow_raises_in_every_mode(tfb, mode):
    with pytest.raises(StackOverflowError, match="'fib' exceeds max_stack_depth=4"):
        P.fib(np.array([2, 9, 3]), backend=tfb.TensorFlowBackend(mode), max_stack_depth=4)


def test_second_call_does_not_trace_again(tfb, tf):
    ctx = autobatch.Context()

    @ctx.batch()
    def halve_until_odd(n):
        steps = 0
        while n % 2 == 0 and n > 0:
            n = n // 2
            steps += 1
        return steps

    n = np.arange(12)
    for mode in ("graph", "xla"):
        backend = tfb.TensorFlowBackend(mode)
        before = backend.trace_count
        assert_same(halve_until_odd(n, backend=backend), halve_until_odd.per_example(n))
        assert backend.trace_count - before == 1, mode
        halve_until_odd(n + 1, backend=backend)
        halve_until_odd(n, backend=tfb.TensorFlowBackend(mode))  # an equal backend
        assert backend.trace_count - before == 1, mode
        assert ctx.stats.lowerings == (1 if mode == "graph" else 2)
    # Eager mode: each block is one graph, traced once.
    cache = {}
    halve_until_odd(n, backend=tfb.TensorFlowBackend("eager"), block_code_cache=cache)
    blocks = [f for f in cache.values() if hasattr(f, "tracing_count")]
    assert blocks
    assert {f.tracing_count for f in blocks} == {1}
    halve_until_odd(n + 1, backend=tfb.TensorFlowBackend("eager"), block_code_cache=cache)
    assert {f.tracing_count for f in blocks} == {1}


def test_stackless_runs_eagerly_on_tensorflow(tfb):
    backend = tfb.TensorFlowBackend("graph")
    n = np.array([0, 3, 6, 1, 7])
    assert_same(P.fib(n, backend=backend, stackless=True), P.plain(P.fib, n))
    ab = (GCD_AB[0][:5], GCD_AB[1][:5])
    assert_same(P.gcd(ab, backend=backend, stackless=True), P.plain(P.gcd, ab))


def test_called_inside_a_users_tf_function(tfb, tf):
    backend = tfb.TensorFlowBackend("eager", compile_blocks=False)

    @tf.function(autograph=False)
    def twice(n):
        return 2 * P.fib(n, backend=backend, max_stack_depth=11)

    assert_same(twice(tf.constant(FIB_N)), 2 * P.plain(P.fib, FIB_N))


def test_per_example_gives_tensors(tfb, tf):
    out = P.fib.per_example(FIB_N, backend=tfb.TensorFlowBackend())
    assert tf.is_tensor(out)
    assert_same(out, P.plain(P.fib, FIB_N))


def test_dsl_programs_on_the_vm_directly(tfb):
    """The engine's own examples (built with the DSL) on the TF backend."""
    backend = tfb.TensorFlowBackend("graph")
    n = RNG.integers(0, 12, 10)
    lowered = prepare(examples.fibonacci(), argument_types([n], backend), backend)
    vm = VirtualMachine(lowered, backend, max_stack_depth=12)
    assert_same(backend.run_vm(vm, [n]), [examples.fib_python(int(v)) for v in n])
    assert vm.steps > 0


def test_backend_options_are_checked(tfb):
    with pytest.raises(ValueError, match="mode must be one of"):
        tfb.TensorFlowBackend("jit")
    with pytest.raises(ValueError, match="XLA needs static shapes"):
        tfb.TensorFlowBackend("xla", selection="gather")
    with pytest.raises(ValueError, match="needs mode='xla'"):
        tfb.TensorFlowBackend("graph", selection="bucket")
    assert tfb.TensorFlowBackend("xla").selection == "auto"
    assert tfb.TensorFlowBackend("graph") == tfb.TensorFlowBackend("graph")
    assert tfb.TensorFlowBackend("graph") != tfb.TensorFlowBackend("xla")
