"""The native engine (:mod:`autobatch.native`): numba kernels, one thread per lane.

Every example program that lowers runs bit for bit as the VM and plain
Python do, at several batch sizes (recursion included); a thread with too
many pending calls raises the VM's StackOverflowError; a program that does
not lower falls back (automatic choice) or raises NativeEngineError
(``native=True``) and is left unchanged; without numba everything runs as
before; a kernel compiled in one process is loaded from disk in the next.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from autobatch import examples
from autobatch.backends.numpy import NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.errors import NativeEngineError, StackOverflowError
from autobatch.pipeline import argument_types, compile_program
from autobatch.virtual_machine import VirtualMachine
from tests.conftest import need

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = NumpyBackend(native=True)
PLAIN = NumpyBackend(native=False)


@pytest.fixture(autouse=True)
def _numba_and_cache(tmp_path_factory, monkeypatch):
    need("numba")
    cache = tmp_path_factory.getbasetemp() / "native-cache"
    monkeypatch.setenv("AUTOBATCH_NATIVE_CACHE", str(cache))


def _run(program, args, backend, depth=25):
    compiled = compile_program(program, argument_types(args, backend), backend)
    engine = compiled.engine(backend)
    if engine == "vm":
        return engine, VirtualMachine(compiled.lowered, backend, depth).run(args)
    runner = compiled.runner(backend)
    return engine, (runner.run(args, depth) if engine == "native" else runner.run(args))


def _identical(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _identical(g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)


def _cases(batch, rng):
    n = rng.integers(0, 16, batch)
    pairs = (rng.integers(0, 10 ** 6, batch), rng.integers(0, 10 ** 6, batch))
    return [
        ("fib", examples.fibonacci, [n], lambda: np.array(
            [examples.fib_python(int(v)) for v in n])),
        ("is_even, tail calls", lambda: examples.even_odd(True), [n], lambda: np.array(
            [examples.is_even_python(int(v)) for v in n])),
        ("is_even, frames", lambda: examples.even_odd(False), [n % 12], lambda: np.array(
            [examples.is_even_python(int(v)) for v in n % 12])),
        ("collatz", examples.collatz, [n + 1], lambda: np.array(
            [examples.collatz_python(int(v)) for v in n + 1])),
        ("gcd", examples.gcd_pairs, [pairs], lambda: tuple(np.array(c) for c in zip(
            *[examples.gcd_python((int(a), int(b))) for a, b in zip(*pairs)]))),
    ]


@pytest.mark.parametrize("batch", [1, 7, 300])
def test_every_scalar_example_is_bit_identical_to_the_vm_and_python(batch):
    rng = np.random.default_rng(batch)
    for name, make, args, python in _cases(batch, rng):
        engine, got = _run(make(), args, NATIVE)
        assert engine == "native", name
        _, vm = _run(make(), args, PLAIN)
        _identical(got, vm)
        want = python()
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,), strict=True):
            assert np.array_equal(g, w), name


def test_a_scalar_argument_is_broadcast_as_the_vm_does():
    program = examples.gcd_pairs()
    args = [(np.array([12, 18, 35]), np.int64(6))]
    _identical(_run(program, args, NATIVE)[1], _run(examples.gcd_pairs(), args, PLAIN)[1])


def _binary_program(functions):
    """``f(a, b) = (functions[0](a, b), functions[1](a, b), ...)``."""
    ab = ProgramBuilder()
    with ab.function("f", params=["a", "b"]):
        for i, function in enumerate(functions):
            ab.primop(function, f"r{i}", vars_in=("a", "b"))
        ab.return_(tuple(f"r{i}" for i in range(len(functions))))
    return ab.program(main="f")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_arithmetic_edge_cases_give_numpys_bits():
    """Division by zero, negative operands, INT64_MIN // -1, signed zeros
    and infinities: every bit as NumPy's (NaNs: equal as NaNs; LLVM, like
    NumPy's own loops, does not promise a NaN's sign)."""
    ints = (np.array([7, -7, 7, -7, 0, 5, -2 ** 63, 2 ** 63 - 1, 3], np.int64),
            np.array([2, 2, -2, -2, 3, 0, -1, 2, 0], np.int64))
    floats = (np.array([7.5, -7.5, 7.5, -0.0, 0.0, 5.0, np.inf, np.nan, 1e308, -3.0]),
              np.array([2.0, 2.0, -2.0, 3.0, -3.0, 0.0, 2.0, 1.0, 1e-308, np.inf]))
    functions = [lambda a, b: a // b, lambda a, b: a % b, lambda a, b: a / b,
                 lambda a, b: a * b - b, lambda a, b: -a + (a < b),
                 lambda a, b: (a > 0) ^ (b > 0), lambda a, b: a // -1]
    for a, b in (ints, floats, (ints[0], floats[1][:9])):
        engine, got = _run(_binary_program(functions), [a, b], NATIVE)
        _, want = _run(_binary_program(functions), [a, b], PLAIN)
        assert engine == "native"
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            assert np.array_equal(g, w, equal_nan=g.dtype.kind == "f")
            if g.dtype.kind == "f":
                real = ~np.isnan(w)
                assert np.array_equal(np.signbit(g[real]), np.signbit(w[real]))


def test_stack_overflow_is_the_vms_error():
    n = np.array([3, 20, 4])
    with pytest.raises(StackOverflowError) as vm_error:
        _run(examples.fibonacci(), [n], PLAIN, depth=6)
    with pytest.raises(StackOverflowError) as native_error:
        _run(examples.fibonacci(), [n], NATIVE, depth=6)
    assert str(native_error.value) == str(vm_error.value)
    assert native_error.value.function == "fib" and native_error.value.max_stack_depth == 6
    # one frame more than the deepest thread needs: no error
    _identical(_run(examples.fibonacci(), [n], NATIVE, depth=20)[1],
               np.array([examples.fib_python(int(v)) for v in n]))


def _halve_with_numpy():
    ab = ProgramBuilder()
    with ab.function("halve", params=["x"]):
        ab.primop(lambda x: np.floor_divide(x, 2), "y", name="np.floor_divide(x, 2)")
        ab.return_("y")
    return ab.program(main="halve")


def test_an_unknown_primop_falls_back_or_raises_naming_it():
    x = np.arange(10)
    program = _halve_with_numpy()
    before = program.format() if hasattr(program, "format") else repr(program)
    engine, got = _run(program, [x], NumpyBackend())  # automatic choice
    assert engine != "native"
    assert np.array_equal(got, x // 2)
    with pytest.raises(NativeEngineError, match=r"np\.floor_divide\(x, 2\).*native=None"):
        _run(program, [x], NATIVE)
    assert (program.format() if hasattr(program, "format") else repr(program)) == before


def test_vector_values_fall_back_and_are_named():
    matrix, weights = examples.nuts_problem(8)
    program = examples.nuts_shaped(matrix, weights, max_depth=2)
    x = np.arange(16, dtype=np.float64).reshape(2, 8)
    compiled = compile_program(program, argument_types([x], NumpyBackend()), NumpyBackend())
    assert compiled.engine(NumpyBackend()) == "vm"
    with pytest.raises(NativeEngineError, match=r"nuts/x.*shape \(8,\)"):
        compiled.engine(NATIVE)


def test_frontend_runs_recursion_natively_by_default():
    import autobatch
    ctx = autobatch.Context()

    @ctx.batch()
    def fib(n):
        if n > 1:
            return fib(n - 1) + fib(n - 2)
        return n * 0 + 1

    n = np.arange(12)
    assert np.array_equal(fib(n), [examples.fib_python(int(v)) for v in n])
    backend = ctx._canonical(None)
    compiled = ctx._compiled_for("fib", argument_types([n], backend), backend)
    # the first call started the kernel's compile in the background
    assert compiled.wait_for_native(timeout=300)
    assert compiled.engine(backend) == "native"
    assert np.array_equal(fib(n), [examples.fib_python(int(v)) for v in n])  # natively
    with pytest.raises(StackOverflowError):
        fib(n, max_stack_depth=4)


_CHILD = textwrap.dedent("""
    import sys, numpy as np
    {prelude}
    from autobatch import examples
    from autobatch.backends.numpy import NumpyBackend
    from autobatch.pipeline import argument_types, compile_program
    n = np.arange(15)
    for native in (None, True):
        b = NumpyBackend(native=native)
        c = compile_program(examples.fibonacci(), argument_types([n], b), b)
        try:
            c.engine(b)          # the automatic choice compiles in the background
            c.wait_for_native(timeout=300)
            engine = c.engine(b)
        except Exception as exc:
            print(native, type(exc).__name__, str(exc)[:60])
            continue
        runner = c.runner(b)
        out = runner.run([n], 20) if engine == "native" else None
        if engine == "native":
            print(native, engine, int(out.sum()), sum(runner.kernel().stats.cache_hits.values()))
        else:
            print(native, engine)
