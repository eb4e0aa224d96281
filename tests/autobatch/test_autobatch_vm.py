"""The batched VM and the stackless executor against plain Python and the
one-example reference interpreter."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from autobatch import examples, reference, stackless
from autobatch.allocation_strategy import optimize
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.errors import NullVariableError, ProgramError, StackOverflowError
from autobatch.instructions import TensorType, VariableAllocation
from autobatch.lowering import lower
from autobatch.type_inference import infer_types
from autobatch.virtual_machine import VirtualMachine, execute, prepare

INT = TensorType(np.int64)


#: The compact NumPy backend, and the masking one that computes on every
#: thread (the semantics of a TensorFlow/XLA backend).
BACKENDS = [NumpyBackend(), MaskedNumpyBackend()]


def run_all(program, args, max_stack_depth=30):
    """VM and stackless results on every backend, and the reference's."""
    out = [reference.run_batch(program, args, max_stack_depth=max_stack_depth)]
    for backend in BACKENDS:
        out.append(execute(program, args, backend, max_stack_depth=max_stack_depth))
        out.append(stackless.execute(program, args, backend, max_stack_depth=max_stack_depth))
    return out


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert np.array_equal(np.asarray(got), np.asarray(want)), (got, want)


def test_fib_over_a_batch_equals_python():
    n = np.random.default_rng(0).integers(0, 16, size=64)
    want = np.array([examples.fib_python(int(v)) for v in n])
    for got in run_all(examples.fibonacci(), [n]):
        assert_same(got, want)


@pytest.mark.parametrize("tail_calls", [True, False])
def test_mutual_recursion_even_odd_equals_python(tail_calls):
    n = np.random.default_rng(1).integers(0, 25, size=50)
    want = np.array([examples.is_even_python(int(v)) for v in n])
    for got in run_all(examples.even_odd(tail_calls), [n]):
        assert_same(got, want)


def test_collatz_loop_equals_python():
    n = np.random.default_rng(2).integers(1, 300, size=80)
    want = np.array([examples.collatz_python(int(v)) for v in n])
    for got in run_all(examples.collatz(), [n]):
        assert_same(got, want)


# The masking backend's stackless run applies `a % b` to finished threads too
# (b == 0 there); their results are discarded.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_tuple_typed_arguments_variables_and_results():
    rng = np.random.default_rng(3)
    a, b = rng.integers(1, 500, 40), rng.integers(0, 500, 40)
    pairs = [examples.gcd_python((int(x), int(y))) for x, y in zip(a, b, strict=True)]
    want = (np.array([g for g, _ in pairs]), np.array([s for _, s in pairs]))
    for got in run_all(examples.gcd_pairs(), [(a, b)]):
        assert_same(got, want)


def test_nuts_shaped_program_equals_python_bit_for_bit():
    matrix, weights = examples.nuts_problem(size=32, seed=4)
    x = np.random.default_rng(4).integers(0, 1009, (30, 32)).astype(np.float64)
    pairs = [examples.nuts_python(row, matrix, weights, max_depth=5) for row in x]
    want = (np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    assert len(set(want[1].tolist())) > 2  # threads really take different paths
    program = examples.nuts_shaped(matrix, weights, max_depth=5)
    for got in run_all(program, [x]):
        assert_same(got, want)


def test_results_do_not_depend_on_the_other_threads():
    n = np.random.default_rng(5).integers(0, 14, size=40)
    perm = np.random.default_rng(6).permutation(40)
    program = examples.fibonacci()
    assert_same(execute(program, [n])[perm], execute(program, [n[perm]]))
    assert_same(execute(program, [n[:1]]), [examples.fib_python(int(n[0]))])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 2000), min_size=1, max_size=30))
def test_collatz_property(values):
    n = np.array(values, dtype=np.int64)
    want = [examples.collatz_python(v) for v in values]
    assert_same(execute(examples.collatz(), [n]), want)


