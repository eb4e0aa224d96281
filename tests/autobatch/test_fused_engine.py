"""The fused-loop engine (:mod:`autobatch.fused`) against the one-example
reference and the VM: the example programs without calls, random call-free
programs (nested if/else with and without else, while loops, loops left by
break, continue and early returns, tuple-typed variables, vectors), batch 1,
empty batches, loops no lane enters, and arms whose primops raise on the
other side's lanes.  Programs with calls are left to the VM."""
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import autobatch
from autobatch import examples, reference
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.fused import fuse
from autobatch.pipeline import argument_types, compile_program
from autobatch.virtual_machine import execute

BACKEND = NumpyBackend(native=False)  # these tests are about the fused loop


def _leaves(value):
    return list(value) if isinstance(value, tuple) else [value]


def _same(got, want):
    got, want = _leaves(got), _leaves(want)
    return len(got) == len(want) and all(
        np.asarray(g).dtype == np.asarray(w).dtype and np.array_equal(g, w)
        for g, w in zip(got, want, strict=True))


def _fused(program, args):
    compiled = compile_program(program, argument_types(args, BACKEND), BACKEND)
    assert compiled.engine(BACKEND) == "fused"
    return compiled.fused


def _check(program, args, depth=4, masked=True):
    fused = _fused(program, args)
    got = fused.run(args)
    assert _same(got, reference.run_batch(program, args, max_stack_depth=depth)), \
        fused.source
    assert _same(got, execute(program, args, BACKEND, max_stack_depth=depth))
    if masked:  # the masked VM runs primops on every thread, as XLA does
        assert _same(got, execute(program, args, MaskedNumpyBackend(),
                                  max_stack_depth=depth))
    return got


# -- the example programs ------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 7, 300])
def test_collatz_matches_the_reference(batch):
    rng = np.random.default_rng(batch)
    n = rng.integers(1, 200, batch)
    n[0] = 1  # a lane that never enters the loop
    got = _check(examples.collatz(), [n])
    assert got.tolist() == [examples.collatz_python(int(v)) for v in n]


def test_collatz_where_no_lane_enters_the_loop():
    got = _check(examples.collatz(), [np.ones(5, np.int64)])
    assert got.tolist() == [0] * 5


@pytest.mark.parametrize("batch", [1, 3, 257])
def test_gcd_on_a_tuple_variable_matches_the_reference(batch):
    rng = np.random.default_rng(batch)
    a, b = rng.integers(0, 500, batch), rng.integers(0, 500, batch)
    b[0] = 0  # never iterates
    got = _check(examples.gcd_pairs(), [(a, b)])
    assert [tuple(map(int, p)) for p in zip(*got)] == \
        [examples.gcd_python((int(x), int(y))) for x, y in zip(a, b, strict=True)]


def test_an_empty_batch_gives_empty_results_of_the_right_dtype():
    program = examples.collatz()
    args = [np.zeros(0, np.int32)]
    got = _fused(program, args).run(args)
    want = execute(program, args, BACKEND, max_stack_depth=2)
    assert got.shape == want.shape == (0,) and got.dtype == want.dtype


def test_a_broadcast_scalar_argument_runs_one_lane():
    program = examples.collatz()
    got = _fused(program, [np.int64(27)]).run([np.int64(27)])
    assert got.tolist() == [examples.collatz_python(27)]


@pytest.mark.parametrize("program", [examples.fibonacci(), examples.even_odd(True),
                                     examples.even_odd(False)])
def test_programs_with_calls_stay_on_the_vm(program):
    args = [np.arange(5)]
    compiled = compile_program(program, argument_types(args, BACKEND), BACKEND)
    assert compiled.fused is None and compiled.engine(BACKEND) == "vm"


def test_masked_backend_and_tensorflow_like_backends_keep_the_vm():
    args = [np.arange(1, 6)]
    compiled = compile_program(examples.collatz(), argument_types(args, BACKEND), BACKEND)
    assert compiled.engine(MaskedNumpyBackend()) == "vm"
    assert compiled.engine(BACKEND) == "fused"


