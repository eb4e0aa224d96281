"""One conformance suite that every backend runs: NumPy (compact
selections), masked NumPy, TensorFlow eager, graph and XLA.

Each backend must (1) implement the protocol's operations with the meaning
:mod:`autobatch.backends.base` gives them, whatever its kind of selection
(compact rows, masks, buckets), (2) declare its optional abilities on the
base class's attributes and methods (a backend that declares compaction or
phases provides what they need), and (3) run every program of
:mod:`autobatch.examples` to the plain-Python results, raising
StackOverflowError where a thread needs too many pending calls.  A new VM
backend is added to BACKENDS and must pass all of it.  The JAX backend is
not a VM backend (one XLA loop, programs without calls): it must declare
what the pipeline reads and run every call-free example to the same
results, and refuse the others with a ProgramError naming the call.
"""
import numpy as np
import pytest

from autobatch import examples
from autobatch.backends.base import Backend
from autobatch.errors import StackOverflowError
from autobatch.instructions import TensorType
from autobatch.virtual_machine import execute

BACKENDS = ["numpy", "numpy-masked", "tf-eager", "tf-graph", "tf-xla"]

I64 = TensorType(np.int64, ())
F64x2 = TensorType(np.float64, (2,))


@pytest.fixture(params=BACKENDS)
def backend(request):
    name = request.param
    if name == "numpy":
        from autobatch.backends.numpy import NumpyBackend
        return NumpyBackend()
    if name == "numpy-masked":
        from autobatch.backends.numpy import MaskedNumpyBackend
        return MaskedNumpyBackend()
    request.getfixturevalue("tf")
    from autobatch.backends.tf import TensorFlowBackend
    return TensorFlowBackend(name.split("-")[1])


def call(backend, compute):
    """``compute()``, where the backend's operations are meant to run: the
    XLA mode's inside ``tf.function(jit_compile=True)`` (its scatters rely on
    XLA dropping out-of-range updates), the others as they are."""
    if getattr(backend, "mode", None) == "xla":
        import tensorflow as tf
        return tf.function(compute, jit_compile=True, autograph=False)()
    return compute()


def host(backend, value):
    """A backend array as a NumPy array."""
    value = backend.to_numpy(value)
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


# -- (1) the operations -------------------------------------------------------------------------

def test_storage(backend):
    assert host(backend, backend.fill(I64, 4, 7)).tolist() == [7, 7, 7, 7]
    assert backend.size(backend.fill(F64x2, 3)) == 3
    stack = host(backend, backend.stack(I64, 4, 3, 9))
    assert stack.dtype == np.int64 and (stack == 9).all() and 4 in stack.shape
    user = np.array([[1.0, 2.0]])
    batched = host(backend, backend.as_batched(user, F64x2, 3))
    assert batched.tolist() == [[1.0, 2.0]] * 3       # a batch of 1 broadcasts
    user[0, 0] = 5.0
    assert batched[0, 0] == 1.0                         # never aliases the user's value


def test_types(backend):
    weak = backend.type_of(1, 4)
    assert weak.weak and weak.shape == ()
    assert backend.type_of(np.zeros((4, 2), np.float32), 4) == TensorType(np.float32, (2,))
    with pytest.raises(TypeError):
        backend.type_of(np.zeros((3, 2)), 4)
    ones = host(backend, backend.placeholder(F64x2, 2))
    assert ones.shape == (2, 2) and ones.dtype == np.float64


def test_select_read_write(backend):
    pc = backend.as_batched(np.array([0, 1, 0, 2, 0]), TensorType(np.int32, ()), 5)
    values = backend.as_batched(np.arange(5) * 10, I64, 5)
    sel = backend.select(pc, 0)
    out = backend.write(values, sel, backend.read(values, sel) + 1)
    assert host(backend, out).tolist() == [1, 10, 21, 30, 41]
    out = backend.write(out, backend.select(pc, 2), 5)  # a scalar broadcasts
    assert host(backend, out).tolist() == [1, 10, 21, 5, 41]


def test_frames(backend):
    def compute():
        pc = backend.as_batched(np.array([1, 0, 1]), TensorType(np.int32, ()), 3)
        stack = backend.stack(I64, 3, 4)
        sel = backend.select(pc, 1)
        depth = backend.read(backend.as_batched(np.array([2, 0, 3]), I64, 3), sel)
        stack = backend.write_frame(stack, sel, depth, 7)
        back = backend.read_frame(stack, sel, depth)
        return backend.write(backend.fill(I64, 3), sel, back)

    assert host(backend, call(backend, compute)).tolist() == [7, 0, 7]


def test_split_and_merge(backend):
    pc = backend.as_batched(np.zeros(4, np.int32), TensorType(np.int32, ()), 4)
    x = backend.as_batched(np.array([3, -1, 4, -5]), I64, 4)
    sel = backend.select(pc, 0)
    value = backend.read(x, sel)
    split = backend.split(sel, value > 0)
    pos = backend.narrow(value, split, True) * 10
    neg = backend.narrow(value, split, False) * 0 - 1
    merged = backend.merge(split, pos, neg, I64)
    assert host(backend, backend.write(backend.fill(I64, 4), sel, merged)).tolist() == \
        [30, -1, 40, -1]
    assert int(backend.reduce_min(backend.as_batched(np.array([4, 2, 9]), I64, 3))) == 2


