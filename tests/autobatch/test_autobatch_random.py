"""Random programs: every executor agrees with the one-example reference.

Programs have several functions calling each other (recursion bounded by a
counter that every call decreases), nested if/else (with and without else,
early returns), bounded while loops, tuple-typed variables, tail calls, and
values moved around by projection primops (swaps, copies, tuples packed and
taken apart: the VM binds those without calling them and may store the
variables involved in one array, see :mod:`autobatch.register_sharing`).
The batched VM (on the compact and the masking NumPy backends) and the
stackless executor must give, thread by thread, what the reference gives.
"""
import random

import numpy as np
from hypothesis import given, settings, strategies as st

from autobatch import reference, stackless
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.virtual_machine import execute

BINARY = [
    ("x + y", lambda x, y: (x + y) % 1000),
    ("x - y", lambda x, y: (x - y) % 1000),
    ("x * 3 + y", lambda x, y: (x * 3 + y) % 1000),
    ("max", lambda x, y: np.maximum(x, y)),
]
CONDITIONS = [
    ("x % 2 == 0", lambda x: x % 2 == 0),
    ("x > 500", lambda x: x > 500),
    ("x % 3 == 1", lambda x: x % 3 == 1),
]


class _Generator:
    """Builds one random program with a ProgramBuilder."""

    def __init__(self, seed: int, functions: int = 3) -> None:
        self.rng = random.Random(seed)
        self.names = [f"f{i}" for i in range(functions)]
        self.ab = ProgramBuilder()
        self.count = 0
        self.calls_left = 0

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def build(self):
        for name in self.names:
            with self.ab.function(name, params=["n", "a"]):
                self.calls_left = 2
                defined = ["n", "a"]
                self.block(defined, depth=0, in_loop=False)
                self.finish(defined)
        return self.ab.program(self.names[0])

    def finish(self, defined):
        """Return a variable, a tuple taken apart, or make a tail call."""
        rng, ab = self.rng, self.ab
        kind = rng.random()
        if kind < 0.2 and self.calls_left:
            guard = self.fresh()
            ab.primop(lambda n: n > 0, guard)
            with ab.if_(guard):
                m = self.fresh()
                ab.primop(lambda n: n - 1, m)
                out = self.fresh()
                ab.call(rng.choice(self.names), [m, rng.choice(defined)], out)
                ab.return_(out)               # a tail call
        if kind < 0.5:
            pair = self.fresh()
            x, y = rng.choice(defined), rng.choice(defined)
            ab.primop(lambda x, y: (x, y), pair, vars_in=[x, y])
            first = self.fresh()
            ab.primop(lambda p: p[0] + p[1] % 7, first, vars_in=[pair])
            ab.return_(first)
        else:
            ab.return_(rng.choice(defined))

    def block(self, defined, depth, in_loop):
        for _ in range(self.rng.randint(1, 4)):
            self.statement(defined, depth, in_loop)

    def statement(self, defined, depth, in_loop):
        rng, ab = self.rng, self.ab
        kind = rng.random()
        if kind < 0.35 or depth >= 3:
            _, fn = rng.choice(BINARY)
            target = rng.choice(defined + [self.fresh()]) if rng.random() < 0.5 else self.fresh()
            if target == "n":
                target = self.fresh()  # keep the recursion counter
            ab.primop(fn, target, vars_in=[rng.choice(defined), rng.choice(defined)])
            if target not in defined:
                defined.append(target)
        elif kind < 0.45:
            self.shuffle(defined)
        elif kind < 0.55:
            _, test = rng.choice(CONDITIONS)
            cond = self.fresh()
            ab.primop(test, cond, vars_in=[rng.choice(defined)])
            then_defined = list(defined)
            with ab.if_(cond):
                self.block(then_defined, depth + 1, in_loop)
                if rng.random() < 0.2 and not in_loop:
                    ab.return_(rng.choice(then_defined))   # an early return
            if rng.random() < 0.6:
                else_defined = list(defined)
                with ab.else_():
                    self.block(else_defined, depth + 1, in_loop)
                defined[:] = [v for v in then_defined if v in else_defined]
        elif kind < 0.75 and self.calls_left:
            self.calls_left -= 1
            guard, m, out = self.fresh(), self.fresh(), self.fresh()
            ab.primop(lambda n: n > 0, guard)
            ab.primop(lambda a: a + 1, out, vars_in=[rng.choice(defined)])
            with ab.if_(guard):
                ab.primop(lambda n: n - 1, m)
                ab.call(rng.choice(self.names), [m, rng.choice(defined)], out)
            defined.append(out)
        elif not in_loop:
            counter = self.fresh()
            ab.primop(lambda x: x % 3, counter, vars_in=[rng.choice(defined)])
            with ab.while_(lambda c: c > 0, vars_in=[counter]):
                self.block(list(defined), depth + 1, in_loop=True)
                ab.primop(lambda c: c - 1, counter, vars_in=[counter])


    def shuffle(self, defined):
        """Move values without computing: a swap, a copy, or a tuple packed
        and taken apart (each a primop that only picks its inputs)."""
        rng, ab = self.rng, self.ab
        movable = [v for v in defined if v != "n"]  # keep the recursion counter
        kind = rng.random()
        if kind < 0.35 and len(movable) >= 2:
            a, b = rng.sample(movable, 2)
            ab.primop(lambda x, y: (y, x), (a, b), vars_in=[a, b])
        elif kind < 0.7:
            target = rng.choice(movable + [self.fresh()])
            ab.primop(lambda x: x, target, vars_in=[rng.choice(defined)])
            if target not in defined:
                defined.append(target)
        else:
            pair, target = self.fresh(), rng.choice(movable + [self.fresh()])
            ab.primop(lambda x, y: (x, y), pair, vars_in=[rng.choice(defined),
                                                          rng.choice(defined)])
            ab.primop(lambda p: p[1], target, vars_in=[pair])
            if target not in defined:
                defined.append(target)


def _python_reference(program, args):
    return reference.run_batch(program, args, max_stack_depth=12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_programs_agree_with_the_reference(seed):
    program = _Generator(seed).build()
    rng = np.random.default_rng(seed)
    args = [rng.integers(0, 4, 24), rng.integers(0, 1000, 24)]
    want = _python_reference(program, args)
    for backend in (NumpyBackend(), MaskedNumpyBackend()):
        got = execute(program, args, backend, max_stack_depth=12)
        assert np.array_equal(got, want), (seed, str(program))
        got = stackless.execute(program, args, backend, max_stack_depth=12)
        assert np.array_equal(got, want), (seed, "stackless")