def test_an_arm_that_raises_on_the_other_sides_lanes_is_redone_by_splitting():
    table = np.arange(10) * 7
    ab = ProgramBuilder()
    with ab.function("f", params=["i"]):
        ab.primop(lambda i: i < 10, "inside")
        with ab.if_("inside"):
            ab.primop(lambda i: table[i], "r")         # IndexError for i >= 10
        with ab.else_():
            ab.primop(lambda i: i * 0 - 1, "r")
        ab.return_("r")
    program = ab.program(main="f")
    args = [np.array([0, 3, 12, 9, 40, 5])]
    got = _check(program, args, masked=False)
    assert got.tolist() == [0, 21, -1, 63, -1, 35]


def test_an_error_on_a_lane_that_takes_the_arm_is_raised():
    table = np.arange(10)
    ab = ProgramBuilder()
    with ab.function("f", params=["i"]):
        ab.primop(lambda i: i < 100, "inside")
        with ab.if_("inside"):
            ab.primop(lambda i: table[i], "r")
        with ab.else_():
            ab.primop(lambda i: i, "r")
        ab.return_("r")
    program = ab.program(main="f")
    args = [np.array([1, 50])]
    with pytest.raises(IndexError):
        _fused(program, args).run(args)


def test_vector_valued_loops_match_the_reference():
    matrix = np.random.default_rng(0).integers(-1, 2, (4, 4)).astype(np.float64)
    ab = ProgramBuilder()
    with ab.function("f", params=["x", "k"]):
        with ab.while_(lambda k: k > 0):
            ab.primop(lambda x: np.mod(x @ matrix, 101.0), "x")
            ab.primop(lambda x: x.sum(axis=-1) > 150, "big")
            with ab.if_("big"):
                ab.primop(lambda x: x - 1.0, "x")
            ab.primop(lambda k: k - 1, "k")
        ab.return_(("x", "k"))
    program = ab.program(main="f")
    rng = np.random.default_rng(1)
    _check(program, [rng.integers(0, 100, (50, 4)).astype(np.float64),
                     rng.integers(0, 6, 50)])


# -- the frontend picks the engine -------------------------------------------------------------

def test_a_decorated_loop_runs_fused_and_agrees_with_plain_python():
    ctx = autobatch.Context()

    @ctx.batch()
    def steps_to_one(n):
        count = 0
        while True:
            if n == 1:
                return count
            if n % 2 == 0:
                n = n // 2
            else:
                n = 3 * n + 1
            count = count + 1
            if count >= 50:
                break
        return -count

    n = np.arange(1, 120)
    got = steps_to_one(n)
    want = []
    for v in n.tolist():
        want.append(steps_to_one.python(v))
    assert got.tolist() == want
    sig = argument_types([n], BACKEND)
    assert ctx._compiled_for("steps_to_one", sig, None).engine(BACKEND) == "fused"
    vm = steps_to_one(n, backend=MaskedNumpyBackend())
    assert vm.tolist() == want


# -- random call-free programs ---------------------------------------------------------------------

BINARY = [lambda x, y: (x + y) % 1000, lambda x, y: (x * 3 + y) % 1000,
          lambda x, y: np.maximum(x, y), lambda x, y: (x - y) % 997]
CONDITIONS = [lambda x: x % 2 == 0, lambda x: x > 500, lambda x: x % 3 == 1]


