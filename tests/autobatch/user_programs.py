"""TFP-style user programs autobatch had never seen, written once against a
package ``ab`` that is either ``autobatch`` or TFP 0.25's ``auto_batching``
(``ab.Context``, ``@ctx.batch(type_inference=...)``, ``ab.TensorType``) and
an op library ``lib`` (NumPy or TensorFlow: :func:`ops`), the way TFP's docs
and tests write them: primops see batched values (reductions on ``axis=-1``),
conditions are per-member, ``return`` ends a member's call.

Each entry of :data:`PROGRAMS` is a :class:`UserProgram`: ``build(ab, lib)``
gives ``(ctx, entry)``, ``inputs(n)`` a batch of NumPy arguments,
``oracle(*member)`` the result for one member computed by a plain Python
loop (no autobatch), ``depth`` the ``max_stack_depth`` the batch needs and
``tfp_frontend`` whether TFP's frontend accepts the source (TFP's
AutoGraph-based frontend has no ``while``/``for``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Tuple

import numpy as np


class _NumpyOps:
    """The ops the programs use, on NumPy arrays."""
    name = "numpy"

    @staticmethod
    def reduce_sum(x, axis):
        return np.sum(x, axis=axis)

    @staticmethod
    def matmul(a, b):
        return np.matmul(a, b)

    @staticmethod
    def abs(x):
        return np.abs(x)


class _TensorFlowOps:
    """The same ops on TensorFlow tensors."""
    name = "tensorflow"

    def __init__(self):
        import tensorflow as tf
        self.tf = tf

    def reduce_sum(self, x, axis):
        return self.tf.reduce_sum(x, axis=axis)

    def matmul(self, a, b):
        return self.tf.linalg.matmul(a, b)

    def abs(self, x):
        return self.tf.abs(x)


def ops(kind: str):
    """``"numpy"`` or ``"tensorflow"``: the op library a program closes over."""
    return _NumpyOps() if kind == "numpy" else _TensorFlowOps()


@dataclass
class UserProgram:
    name: str
    build: Callable[[Any, Any], Tuple[Any, Any]]
    inputs: Callable[[int], Tuple[np.ndarray, ...]]
    oracle: Callable[..., Any]
    depth: int
    tfp_frontend: bool = True
    #: results equal to the loop's bit for bit (False: a reduction whose
    #: order XLA may change, compared with allclose rtol 1e-12)
    exact: bool = True


# --- integer programs ---------------------------------------------------------------

def gcd_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def gcd(a, b):
        if b == 0:
            return a
        else:
            return gcd(b, a % b)

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def lcm(a, b):
        g = gcd(a, b)
        return a // g * b
    return ctx, lcm


def gcd_inputs(n):
    rng = np.random.default_rng(1)
    return (rng.integers(1, 60, size=n).astype(np.int64),
            rng.integers(1, 60, size=n).astype(np.int64))


def parity_build(ab, lib):
    ctx = ab.Context()
    boolean = lambda arg_types: ab.TensorType(np.bool_, ())

    @ctx.batch(type_inference=boolean)
    def is_even(n):
        if n == 0:
            return True
        else:
            return is_odd(n - 1)

    @ctx.batch(type_inference=boolean)
    def is_odd(n):
        if n == 0:
            return False
        else:
            return is_even(n - 1)
    return ctx, is_even


def ackermann_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[1])
    def ackermann(m, n):
        if m == 0:
            return n + 1
        if n == 0:
            return ackermann(m - 1, 1)
        inner = ackermann(m, n - 1)
        return ackermann(m - 1, inner)
    return ctx, ackermann


def _ackermann(m, n):
    if m == 0:
        return n + 1
    if n == 0:
        return _ackermann(m - 1, 1)
    return _ackermann(m - 1, _ackermann(m, n - 1))


def collatz_recursive_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def collatz(n):
        if n == 1:
            return 0
        if n % 2 == 0:
            following = n // 2
        else:
            following = 3 * n + 1
        rest = collatz(following)
        return rest + 1
    return ctx, collatz


def _collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def collatz_while_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0], arg_types[0]])
    def collatz_peak(n, limit):
        steps = 0
        peak = n
        while True:
            if n == 1:
                break
            if steps >= limit:
                return -1, peak
            if n % 2 == 0:
                n = n // 2
            else:
                n = 3 * n + 1
            peak = n if n > peak else peak
            steps += 1
        return steps, peak
    return ctx, collatz_peak


def _collatz_peak(n, limit):
    steps, peak = 0, n
    while n != 1:
        if steps >= limit:
            return -1, peak
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        peak = max(peak, n)
        steps += 1
    return steps, peak


def divmod_build(ab, lib):
    """Multiple outputs of int32: a tuple returned through recursion."""
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0], arg_types[0]])
    def slow_divmod(a, b):
        if a < b:
            zero = a - a
            return zero, a
        q, r = slow_divmod(a - b, b)
        return q + 1, r
    return ctx, slow_divmod


# --- floating point ----------------------------------------------------------------

def newton_build(ab, lib):
    """Newton's square root, recursing until converged (members stop at
    different depths); closes over a tensor tolerance."""
    tol = np.float64(1e-12)
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def newton(a, x, k):
        nx = 0.5 * (x + a / x)
        if lib.abs(nx - x) <= tol * nx:
            return nx
        if k == 0:
            return nx
        return newton(a, nx, k - 1)
    return ctx, newton


def _newton(a, x, k):
    while True:
        nx = 0.5 * (x + a / x)
        if abs(nx - x) <= 1e-12 * nx or k == 0:
            return nx
        x, k = nx, k - 1


def newton_inputs(n):
    rng = np.random.default_rng(2)
    a = rng.uniform(0.01, 1e6, size=n)
    return a, np.ones(n), np.full(n, 40, dtype=np.int64)


def newton_while_build(ab, lib):
    tol = np.float64(1e-12)
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0], arg_types[2]])
    def newton_loop(a, x, k):
        i = k - k
        while i < k:
            nx = 0.5 * (x + a / x)
            if lib.abs(nx - x) <= tol * nx:
                return nx, i
            x = nx
            i += 1
        return x, i
    return ctx, newton_loop


def _newton_loop(a, x, k):
    i = 0
    while i < k:
        nx = 0.5 * (x + a / x)
        if abs(nx - x) <= 1e-12 * nx:
            return nx, i
        x, i = nx, i + 1
    return x, i


def bisect_build(ab, lib):
    """Root of x**3 - c on [lo, hi], halving k times (k differs per member)."""
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def bisect(c, lo, hi, k):
        mid = 0.5 * (lo + hi)
        if k == 0:
            return mid
        if mid * mid * mid - c > 0:
            return bisect(c, lo, mid, k - 1)
        else:
            return bisect(c, mid, hi, k - 1)
    return ctx, bisect


def _bisect(c, lo, hi, k):
    while True:
        mid = 0.5 * (lo + hi)
        if k == 0:
            return mid
        if mid * mid * mid - c > 0:
            hi = mid
        else:
            lo = mid
        k -= 1


def bisect_inputs(n):
    rng = np.random.default_rng(3)
    return (rng.uniform(0, 8, size=n), np.zeros(n), np.full(n, 2.0),
            rng.integers(0, 12, size=n).astype(np.int64))


# --- vectors and matrices ------------------------------------------------------------

def nuts_tree_build(ab, lib):
    """A NUTS-like doubling tree: leapfrog leaves, subtrees built left then
    right, a U-turn check (a reduction over the event axis) stops early;
    state vectors of shape [batch, 4], four outputs."""
    step = np.float64(0.3)
    ctx = ab.Context()

    def tree_types(arg_types):
        return [arg_types[0], arg_types[0], arg_types[2], ab.TensorType(np.bool_, ())]

    @ctx.batch(type_inference=tree_types)
    def build_tree(x, v, depth):
        if depth == 0:
            v1 = v - step * x
            x1 = x + step * v1
            stop = lib.reduce_sum(x1 * x1, -1) > 9.0
            return x1, x1, depth + 1, stop
        left, right, n1, stop1 = build_tree(x, v, depth - 1)
        if stop1:
            return left, right, n1, stop1
        left2, right2, n2, stop2 = build_tree(right, v, depth - 1)
        turned = lib.reduce_sum((right2 - left) * v, -1) < 0.0
        return left, right2, n1 + n2, stop2 | turned
    return ctx, build_tree


def _nuts_tree(x, v, depth):
    if depth == 0:
        v1 = v - 0.3 * x
        x1 = x + 0.3 * v1
        return x1, x1, 1, bool(np.sum(x1 * x1) > 9.0)
    left, right, n1, stop1 = _nuts_tree(x, v, depth - 1)
    if stop1:
        return left, right, n1, stop1
    left2, right2, n2, stop2 = _nuts_tree(right, v, depth - 1)
    turned = bool(np.sum((right2 - left) * v) < 0.0)
    return left, right2, n1 + n2, stop2 or turned


def nuts_inputs(n):
    rng = np.random.default_rng(4)
    return (rng.normal(size=(n, 4)), rng.normal(size=(n, 4)),
            rng.integers(0, 5, size=n).astype(np.int64))


def matpow_build(ab, lib):
    """Repeated squaring of [k, k] matrices (batch [batch, 3, 3]) and a
    [k, m] state pushed through them ([batch, 3, 2]): results of two shapes."""
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def matpow(a, e):
        if e == 1:
            return a
        half = matpow(a, e // 2)
        square = lib.matmul(half, half)
        if e % 2 == 1:
            return lib.matmul(square, a)
        return square

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0], arg_types[1]])
    def propagate(a, state, e):
        power = matpow(a, e)
        return power, lib.matmul(power, state)
    return ctx, propagate


def _matpow(a, e):
    if e == 1:
        return a
    half = _matpow(a, e // 2)
    square = half @ half
    return square @ a if e % 2 == 1 else square


def matpow_inputs(n):
    rng = np.random.default_rng(5)
    return (rng.integers(-2, 3, size=(n, 3, 3)).astype(np.float64),
            rng.integers(-2, 3, size=(n, 3, 2)).astype(np.float64),
            rng.integers(1, 9, size=n).astype(np.int64))


# --- calls in loops, tuples, short-circuits, closures ------------------------------

def while_calls_build(ab, lib):
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: t[0])
    def gcd(a, b):
        if b == 0:
            return a
        return gcd(b, a % b)

    @ctx.batch(type_inference=lambda t: [t[0], t[0]])
    def sum_gcds(n, m):
        total = 0
        i = 1
        while i <= n:
            g = gcd(i, m)
            if g > 5:
                return total, i
            total += g
            i += 1
        return total, i
    return ctx, sum_gcds

def _sum_gcds(n, m):
    total, i = 0, 1
    while i <= n:
        g = math.gcd(i, m)
        if g > 5: return total, i
        total += g; i += 1
    return total, i

def rotate_build(ab, lib):
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: t[0])
    def rotate(p, k):
        (a, b), c = p
        if k == 0:
            return p
        return rotate(((b, c), a), k - 1)
    return ctx, rotate

def for_break_build(ab, lib):
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: t[0])
    def damp(x, k):
        for i in range(k):
            x = x * 0.5 + 1.0
            if x > 1.9:
                break
        return x
    return ctx, damp

def _damp(x, k):
    x = np.float32(x)
    for i in range(k):
        x = x * np.float32(0.5) + np.float32(1.0)
        if x > 1.9: break
    return x

def prime_build(ab, lib):
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: ab.TensorType(np.bool_, ()))
    def has_divisor(n, d):
        if d * d > n:
            return False
        return n % d == 0 or has_divisor(n, d + 1)
    @ctx.batch(type_inference=lambda t: ab.TensorType(np.bool_, ()))
    def is_prime(n):
        return n > 1 and not has_divisor(n, 2)
    return ctx, is_prime

def _is_prime(n):
    return n > 1 and all(n % d for d in range(2, int(math.isqrt(n)) + 1))

def ifexpr_build(ab, lib):
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: t[0])
    def down(n):
        return down(n - 2) + 1 if n > 1 else n * 10
    @ctx.batch(type_inference=lambda t: t[0])
    def entry(n, flag):
        down(n)
        r = down(n=n) if flag else -n
        return r
    return ctx, entry

def _down(n):
    return _down(n - 2) + 1 if n > 1 else n * 10

def closure_vec_build(ab, lib):
    shift = np.array([1.0, -2.0, 0.5, 4.0])
    ctx = ab.Context()
    @ctx.batch(type_inference=lambda t: t[0])
    def walk(x, k):
        if k == 0:
            return x
        return walk(x * 0.5 + shift, k - 1)
    return ctx, walk

def _walk(x, k):
    shift = np.array([1.0, -2.0, 0.5, 4.0])
    for _ in range(k): x = x * 0.5 + shift
    return x

def _rotate(p, k):
    for _ in range(k):
        (a, b), c = p
        p = ((b, c), a)
    return p


def divisors_build(ab, lib):
    """Divisors of int32 ``n`` counted from a literal start: the literal
    ``1`` passed to ``count_from`` types ``d`` from the constant alone, and
    ``n % d`` runs during type inference on ``d``'s placeholder."""
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def count_from(n, d):
        if d > n:
            return n - n
        rest = count_from(n, d + 1)
        if n % d == 0:
            return rest + 1
        return rest

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def num_divisors(n):
        return count_from(n, 1)
    return ctx, num_divisors


