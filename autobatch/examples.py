"""Example programs written with the DSL, each with its plain-Python twin.

Used by the tests and by ``benchmarks/bench_autobatch.py``; also a tour of
:class:`~autobatch.dsl.ProgramBuilder`.

- :func:`fibonacci`: doubly recursive ``fib`` (fib(0) = fib(1) = 1).
- :func:`even_odd`: mutually recursive ``is_even``/``is_odd``, as tail calls
  or with work after each call.
- :func:`collatz`: a ``while`` loop counting Collatz steps.
- :func:`gcd_pairs`: Euclid's algorithm on a tuple-typed variable.
- :func:`nuts_shaped`: the shape of the No-U-Turn sampler: a loop around a
  doubly recursive tree build whose leaf does a matrix-vector product, with
  a data-dependent early stop.  Values are integer-valued float64 (sums of
  small integers are exact), so batched matrix products give the same bits
  as one-by-one ones.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from autobatch.dsl import ProgramBuilder
from autobatch.ir import Program

__all__ = [
    "fibonacci", "fib_python",
    "even_odd", "is_even_python",
    "collatz", "collatz_python",
    "gcd_pairs", "gcd_python",
    "nuts_shaped", "nuts_python", "nuts_problem",
]


# -- fib ------------------------------------------------------------------------------

def fibonacci() -> Program:
    """``fib(n) = fib(n - 1) + fib(n - 2) if n > 1 else 1``."""
    ab = ProgramBuilder()
    with ab.function("fib", params=["n"]):
        ab.primop(lambda n: n > 1, "big")
        with ab.if_("big"):
            ab.primop(lambda n: n - 1, "n1")
            ab.call("fib", ["n1"], "left")
            ab.primop(lambda n: n - 2, "n2")
            ab.call("fib", ["n2"], "right")
            ab.primop(lambda left, right: left + right, "sum")
            ab.return_("sum")
        with ab.else_():
            ab.const(1, "one")
            ab.return_("one")
    return ab.program(main="fib")


def fib_python(n: int) -> int:
    return fib_python(n - 1) + fib_python(n - 2) if n > 1 else 1


# -- is_even / is_odd ---------------------------------------------------------------------

def even_odd(tail_calls: bool = True) -> Program:
    """``is_even(n)`` by mutual recursion with ``is_odd``.

    ``tail_calls=True``: ``is_even(n) = is_odd(n - 1)`` (tail calls, which the
    VM turns into jumps).  ``False``: ``is_even(n) = is_odd(n - 1) | (n == 0)``,
    work after every call, so each call needs a stack frame (and ``n == 0``
    is kept in it).
    """
    ab = ProgramBuilder()
    for name, other, base in (("is_even", "is_odd", True), ("is_odd", "is_even", False)):
        with ab.function(name, params=["n"]):
            ab.primop(lambda n: n == 0, "zero")
            with ab.if_("zero"):
                ab.const(base, "base")
                ab.return_("base")
            ab.primop(lambda n: n - 1, "m")
            ab.call(other, ["m"], "r")
            if tail_calls:
                ab.return_("r")
            else:
                # `zero` (false here) is live across the call: saved in a frame.
                ab.primop(lambda r, zero: r | zero, "res")
                ab.return_("res")
    return ab.program(main="is_even")


def is_even_python(n: int) -> bool:
    return True if n == 0 else is_odd_python(n - 1)


def is_odd_python(n: int) -> bool:
    return False if n == 0 else is_even_python(n - 1)


# -- Collatz --------------------------------------------------------------------------------

def collatz() -> Program:
    """Steps of the Collatz map from ``n`` (>= 1) down to 1, in a while loop."""
    ab = ProgramBuilder()
    with ab.function("collatz", params=["n"]):
        ab.primop(lambda n: n * 0, "steps")
        with ab.while_(lambda n: n != 1):
            ab.primop(lambda n: n % 2 == 0, "even")
            with ab.if_("even"):
                ab.primop(lambda n: n // 2, "n")
            with ab.else_():
                ab.primop(lambda n: 3 * n + 1, "n")
            ab.primop(lambda steps: steps + 1, "steps")
        ab.return_("steps")
    return ab.program(main="collatz")


def collatz_python(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


# -- gcd on a tuple-typed variable -------------------------------------------------------------

def gcd_pairs() -> Program:
    """``gcd(pair)`` where ``pair`` is one tuple-typed variable ``(a, b)``;
    returns ``(gcd, number of steps)``."""
    ab = ProgramBuilder()
    with ab.function("gcd", params=["pair"]):
        ab.primop(lambda pair: pair[0] * 0, "steps")
        with ab.while_(lambda pair: pair[1] != 0):
            ab.primop(lambda pair: (pair[1], pair[0] % pair[1]), "pair")
            ab.primop(lambda steps: steps + 1, "steps")
        ab.primop(lambda pair: pair[0], "g")
        ab.return_(("g", "steps"))
    return ab.program(main="gcd")


def gcd_python(pair: Tuple[int, int]) -> Tuple[int, int]:
    a, b = pair
    steps = 0
    while b != 0:
        a, b = b, a % b
        steps += 1
    return a, steps


# -- NUTS-shaped ---------------------------------------------------------------------------------

MODULUS = 1009.0


def nuts_problem(size: int = 256, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """A ``[size, size]`` matrix of -1/0/1 and a ``[size]`` weight vector of
    small integers, as float64."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(-1, 2, size=(size, size)).astype(np.float64)
    weights = rng.integers(0, 5, size=size).astype(np.float64)
    return matrix, weights