class _Generator:
    """One random function ``f(n, a)`` without calls."""

    def __init__(self, seed, binary=BINARY):
        self.binary = binary
        self.rng = random.Random(seed)
        self.ab = ProgramBuilder()
        self.count = 0
        self.counters = {"n"}  # never written by a random statement

    def fresh(self):
        self.count += 1
        return f"v{self.count}"

    def build(self):
        with self.ab.function("f", params=["n", "a"]):
            defined = ["n", "a"]
            self.block(defined, depth=0, loops=0)
            self.finish(defined)
        return self.ab.program("f")

    def finish(self, defined):
        if self.rng.random() < 0.4:
            pair = self.fresh()
            x, y = self.rng.choice(defined), self.rng.choice(defined)
            self.ab.primop(lambda x, y: (x, y), pair, vars_in=[x, y])   # tuple-typed
            first = self.fresh()
            self.ab.primop(lambda p: p[0] + p[1] % 7, first, vars_in=[pair])
            self.ab.return_((first, self.rng.choice(defined)))
        else:
            self.ab.return_((self.rng.choice(defined), self.rng.choice(defined)))

    def block(self, defined, depth, loops):
        for _ in range(self.rng.randint(1, 4)):
            if self.statement(defined, depth, loops):
                return True  # the block ended (return, break, continue)
        return False

    def statement(self, defined, depth, loops):
        rng, ab = self.rng, self.ab
        kind = rng.random()
        if kind < 0.35 or depth >= 3:
            target = rng.choice([v for v in defined if v not in self.counters]
                                + [self.fresh()])
            ab.primop(rng.choice(self.binary), target,
                      vars_in=[rng.choice(defined), rng.choice(defined)])
            if target not in defined:
                defined.append(target)
            return False
        if kind < 0.6:
            cond = self.fresh()
            ab.primop(rng.choice(CONDITIONS), cond, vars_in=[rng.choice(defined)])
            then_defined = list(defined)
            with ab.if_(cond):
                ended = self.block(then_defined, depth + 1, loops)
                if not ended and rng.random() < 0.25:
                    self.leave(then_defined, loops)
            if rng.random() < 0.6:
                else_defined = list(defined)
                with ab.else_():
                    ended = self.block(else_defined, depth + 1, loops)
                    if not ended and rng.random() < 0.15:
                        self.leave(else_defined, loops)
                defined[:] = [v for v in then_defined if v in else_defined]
            return False
        if kind < 0.8:
            counter = self.fresh()
            self.counters.add(counter)
            ab.primop(lambda x: x % 4, counter, vars_in=[rng.choice(defined)])
            with ab.while_(lambda c: c > 0, vars_in=[counter]):
                # the counter first, so that break/continue keep the loop finite
                ab.primop(lambda c: c - 1, counter, vars_in=[counter])
                self.block(list(defined) + [counter], depth + 1, loops + 1)
            return False
        counter = self.fresh()
        self.counters.add(counter)
        ab.primop(lambda x: x % 5, counter, vars_in=[rng.choice(defined)])
        with ab.loop():
            ab.primop(lambda c: c - 1, counter, vars_in=[counter])
            stop = self.fresh()
            ab.primop(lambda c: c < 0, stop, vars_in=[counter])
            with ab.if_(stop):
                ab.break_()
            self.block(list(defined) + [counter], depth + 1, loops + 1)
        return False

    def leave(self, defined, loops):
        choice = self.rng.random()
        if loops and choice < 0.35:
            self.ab.break_()
        elif loops and choice < 0.6:
            self.ab.continue_()
        else:
            self.ab.return_((self.rng.choice(defined), self.rng.choice(defined)))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 5, 64]))
def test_random_call_free_programs_match_the_reference(seed, batch):
    program = _Generator(seed).build()
    rng = np.random.default_rng(seed)
    args = [rng.integers(0, 1000, batch), rng.integers(0, 1000, batch)]
    compiled = compile_program(program, argument_types(args, BACKEND), BACKEND)
    if fuse(compiled.program) is None:
        # Early returns copy the code after them into each path; past
        # fused.MAX_LINES lines of generated code the VM runs the program.
        assert len(compiled.program.main_function().blocks) > 40, str(program)
        assert compiled.engine(BACKEND) == "vm"
        return
    _check(program, args)