def _num_divisors(n):
    return sum(1 for d in range(1, n + 1) if n % d == 0)


# --- recursion inside loops, call cycles, small dtypes -------------------------------

def tree_loop_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda t: t[0])
    def count_nodes(n, fan):
        total = n - n + 1
        i = 0
        while i < fan:
            if n > 0:
                total += count_nodes(n - 1, fan)
            i += 1
        return total
    return ctx, count_nodes


def _count_nodes(n, fan):
    return 1 + (fan * _count_nodes(n - 1, fan) if n > 0 else 0)


def cycle3_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda t: [t[0], t[1]])
    def f_a(n, acc):
        if n <= 0:
            return n, acc
        m, s = f_b(n - 1, acc * 2.0)
        return m + 1, s + 1.0

    @ctx.batch(type_inference=lambda t: [t[0], t[1]])
    def f_b(n, acc):
        if n <= 0:
            return n, acc
        m, s = f_c(n - 1, acc + 3.0)
        return m + 10, s * 0.5

    @ctx.batch(type_inference=lambda t: [t[0], t[1]])
    def f_c(n, acc):
        if n <= 0:
            return n, acc
        m, s = f_a(n - 1, acc - 1.0)
        return m + 100, s - 2.0
    return ctx, f_a


def _f(which, n, acc):
    if n <= 0: return n, acc
    if which == 0:
        m, s = _f(1, n - 1, acc * 2.0); return m + 1, s + 1.0
    if which == 1:
        m, s = _f(2, n - 1, acc + 3.0); return m + 10, s * 0.5
    m, s = _f(0, n - 1, acc - 1.0); return m + 100, s - 2.0