def nuts_shaped(matrix: np.ndarray, weights: np.ndarray, max_depth: int = 6,
                stop_one_in: int = 11) -> Program:
    """``nuts(x) -> (x, depth)``: repeat ``x, stop = tree(x, depth)`` for
    depth 0, 1, ... until a tree stops early or ``max_depth`` trees were built.

    ``tree(x, 0)`` is one leaf: ``y = (matrix @ x) mod 1009``, which stops
    where ``weights . y`` is a multiple of ``stop_one_in``.  ``tree(x, j)``
    builds ``tree(x, j - 1)`` and, unless it stopped, ``tree(y, j - 1)``.
    """
    # Operators only (``@``, ``%``), so that the primops run on NumPy arrays
    # and TensorFlow tensors alike.
    mt = np.ascontiguousarray(matrix.T)
    column = np.ascontiguousarray(weights[:, None])

    def leaf(x):
        return (x @ mt) % MODULUS

    def stops(y):
        return (y @ column)[:, 0] % stop_one_in == 0

    ab = ProgramBuilder()
    with ab.function("nuts", params=["x"]):
        ab.const(0, "depth")
        with ab.loop():
            ab.call("tree", ["x", "depth"], ("x", "stop"))
            ab.primop(lambda depth: depth + 1, "depth")
            ab.primop(lambda stop, depth: stop | (depth >= max_depth), "done")
            with ab.if_("done"):
                ab.break_()
        ab.return_(("x", "depth"))
    with ab.function("tree", params=["x", "depth"]):
        ab.primop(lambda depth: depth == 0, "is_leaf")
        with ab.if_("is_leaf"):
            ab.primop(leaf, "y", name="(matrix @ x) % 1009")
            ab.primop(stops, "stop", name="weights . y % k == 0")
            ab.return_(("y", "stop"))
        ab.primop(lambda depth: depth - 1, "sub")
        ab.call("tree", ["x", "sub"], "first")          # a tuple-typed variable
        ab.primop(lambda first: first[1], "stop")
        with ab.if_("stop"):
            ab.return_("first")
        ab.primop(lambda first: first[0], "y")
        ab.call("tree", ["y", "sub"], ("z", "stop2"))
        ab.return_(("z", "stop2"))
    return ab.program(main="nuts")


def nuts_python(x: np.ndarray, matrix: np.ndarray, weights: np.ndarray, max_depth: int = 6,
                stop_one_in: int = 11) -> Tuple[np.ndarray, int]:
    """The plain-Python twin of :func:`nuts_shaped` for one example."""
    def tree(x, depth):
        if depth == 0:
            y = np.mod(matrix @ x, MODULUS)
            return y, np.mod(weights @ y, stop_one_in) == 0
        y, stop = tree(x, depth - 1)
        if stop:
            return y, stop
        return tree(y, depth - 1)

    depth = 0
    while True:
        x, stop = tree(x, depth)
        depth += 1
        if stop or depth >= max_depth:
            return x, depth
