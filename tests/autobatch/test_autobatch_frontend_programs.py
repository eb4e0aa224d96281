"""Batched Python programs shared by the frontend and TensorFlow tests.

Each is written once as plain Python for one example and batched in
:data:`ctx`; the plain function (``.python``) is the reference.  Primop code
uses only operators (``+``, ``//``, ``%``, ``@``, comparisons, indexing with
``...``), so the same source runs on NumPy and on TensorFlow.
"""
import numpy as np

import autobatch

ctx = autobatch.Context()


@ctx.batch(type_inference=lambda arg_types: [arg_types[0]])
def fib(n):
    if n > 1:
        return fib(n - 1) + fib(n - 2)
    return 1


@ctx.batch()
def is_even(n):
    if n == 0:
        return True
    return is_odd(n - 1)


@ctx.batch()
def is_odd(n):
    if n == 0:
        return False
    return is_even(n - 1)


@ctx.batch()
def collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps = steps + 1
    return steps


@ctx.batch()
def gcd(pair):
    """Euclid on a tuple-typed argument; returns (gcd, steps)."""
    a, b = pair
    steps = 0
    while b != 0:
        a, b = b, a % b
        steps += 1
    return a, steps


@ctx.batch()
def sum_of_squares(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def nuts_problem(size: int, seed: int):
    """``(leaf, weights)``: a ``[size, size]`` matrix of -1/0/1 (for ``x @
    leaf``) and a ``[size, 1]`` column of small integers, float64."""
    rng = np.random.default_rng(seed)
    leaf = rng.integers(-1, 2, size=(size, size)).astype(np.float64)
    weights = rng.integers(0, 5, size=(size, 1)).astype(np.float64)
    return leaf, weights


NUTS_SIZE = 32
LEAF, WEIGHTS = nuts_problem(NUTS_SIZE, seed=4)
MAX_DEPTH = 5


@ctx.batch()
def tree(x, depth):
    """A NUTS-shaped doubly recursive tree build (integer-valued floats, so
    batched and one-by-one products agree bit for bit)."""
    if depth == 0:
        y = (x @ LEAF) % 1009.0
        return y, (y @ WEIGHTS)[..., 0] % 11.0 == 0.0
    y, stop = tree(x, depth - 1)
    if stop:
        return y, stop
    return tree(y, depth - 1)


@ctx.batch()
def nuts(x):
    depth = 0
    while True:
        x, stop = tree(x, depth)
        depth = depth + 1
        if stop or depth >= MAX_DEPTH:
            return x, depth


def plain(batched, *args):
    """The plain Python function over every example (size-1 and scalar
    arguments broadcast), results stacked like the batched ones."""
    return batched.per_example(*args)