def small_dtypes_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda t: [t[0], t[1]])
    def halve(x, k):
        if k <= 0:
            return x, k
        y, j = halve(x * 0.5, k - 1)
        return y + x, j + 1
    return ctx, halve


def _halve(x, k):
    if k <= 0: return x, k
    y, j = _halve(x * np.float16(0.5), k - np.int8(1))
    return y + x, j + np.int8(1)


def rec_in_for_build(ab, lib):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda t: t[0])
    def tri(n):
        if n <= 0:
            return n
        s = n
        for j in range(2):
            s = s + tri(n - 1 - j)
        return s
    return ctx, tri


def _tri(n):
    if n <= 0: return n
    return n + _tri(n - 1) + _tri(n - 2)


PROGRAMS = {p.name: p for p in [
    UserProgram("gcd_lcm", gcd_build, gcd_inputs,
                lambda a, b: a // math.gcd(a, b) * b, depth=16),
    UserProgram("mutual_parity", parity_build,
                lambda n: (np.arange(n, dtype=np.int64) % 13,),
                lambda n: n % 2 == 0, depth=14),
    UserProgram("ackermann", ackermann_build,
                lambda n: (np.arange(n, dtype=np.int64) % 3, (np.arange(n, dtype=np.int64) // 3) % 4),
                _ackermann, depth=16),
    UserProgram("collatz_recursive", collatz_recursive_build,
                lambda n: (np.arange(1, n + 1, dtype=np.int64) % 27 + 1,),
                _collatz, depth=112),
    UserProgram("collatz_while_early_exit", collatz_while_build,
                lambda n: (np.arange(1, n + 1, dtype=np.int64) % 27 + 1,
                           np.full(n, 60, dtype=np.int64)),
                _collatz_peak, depth=2, tfp_frontend=False),
    UserProgram("divmod_int32_tuple", divmod_build,
                lambda n: (np.arange(n, dtype=np.int32) % 17, np.full(n, 5, dtype=np.int32)),
                lambda a, b: (a // b, a % b), depth=6),
    UserProgram("newton_sqrt_f64", newton_build, newton_inputs, _newton, depth=42),
    UserProgram("newton_while_f64", newton_while_build, newton_inputs, _newton_loop,
                depth=2, tfp_frontend=False),
    UserProgram("bisection_f64", bisect_build, bisect_inputs, _bisect, depth=14),
    UserProgram("nuts_tree_b4", nuts_tree_build, nuts_inputs, _nuts_tree, depth=12,
                exact=False),
    UserProgram("matpow_b3x3_b3x2", matpow_build, matpow_inputs,
                lambda a, s, e: (_matpow(a, e), _matpow(a, e) @ s), depth=6),
    UserProgram("divisors_literal_arg_i32", divisors_build,
                lambda n: (np.arange(1, n + 1, dtype=np.int32) % 13 + 1,), _num_divisors,
                depth=15),
    UserProgram("while_calls_recursive", while_calls_build,
                lambda n: (np.arange(n, dtype=np.int64) % 9, np.full(n, 12, dtype=np.int64)),
                _sum_gcds, depth=12, tfp_frontend=False),
    UserProgram("nested_tuple_rotate", rotate_build,
                lambda n: (((np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64) * 3),
                            np.arange(n, dtype=np.int64) % 2), np.arange(n, dtype=np.int64) % 5),
                _rotate, depth=6),
    UserProgram("for_break_f32", for_break_build,
                lambda n: (np.linspace(-3, 3, n).astype(np.float32),
                           np.arange(n, dtype=np.int64) % 6),
                _damp, depth=2, tfp_frontend=False),
    UserProgram("and_or_calls_prime", prime_build,
                lambda n: (np.arange(n, dtype=np.int64) + 90,), _is_prime, depth=12,
                tfp_frontend=False),
    UserProgram("ifexpr_kwcall_stmtcall", ifexpr_build,
                lambda n: (np.arange(n, dtype=np.int64) % 9, np.arange(n) % 3 != 0),
                lambda n, f: _down(n) if f else -n, depth=8, tfp_frontend=False),
    UserProgram("closure_vec_b4", closure_vec_build,
                lambda n: (np.arange(4 * n, dtype=np.float64).reshape(n, 4),
                           np.arange(n, dtype=np.int64) % 7),
                _walk, depth=8),
    UserProgram("while_loop_recursive_fanout", tree_loop_build,
                lambda n: (np.arange(n, dtype=np.int64) % 5, np.arange(n, dtype=np.int64) % 3 + 1),
                _count_nodes, depth=8, tfp_frontend=False),
    UserProgram("mutual_cycle3_tuple", cycle3_build,
                lambda n: (np.arange(n, dtype=np.int64) % 8, np.linspace(0, 2, n)),
                lambda n, a: _f(0, n, a), depth=10),
    UserProgram("float16_int8_tuple", small_dtypes_build,
                lambda n: (np.linspace(-1, 1, n).astype(np.float16),
                           (np.arange(n) % 5).astype(np.int8)),
                _halve, depth=6),
    UserProgram("recursion_in_for_range", rec_in_for_build,
                lambda n: (np.arange(n, dtype=np.int64) % 9,), _tri, depth=10,
                tfp_frontend=False),
]}


# --- regimes ------------------------------------------------------------------------

REGIMES = ("numpy", "tf_eager", "tf_function", "tf_function_no_autograph", "tf_xla",
           "tf1_session")


def _leaves(result):
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in _leaves(item)]
    return [np.asarray(result.numpy() if hasattr(result, "numpy") else result)]


def run(ab, program: UserProgram, regime: str, batch: int, max_stack_depth=None):
    """Run ``program`` on ``batch`` members in ``regime``; the flat list of
    NumPy results."""
    depth = program.depth if max_stack_depth is None else max_stack_depth
    inputs = program.inputs(batch)
    if regime == "numpy":
        ctx, entry = program.build(ab, ops("numpy"))
        return _leaves(entry(*inputs, backend=ab.NumpyBackend(), max_stack_depth=depth))
    import tensorflow as tf
    ctx, entry = program.build(ab, ops("tensorflow"))
    backend = ab.TensorFlowBackend()
    tensors = tf.nest.map_structure(tf.constant, inputs)
    if regime == "tf_eager":
        return _leaves(entry(*tensors, backend=backend,
                             max_stack_depth=depth))
    if regime.startswith("tf_function") or regime == "tf_xla":
        def call(*args):
            return entry(*args, backend=backend, max_stack_depth=depth)
        fn = tf.function(call, autograph=regime != "tf_function_no_autograph",
                         jit_compile=regime == "tf_xla")
        return _leaves(fn(*tensors))
    if regime == "tf1_session":
        graph = tf.Graph()
        with graph.as_default():
            holders = tf.nest.map_structure(
                lambda x: tf.compat.v1.placeholder(x.dtype, shape=(None,) + x.shape[1:]),
                inputs)
            out = entry(*holders, backend=backend, max_stack_depth=depth)
            feed = dict(zip(tf.nest.flatten(holders), tf.nest.flatten(inputs)))
            with tf.compat.v1.Session(graph=graph) as sess:
                got = sess.run(out, feed_dict=feed)
        return _leaves(got)
    raise ValueError(regime)


def _flat(value):
    if isinstance(value, tuple):
        return tuple(leaf for item in value for leaf in _flat(item))
    return (value,)


def expected(program: UserProgram, batch: int):
    """The oracle's results: a plain Python loop over the members."""
    inputs = program.inputs(batch)
    def member(x, i):
        if isinstance(x, tuple):
            return tuple(member(y, i) for y in x)
        return x[i].item() if x[i].ndim == 0 else x[i]
    rows = [_flat(program.oracle(*[member(x, i) for x in inputs])) for i in range(batch)]
    return [np.stack([np.asarray(r[j]) for r in rows]) for j in range(len(rows[0]))]


def agree(got, want, exact=True):
    """Same number of results, same shapes, and equal (ints, bools: exactly;
    floats: to 0 ulp where ``exact``, else allclose rtol 1e-12)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if np.issubdtype(w.dtype, np.floating) and not exact:
            if not np.allclose(g, w, rtol=1e-12, atol=0):
                return False
        elif not np.array_equal(g, w):
            return False
    return True