""")


def _child(prelude, cache):
    env = dict(os.environ, PYTHONPATH=ROOT, AUTOBATCH_NATIVE_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-c", _CHILD.format(prelude=prelude)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")


def test_without_numba_everything_runs_as_before(tmp_path):
    lines = _child("sys.modules['numba'] = None  # as if numba were not installed",
                   tmp_path)
    assert lines[0] == "None vm"
    assert lines[1].startswith("True NativeEngineError") and "numba" in lines[1]


def test_a_new_process_loads_the_compiled_kernel_from_disk(tmp_path):
    total = sum(examples.fib_python(v) for v in range(15))
    assert _child("", tmp_path)[0] == f"None native {total} 0"   # compiled
    assert _child("", tmp_path)[0] == f"None native {total} 1"   # loaded from disk


def test_a_program_that_does_not_lower_never_imports_numba(tmp_path):
    code = textwrap.dedent("""
        import sys, numpy as np
        from autobatch import examples
        from autobatch.backends.numpy import NumpyBackend
        from autobatch.pipeline import argument_types, compile_program
        matrix, weights = examples.nuts_problem(8)
        x = np.ones((2, 8))
        b = NumpyBackend()
        c = compile_program(examples.nuts_shaped(matrix, weights, 2), argument_types([x], b), b)
        print(c.engine(b), "numba" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, AUTOBATCH_NATIVE_CACHE=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["vm", "False"]