def test_check_raises_the_engines_error(backend):
    pc = backend.as_batched(np.array([0, 1]), TensorType(np.int32, ()), 2)
    sel = backend.select(pc, 0)
    ok = backend.read(backend.as_batched(np.array([True, False]), TensorType(np.bool_, ()), 2),
                      sel)
    backend.check(ok, sel, lambda: AssertionError("never"))  # thread 1 is not selected
    bad = backend.read(backend.as_batched(np.array([False, True]), TensorType(np.bool_, ()), 2),
                       sel)
    with pytest.raises(StackOverflowError):
        backend.check(bad, sel, lambda: StackOverflowError("f", 3))


# -- (2) declared abilities ---------------------------------------------------------------------

def test_abilities_are_declared_on_the_base_class(backend):
    assert isinstance(backend, Backend)
    for attribute in ("compaction", "fused_loops", "phase_sizes", "run_vm", "run_on_dummies",
                      "cache_key", "wrap_block", "while_loop", "switch_case"):
        assert hasattr(Backend, attribute), attribute
    assert isinstance(backend.compaction, bool) and isinstance(backend.fused_loops, bool)
    if backend.compaction:
        for needed in ("running_threads", "take_threads"):
            assert callable(getattr(type(backend), needed)), needed
    if type(backend).phase_sizes is not Backend.phase_sizes:
        for needed in ("more_running", "pack_running", "inert_rows", "take_rows",
                       "put_rows", "is_storage"):
            assert callable(getattr(type(backend), needed)), needed
    assert backend.cache_key() == type(backend)().cache_key() if not hasattr(
        backend, "mode") else backend.cache_key() == type(backend)(backend.mode).cache_key()


# -- (3) every example, and overflow ---------------------------------------------------------

RNG = np.random.default_rng(5)
NUTS_MATRIX, NUTS_WEIGHTS = examples.nuts_problem(size=5, seed=1)


def _cases():
    n = RNG.integers(0, 10, 9)
    yield "fib", examples.fibonacci(), [n], np.array([examples.fib_python(int(v)) for v in n])
    for tail in (True, False):
        yield (f"even_odd_{tail}", examples.even_odd(tail), [n],
               np.array([examples.is_even_python(int(v)) for v in n]))
    c = RNG.integers(1, 30, 9)
    yield ("collatz", examples.collatz(), [c],
           np.array([examples.collatz_python(int(v)) for v in c]))
    a, b = RNG.integers(1, 50, 7), RNG.integers(0, 50, 7)
    want = [examples.gcd_python((int(x), int(y))) for x, y in zip(a, b, strict=True)]
    yield ("gcd", examples.gcd_pairs(), [(a, b)],
           (np.array([w[0] for w in want]), np.array([w[1] for w in want])))
    x = RNG.integers(-3, 4, (4, 5)).astype(np.float64)
    want = [examples.nuts_python(r, NUTS_MATRIX, NUTS_WEIGHTS, max_depth=3) for r in x]
    yield ("nuts", examples.nuts_shaped(NUTS_MATRIX, NUTS_WEIGHTS, max_depth=3), [x],
           (np.stack([w[0] for w in want]), np.array([w[1] for w in want])))


CASES = list(_cases())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_example_matches_plain_python(backend, case):
    _, program, args, want = case
    got = execute(program, args, backend, 12)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        pairs = zip(got, want)
    else:
        pairs = [(got, want)]
    for g, w in pairs:
        g = host(backend, g)
        assert g.shape == w.shape and np.array_equal(g, w), (g, w)


def test_stack_overflow_raises(backend):
    with pytest.raises(StackOverflowError, match="max_stack_depth=4"):
        execute(examples.fibonacci(), [np.array([2, 9, 3])], backend, 4)


# -- the JAX backend: not a VM backend (no calls), same results or a named error --------------

@pytest.fixture(scope="module")
def jax_backend():
    from conftest import need
    need("jax")
    from autobatch.backends.jax import JaxBackend
    return JaxBackend()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_jax_runs_every_call_free_example_and_names_the_call_otherwise(jax_backend, case):
    import autobatch.pipeline as pipeline
    from autobatch.errors import ProgramError
    _, program, args, want = case
    has_calls = any(fn.callees() for fn in program.functions)
    sig = pipeline.argument_types(args, jax_backend)
    compiled = pipeline.compile_program(program, sig, jax_backend)
    if has_calls:
        with pytest.raises(ProgramError, match="without calls"):
            jax_backend.compile(compiled.program)
        return
    got = jax_backend.compile(compiled.program).run(args)
    pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        g = np.asarray(g)
        assert g.shape == w.shape and np.array_equal(g, w), (g, w)


def test_jax_declares_what_the_pipeline_reads(jax_backend):
    assert jax_backend.compiles_programs is True
    assert jax_backend.cache_key() == type(jax_backend)().cache_key()
    assert jax_backend.run_on_dummies(lambda x: x + 1, [np.ones(2)]).tolist() == [2.0, 2.0]