def test_scalars_and_size_one_arguments_broadcast():
    a = np.array([12, 18, 35, 7])
    got = execute(examples.gcd_pairs(), [(a, np.int64(6))])
    assert_same(got[0], [6, 6, 1, 1])
    got1 = execute(examples.gcd_pairs(), [(a, np.array([6]))])
    assert_same(got1[0], [6, 6, 1, 1])
    with pytest.raises(ProgramError, match="different batch sizes"):
        execute(examples.gcd_pairs(), [(a, np.arange(3))])


def test_empty_batch():
    out = execute(examples.fibonacci(), [np.zeros(0, np.int64)])
    assert out.shape == (0,)


def test_inputs_are_not_modified():
    n = np.arange(10)
    execute(examples.collatz(), [n + 1])
    x = np.arange(1, 11)
    before = x.copy()
    execute(examples.collatz(), [x])
    assert np.array_equal(x, before)


def test_null_variable_raises_on_read():
    program = optimize(infer_types(examples.collatz(), [INT]))
    collatz = program.function("collatz")
    collatz.var_alloc["steps"] = VariableAllocation.NULL  # a wrong map, by hand
    with pytest.raises(NullVariableError, match="'collatz/steps' is allocated NULL"):
        VirtualMachine(lower(program), NumpyBackend()).run([np.array([3, 4])])


def test_null_variable_writes_are_dropped():
    lowered = prepare(examples.fibonacci(), [INT])
    vm = VirtualMachine(lowered, NumpyBackend())
    # `one`, `big`... are TEMPORARY: no storage at all; only FULL/REGISTER have any.
    state, _ = vm.initial_state([np.arange(3)])
    stored = {k.split("#")[0] for k in state if "#" in k}
    assert stored == {"fib/n", "fib/left", "<ret:int64[]>"}


@pytest.mark.parametrize("n", [6, 9])
def test_stack_overflow_is_a_clear_error(n):
    # fib(n) has n - 1 calls pending at its deepest: depth n - 1 suffices.
    args = [np.array([1, n, 2])]
    program = examples.fibonacci()
    for backend in BACKENDS:
        for executor in (execute, stackless.execute):
            assert_same(executor(program, args, backend, max_stack_depth=n - 1),
                        [1, examples.fib_python(n), 2])
            with pytest.raises(StackOverflowError, match=f"function 'fib' exceeds "
                                                         f"max_stack_depth={n - 2}") as info:
                executor(program, args, backend, max_stack_depth=n - 2)
            assert info.value.function == "fib" and info.value.max_stack_depth == n - 2
    with pytest.raises(StackOverflowError):
        reference.run_batch(program, args, max_stack_depth=n - 2)


def test_tail_calls_run_in_constant_stack():
    n = np.array([0, 100, 257])
    got = execute(examples.even_odd(tail_calls=True), [n], max_stack_depth=1)
    assert_same(got, [True, True, False])


def test_push_and_pop_are_linear_in_the_batch():
    """A [depth*batch, batch] mask per push (TFP's NumPy VM) would need
    gigabytes here; frames indexed per thread need a few arrays of the batch."""
    n = np.random.default_rng(7).integers(0, 8, size=20_000)
    lowered = prepare(examples.fibonacci(), [INT])
    tracemalloc.start()
    try:
        out = VirtualMachine(lowered, NumpyBackend(), max_stack_depth=10).run([n])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_same(out, [examples.fib_python(int(v)) for v in n])
    # stacks: 3 x (11 frames x 20,000 x 8 bytes) = 5.3 MB, plus registers
    assert peak < 16 * 2**20, peak


