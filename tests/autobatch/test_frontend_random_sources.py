"""Random Python functions through the frontend, as users write them: a
bounded ``while`` loop whose body uses conditional expressions
(``n // 2 if n % 2 == 0 else 3 * n + 1``), ``and``/``or`` on conditions and
on values, ``not``, chained comparisons (``0 < n < 50``), early ``return``
and ``break`` inside the loop.  Each is written to a source file (the
frontend reads source), batched, and run on every backend; each backend
must give, thread by thread, what the plain Python function gives.

The JAX backend compiles call-free programs whole; these have no calls, so
it must run every one of them (it refuses programs with calls, by name:
test_jax_backend.py)."""
import importlib.util
import random

import numpy as np
import pytest
from conftest import need

import autobatch
from autobatch.backends.numpy import NumpyBackend

STATEMENTS = [
    "n = n // 2 if n % 2 == 0 else (3 * n + 1) % 1000",
    "acc = (acc + (n if n > 10 and acc < 300 else 1)) % 1000",
    "if 0 < n < 50 or acc % 7 == 3:\n    acc = acc + 2",
    "if n % 11 == 5:\n    return acc + n",
    "if acc > 900 and not n < 3:\n    break",
    "acc = (acc + (n and acc) + (acc or 3)) % 1000",
    "if not (n > 100):\n    n = n + 7",
    "flag = n > 3 and acc > 5\nif flag or i == 4:\n    acc = acc + 1",
    "n = n - 1 if 3 <= n <= 400 != acc else n + 1",
    "if n == acc or (n > 500 and acc % 2 == 0):\n    return n - acc",
]


def source(seed):
    """One random function ``f(n)`` (see the module doc), as source text."""
    rng = random.Random(seed)
    body = ["acc = n * 0", "i = n * 0", f"while i < {rng.randint(3, 14)}:"]
    for stmt in rng.sample(STATEMENTS, rng.randint(3, 6)):
        body += ["    " + line for line in stmt.split("\n")]
    body += ["    i = i + 1", f"return {rng.choice(['acc + i', 'n', 'acc * 2 + n'])}"]
    return "def f(n):\n" + "\n".join("    " + line for line in body) + "\n"


def load(tmp_path, seed):
    path = tmp_path / f"random_source_{seed}.py"
    path.write_text(source(seed))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


def numpy_backend():
    return NumpyBackend()


def jax_backend():
    need("jax")
    from autobatch.backends.jax import JaxBackend
    return JaxBackend()


def tf_graph_backend():
    need("tensorflow")
    from autobatch.backends.tf import TensorFlowBackend
    return TensorFlowBackend(mode="graph")


SEEDS = list(range(24))
#: (seed, backend) pairs: every seed on NumPy and JAX; the first 8 on
#: TensorFlow (each traces a graph: seconds apiece).
CASES = [pytest.param(seed, make, id=f"{seed}-{name}")
         for name, make, seeds in (("numpy", numpy_backend, SEEDS), ("jax", jax_backend, SEEDS),
                                   ("tf-graph", tf_graph_backend, SEEDS[:8]))
         for seed in seeds]


@pytest.mark.parametrize(("seed", "make_backend"), CASES)
def test_random_user_functions_match_python_on_every_backend(tmp_path, seed, make_backend):
    plain = load(tmp_path, seed)
    ctx = autobatch.Context()
    batched = ctx.batch(type_inference=lambda types: types[0])(plain)
    n = np.random.default_rng(seed).integers(0, 1000, 40)
    want = np.array([plain(int(v)) for v in n])
    backend = make_backend()
    got = np.asarray(batched(n, backend=backend, max_stack_depth=4))
    assert got.shape == want.shape and np.array_equal(got, want), (source(seed), got, want)


def test_the_generator_writes_every_construct():
    """Across the seeds, every statement kind appears (a generator that wrote
    only assignments would test nothing)."""
    text = "\n".join(source(seed) for seed in SEEDS)
    for stmt in STATEMENTS:
        assert stmt.split("\n")[0] in text, stmt