def test_block_code_cache_reuses_compiled_blocks():
    lowered = prepare(examples.fibonacci(), [INT])
    cache = {}
    first = VirtualMachine(lowered, NumpyBackend(), block_code_cache=cache)
    backend = first.backend
    second = VirtualMachine(lowered, backend, block_code_cache=cache)
    assert len(cache) == len(lowered.blocks)
    assert second.block_functions == first.block_functions
    assert "B.select(state['pc'], 0)" in first.block_source(0)
    assert_same(second.run([np.arange(8)]), [examples.fib_python(i) for i in range(8)])
    assert second.steps > 0


def test_steps_count_blocks_run():
    vm = VirtualMachine(prepare(examples.collatz(), [INT]), NumpyBackend())
    vm.run([np.array([1])])  # entry, head (fused jumps), exit
    few = vm.steps
    vm.run([np.array([27])])  # 111 Collatz steps
    assert few <= 3 and vm.steps > 111


def _branchy_program():
    """if without else, else without then, a tuple written in one arm, a
    constant condition, a value used only inside an arm, nested ifs."""
    ab = ProgramBuilder()
    with ab.function("f", params=["n"]):
        ab.primop(lambda n: (n, n * 0), "acc")
        ab.const(True, "always")
        with ab.while_(lambda n: n > 0):
            ab.primop(lambda n: n % 3 == 0, "three")
            with ab.if_("three"):                      # no else
                ab.primop(lambda acc, n: (acc[0] + n, acc[1] + 1), "acc")
            ab.primop(lambda n: n % 2 == 1, "odd")
            with ab.if_("odd"):                        # empty then, code in else
                pass
            with ab.else_():
                ab.primop(lambda n: n * 10, "scratch")  # only used in this arm
                ab.primop(lambda acc, scratch: (acc[0] - scratch, acc[1]), "acc")
            with ab.if_("always"):
                ab.primop(lambda n: n - 1, "n")
            with ab.if_("odd"):
                ab.primop(lambda n: n > 4, "big")
                with ab.if_("big"):
                    ab.primop(lambda n: n - 1, "n")
        ab.return_("acc")
    return ab.program("f")


def _branchy_python(n):
    total, count = n, 0
    while n > 0:
        if n % 3 == 0:
            total, count = total + n, count + 1
        odd = n % 2 == 1
        if not odd:
            total -= n * 10
        n -= 1
        if odd and n > 4:
            n -= 1
    return total, count


def test_if_else_regions_run_in_one_step_with_the_same_results():
    program = _branchy_program()
    n = np.random.default_rng(8).integers(0, 40, size=60)
    pairs = [_branchy_python(int(v)) for v in n]
    want = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    for got in run_all(program, [n]):
        assert_same(got, want)


def test_collatz_runs_one_step_per_iteration():
    vm = VirtualMachine(prepare(examples.collatz(), [INT]), NumpyBackend())
    assert_same(vm.run([np.array([27])]), [111])
    assert vm.steps <= 111 + 3
    source = vm.block_source(vm.index["collatz/loop1.body"])
    assert "B.split(sel" in source and "B.merge(" in source


class _CountingBackend(NumpyBackend):
    """The NumPy backend, counting how often the VM compacted its arrays."""

    def __init__(self):
        super().__init__()
        self.compactions = 0

    def running_threads(self, pc, halt):
        running, count = super().running_threads(pc, halt)
        self.compactions += count * 2 <= pc.shape[0]
        return running, count


@pytest.mark.parametrize("program, make_args, python", [
    (examples.fibonacci(), lambda rng: [rng.integers(0, 15, 700)], examples.fib_python),
    (examples.even_odd(tail_calls=True),  # a few threads run long
     lambda rng: [np.where(rng.random(700) < 0.1, 301, rng.integers(0, 30, 700))],
     examples.is_even_python),
])
def test_halted_threads_are_compacted_away_without_changing_results(program, make_args,
                                                                    python):
    args = make_args(np.random.default_rng(9))
    backend = _CountingBackend()
    got = execute(program, args, backend, max_stack_depth=20)
    assert backend.compactions >= 1
    assert_same(got, [python(int(v)) for v in args[0]])
