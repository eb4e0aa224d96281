"""autobatch (NumPy) against its peers, every one measured in this run.

    python benchmarks/bench_autobatch_peers.py [--repeat 5] [--quick] [--no-jax] [--no-tfp]
        [--jax-python .jax-venv/bin/python] [--tfp-python .tfp-venv/bin/python]
        [--nuts-sampler 100,1000,10000] [--nuts-steps 10]

Workloads (inputs drawn uniformly, seeded; the same arrays go to every
engine): Collatz step counts (n <= 1,000), gcd by Euclid's loop on a pair
(a, b <= 10^6), the NUTS-shaped program (a loop around a doubly recursive
tree build whose leaf does a 256 x 256 matrix-vector product, with a
data-dependent early stop; integer-valued float64, so every engine's result is
bit-identical), each at batch 1,000 and 10,000; recursive fib n <= 20 at
batch 1,000.

Peers, side by side:

- autobatch NumPy: the engine the pipeline picks on the NumPy backend with
  the native engine off (the fused loop for call-free programs, the VM
  otherwise); autobatch native: ``NumpyBackend(native=True)``, the numba
  engine (:mod:`autobatch.native`; "n/a" where the program does not lower:
  NUTS-shaped's vector values), its "first call" compiling the kernel (a
  new cache directory per row, nothing compiled kept in memory; numba's
  compiler started once before any timing, as JAX's runtime is) and "first
  call native, disk cache" the same again with the kernel loaded from
  numba's disk cache; autobatch JAX: the
  JAX backend (call-free programs: Collatz, gcd), in this process (JAX's
  runtime started before any timing; the backend's import makes its CPU
  client dispatch synchronously, see :mod:`autobatch.backends.jax`; NumPy in,
  NumPy out).  "First call" types, allocates, lowers, fuses or jits, and
  runs, from scratch; "best ours" is the fastest of the three (its first
  call is in "first call ours"); "default" is what ``NumpyBackend()`` runs
  with numba installed (native where the program lowers, else the NumPy
  column's engine).
- JAX: ``jax.jit(jax.vmap(f))`` with ``lax.while_loop`` / ``lax.cond``
  (64-bit, JAX's defaults otherwise), in its own venv (``python3 -m venv
  .jax-venv && .jax-venv/bin/pip install "jax[cpu]"``), run in a subprocess
  on device arrays made before timing; "first call" is tracing + compiling +
  the first run.  JAX cannot batch recursion
  (no fib); its NUTS-shaped program is the same computation written as one
  while loop over leaf steps (the tree recursion flattened by hand), which
  vmap runs for every lane until the slowest lane stops.
- hand NumPy: the same loops vectorized by hand, dropping lanes that are
  done (none for fib: recursion).
- plain Python: the one-example twin (``autobatch.examples``) looped over
  the batch.
- TFP 0.25 ``auto_batching`` (TensorFlow backend under XLA) from ``make tfp``'s
  ``.tfp-venv`` through ``benchmarks/bench_autobatch_tf.py``'s worker (Collatz,
  NUTS-shaped and fib; TFP's frontend has no loops, so they are written as
  tail recursion there; no gcd).

The NUTS sampler table (``--nuts-sampler CHAINS,...``; ``--only
nuts-sampler`` runs it alone): TFP 0.25's own ``NoUTurnSampler`` (TFP's
``nuts_autobatching.py``, unmodified) as a TFP user runs it -- inside
``tf.function``, ``sample_chain`` of ``--nuts-steps`` steps on a normal(1, 2)
target (step size 0.2, tree depth 3, 2 unrolled leapfrogs) -- on TFP's own
``auto_batching`` and on autobatch put in its place (each TensorFlow mode:
graph, the sampler's default; eager; XLA), in TFP's venv, one fresh process
per cell (``tests/autobatch/tfp_nuts.py``).  "First call" traces, compiles
and runs; "steady" is the median of ``--repeat`` further calls.  The samples
differ from TFP's (other random draws, by design: see
docs/autobatch/tfp_differences.rst); tests/autobatch/test_tfp_nuts.py checks
them statistically.  JAX has no peer for this row (it does not run TFP's
TensorFlow sampler); its NUTS-shaped peer is in the table above.

Every engine's result is checked against plain Python.  Steady times are
medians of ``--repeat`` runs (plain Python: one run where a run takes over
2 s); ratios are of times measured in this run.  The NumPy column and hand
NumPy are timed alternately (one run of each, ``--repeat`` times), so that
their ratio holds under load that drifts during the run.  BLAS runs one thread
(set before NumPy is imported) in this process and in JAX's.
"""
import argparse
import json
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1")

import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

import _bench  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUTS_SIZE = 256
MAX_DEPTH = 6
STOP_ONE_IN = 11.0
MODULUS = 1009.0


def nuts_problem(size: int = NUTS_SIZE, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """As :func:`autobatch.examples.nuts_problem` (repeated here so that the
    JAX worker needs no autobatch)."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(-1, 2, size=(size, size)).astype(np.float64)
    weights = rng.integers(0, 5, size=size).astype(np.float64)
    return matrix, weights


def median_time(fn: Callable[[], Any], repeat: int, slow: float = 2.0) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if times[-1] > slow and len(times) >= 1 and repeat > 1 and fn.__name__ == "python":
            break
    return _bench.median(times)


def paired_medians(a: Callable[[], Any], b: Callable[[], Any], repeat: int
                   ) -> Tuple[float, float]:
    """Median times of ``a`` and ``b`` run alternately (a, b, a, b, ...), so
    that load drifting on a shared machine during the run weighs on both."""
    times: Tuple[List[float], List[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in ((a, times[0]), (b, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return _bench.median(times[0]), _bench.median(times[1])


def same(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    return np.array_equal(np.asarray(got), np.asarray(want))


# -- hand-vectorized NumPy ---------------------------------------------------------------------

def hand_collatz(n: np.ndarray) -> np.ndarray:
    steps = np.zeros_like(n)
    idx = np.flatnonzero(n != 1)
    cur = n[idx]
    count = np.zeros_like(cur)
    while idx.size:
        cur = np.where(cur % 2 == 0, cur // 2, 3 * cur + 1)
        count += 1
        done = cur == 1
        if done.any():
            steps[idx[done]] = count[done]
            keep = ~done
            idx, cur, count = idx[keep], cur[keep], count[keep]
    return steps


def hand_gcd(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    g = a.copy()
    steps = np.zeros_like(a)
    idx = np.flatnonzero(b != 0)
    x, y, count = a[idx], b[idx], np.zeros(idx.size, a.dtype)
    while idx.size:
        x, y = y, x % y
        count += 1
        done = y == 0
        if done.any():
            g[idx[done]] = x[done]
            steps[idx[done]] = count[done]
            keep = ~done
            idx, x, y, count = idx[keep], x[keep], y[keep], count[keep]
    return g, steps


def hand_nuts(xs: np.ndarray, matrix: np.ndarray, weights: np.ndarray
              ) -> Tuple[np.ndarray, np.ndarray]:
    """Leaf steps in order (tree ``d`` is ``2**d`` leaves), lanes dropped at
    their first stop or after ``MAX_DEPTH`` trees."""
    mt = np.ascontiguousarray(matrix.T)
    out = xs.copy()
    depth = np.full(xs.shape[0], MAX_DEPTH, np.int64)
    idx = np.arange(xs.shape[0])
    x = xs
    leaves = 0
    for d in range(MAX_DEPTH):
        for _ in range(2 ** d):
            x = np.mod(x @ mt, MODULUS)
            leaves += 1
            stop = np.mod(x @ weights, STOP_ONE_IN) == 0
            if stop.any():
                out[idx[stop]] = x[stop]
                depth[idx[stop]] = d + 1
                keep = ~stop
                idx, x = idx[keep], x[keep]
            if not idx.size:
                return out, depth
    out[idx] = x
    return out, depth


# -- JAX (runs in .jax-venv) --------------------------------------------------------------------

def jax_worker(key: str, data: str, repeat: int) -> None:
    """Run one workload with jit(vmap); prints one JSON line, saves the result."""
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax import lax

    inputs = dict(np.load(data))
    if key == "collatz":
        def one(n):
            def body(s):
                n, steps = s
                n = lax.cond(n % 2 == 0, lambda v: v // 2, lambda v: 3 * v + 1, n)
                return n, steps + 1
            return lax.while_loop(lambda s: s[0] != 1, body, (n, jnp.zeros_like(n)))[1]
        args = [jnp.asarray(inputs["n"])]
    elif key == "gcd":
        def one(a, b):
            def body(s):
                a, b, steps = s
                return b, a % b, steps + 1
            a, _, steps = lax.while_loop(lambda s: s[1] != 0, body, (a, b, jnp.zeros_like(a)))
            return a, steps
        args = [jnp.asarray(inputs["a"]), jnp.asarray(inputs["b"])]
    elif key == "nuts":
        matrix, weights = nuts_problem()
        mt, w = jnp.asarray(matrix.T), jnp.asarray(weights)
        total = 2 ** MAX_DEPTH - 1

        def one(x):
            def body(s):
                x, leaves, stop = s
                y = jnp.mod(x @ mt, MODULUS)
                return y, leaves + 1, jnp.mod(y @ w, STOP_ONE_IN) == 0

            def more(s):
                return jnp.logical_and(jnp.logical_not(s[2]), s[1] < total)
            x, leaves, _ = lax.while_loop(more, body, (x, jnp.int64(0), jnp.bool_(False)))
            # leaves 1 | 2-3 | 4-7 | ...: tree d holds leaves 2**d .. 2**(d+1) - 1
            starts = jnp.asarray([2 ** d for d in range(MAX_DEPTH)], jnp.int64)
            depth = jnp.sum(leaves >= starts).astype(jnp.int64)
            return x, depth
        args = [jnp.asarray(inputs["x"])]
    else:
        raise SystemExit(f"unknown workload {key}")
    fn = jax.jit(jax.vmap(one))
    t0 = time.perf_counter()
    result = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    parts = result if isinstance(result, tuple) else (result,)
    np.savez(data + ".out.npz", *[np.asarray(p) for p in parts])
    print(json.dumps({"first": first, "steady": _bench.median(times),
                      "jax": jax.__version__}), flush=True)


def run_peer(python: str, script: str, flag: str, args: List[Any], data: str, want: Any,
             timeout: float) -> Optional[Dict[str, Any]]:
    """A peer's worker (``script flag *args``, in ``python``: the peer's
    venv) in a fresh process; its timings, its results (saved beside
    ``data``) checked against ``want``."""
    out = _bench.run_worker(script, args, {"TF_CPP_MIN_LOG_LEVEL": "3",
                                           "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"},
                            timeout=timeout, flag=flag, python=python)
    if "error" in out:
        return {"error": out["error"]}
    saved = np.load(data + ".out.npz")
    parts = tuple(saved[f"arr_{i}"] for i in range(len(saved.files)))
    got = parts if isinstance(want, tuple) else parts[0]
    if not same(got, want):
        raise AssertionError(f"{script} {flag} {args[:1]}: the peer disagrees with plain Python")
    return out


# -- workloads ------------------------------------------------------------------------------------

class Workload:
    def __init__(self, key: str, label: str, batch: int, inputs: Dict[str, np.ndarray],
                 program: Callable[[], Any], args: List[Any], python: Callable[[], Any],
                 hand: Optional[Callable[[], Any]], depth: int,
                 tfp_key: Optional[str]) -> None:
        self.key, self.label, self.batch = key, label, batch
        self.inputs, self.program, self.args = inputs, program, args
        self.python, self.hand, self.depth, self.tfp_key = python, hand, depth, tfp_key


def workloads(quick: bool, seed: int) -> List[Workload]:
    from autobatch import examples
    rng = np.random.default_rng(seed)
    matrix, weights = nuts_problem()
    out = []
    for batch in ((100, 1_000) if quick else (1_000, 10_000)):
        n = rng.integers(1, 1_001, batch)
        out.append(Workload(
            "collatz", "Collatz n<=1,000", batch, {"n": n}, examples.collatz, [n],
            lambda n=n: np.array([examples.collatz_python(int(v)) for v in n]),
            lambda n=n: hand_collatz(n), 1, "collatz10k"))
        a, b = rng.integers(0, 10 ** 6, batch), rng.integers(0, 10 ** 6, batch)

        def gcd_python(a=a, b=b):
            pairs = [examples.gcd_python((int(x), int(y))) for x, y in zip(a, b)]
            return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        out.append(Workload("gcd", "gcd (while)", batch, {"a": a, "b": b},
                            examples.gcd_pairs, [(a, b)], gcd_python,
                            lambda a=a, b=b: hand_gcd(a, b), 1, None))
        x = rng.integers(0, 1009, (batch // (10 if quick else 1), NUTS_SIZE)) \
            .astype(np.float64)

        def nuts_python(x=x):
            pairs = [examples.nuts_python(row, matrix, weights) for row in x]
            return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        out.append(Workload("nuts", "NUTS-shaped, 256 matvec", x.shape[0], {"x": x},
                            lambda: examples.nuts_shaped(matrix, weights), [x], nuts_python,
                            lambda x=x: hand_nuts(x, matrix, weights), MAX_DEPTH + 2,
                            "nuts1k"))
    n = rng.integers(0, 21, 100 if quick else 1_000)
    out.append(Workload("fib", "fib n<=20 (recursive)", n.shape[0], {"n": n},
                        examples.fibonacci, [n],
                        lambda n=n: np.array([examples.fib_python(int(v)) for v in n]),
                        None, 21, "fib1k"))
    return out


def _first_run(work: Workload, backend: Any) -> Optional[Tuple[str, Any, Any, float]]:
    """Type, allocate, lower (fuse, generate) and run once, from scratch:
    ``(engine, runner, result, seconds)``; None where the backend cannot run
    the program (JAX and calls; the native engine and vector values)."""
    from autobatch.errors import NativeEngineError, ProgramError
    from autobatch.pipeline import argument_types, compile_program

    t0 = time.perf_counter()
    compiled = compile_program(work.program(), argument_types(work.args, backend), backend)
    try:
        engine = compiled.engine(backend)
        runner = compiled.runner(backend)
    except (ProgramError, NativeEngineError):
        return None
    if runner is None:
        from autobatch.virtual_machine import VirtualMachine
        runner = VirtualMachine(compiled.lowered, backend, work.depth)
    result = runner.run(work.args, work.depth) if engine == "native" else runner.run(work.args)
    return engine, runner, result, time.perf_counter() - t0


def run_ours(work: Workload, repeat: int, backend: Any, want: Any = None
             ) -> Optional[Dict[str, Any]]:
    """autobatch on ``backend`` with the engine the pipeline picks (None
    where the backend cannot run the program).  The native engine's first
    call compiles (its cache directory is new for this run); ``"cached"``
    is a first call again, its kernel loaded from numba's disk cache."""
    if getattr(backend, "native", False):
        # every row compiles: nothing in memory, a new cache directory
        from autobatch import native
        native.forget_compiled()
        os.environ["AUTOBATCH_NATIVE_CACHE"] = tempfile.mkdtemp(prefix="bench-native-")
    done = _first_run(work, backend)
    if done is None:
        return None
    engine, runner, result, first = done
    want = work.python() if want is None else want
    if not same(result, want):
        raise AssertionError(f"{work.label}: autobatch ({backend}) disagrees with plain Python")
    if engine == "native":
        steady = median_time(lambda: runner.run(work.args, work.depth), repeat)
        from autobatch import native
        native.forget_compiled()
        cached = _first_run(work, backend)
        if not same(cached[2], want):
            raise AssertionError(f"{work.label}: autobatch (native, cached) disagrees")
        return {"engine": engine, "first": first, "steady": steady, "want": want,
                "cached": cached[3]}
    steady = median_time(lambda: runner.run(work.args), repeat)
    return {"engine": engine, "first": first, "steady": steady, "want": want,
            "rerun": lambda: runner.run(work.args)}


def tfp_run(python: str, work: Workload, repeat: int, want: Any, timeout: float
            ) -> Optional[Dict[str, Any]]:
    if work.tfp_key is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "input.npz")
        np.savez(data, input=next(iter(work.inputs.values())))
        depth = {"collatz10k": 200, "nuts1k": 2 * MAX_DEPTH + 2, "fib1k": 25}[work.tfp_key]
        return run_peer(python, os.path.join(ROOT, "benchmarks", "bench_autobatch_tf.py"),
                        "--tfp-worker", [work.tfp_key, "xla", repeat, depth, data], data, want,
                        timeout)


def jax_run(python: str, work: Workload, repeat: int, want: Any, timeout: float
            ) -> Optional[Dict[str, Any]]:
    if work.key == "fib":
        return None
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "input.npz")
        np.savez(data, **work.inputs)
        return run_peer(python, __file__, "--jax-worker", [work.key, data, repeat], data, want,
                        timeout)


def fmt(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 0.1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def peer_cell(result: Optional[Dict[str, Any]], field: str) -> Tuple[str, Optional[float]]:
    if result is None:
        return "n/a", None
    if "error" in result:
        return f"error: {result['error'][:40]}", None
    return fmt(result[field]), result[field]


NUTS_DRIVER = os.path.join(ROOT, "tests", "autobatch", "tfp_nuts.py")
#: The sampler rows: label, settings for tfp_nuts.py.
NUTS_ENGINES = (("TFP auto_batching", {"impl": "tfp"}),
                ("autobatch TF graph", {"impl": "autobatch"}),
                ("autobatch TF eager", {"impl": "autobatch", "backend": "eager"}),
                ("autobatch TF XLA", {"impl": "autobatch", "backend": "xla"}))


def nuts_sampler_cell(python: str, chains: int, steps: int, repeat: int, engine: Dict[str, Any],
                      timeout: float) -> Optional[Tuple[float, float]]:
    """``(first call, steady median)`` seconds of TFP's NoUTurnSampler on one
    engine, in a fresh process of TFP's venv; None where it failed (the
    error is printed to stderr)."""
    settings = dict(engine, regime="function", chains=chains, steps=steps, calls=1 + repeat)
    done = _bench.run_worker(NUTS_DRIVER, [json.dumps(settings)], {"TF_CPP_MIN_LOG_LEVEL": "3"},
                             timeout=timeout, flag=None, python=python)
    if "error" in done:
        print(f"NUTS sampler {settings} failed: {done['error']}\n{done.get('stderr', '')}",
              file=sys.stderr)
        return None
    times = done["seconds"]
    return times[0], _bench.median(times[1:])


def nuts_sampler_table(python: str, chain_counts: List[int], steps: int, repeat: int,
                       timeout: float) -> None:
    print(f"\nTFP 0.25 NoUTurnSampler, tf.function(sample_chain), {steps} steps "
          f"(first call | steady, median of {repeat}):\n")
    names = [label for label, _ in NUTS_ENGINES]
    table = _bench.Table(["chains"] + [f"{n} {when}" for n in names for when in ("first", "steady")]
                         + ["TFP / best ours steady", "TFP / best ours first"],
                         "r" * (3 + 2 * len(names)))
    for chains in chain_counts:
        cells = [nuts_sampler_cell(python, chains, steps, repeat, engine, timeout)
                 for _, engine in NUTS_ENGINES]
        tfp, ours = cells[0], [c for c in cells[1:] if c is not None]
        best_steady = min((c[1] for c in ours), default=None)
        best_first = min((c[0] for c in ours), default=None)
        shown = [x for c in cells for x in ((fmt(c[0]), fmt(c[1])) if c else ("failed", "failed"))]
        table.row(f"{chains:,}", *shown, ratio(tfp and tfp[1], best_steady),
                  ratio(tfp and tfp[0], best_first))
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="batches / 10")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None,
                        help="comma-separated workload keys (collatz,gcd,nuts,fib)")
    parser.add_argument("--jax-python", default=os.path.join(ROOT, ".jax-venv", "bin",
                                                             "python"))
    parser.add_argument("--tfp-python", default=os.path.join(ROOT, ".tfp-venv", "bin",
                                                             "python"))
    parser.add_argument("--no-jax", action="store_true",
                        help="run neither JAX peer nor autobatch's JAX backend")
    parser.add_argument("--no-tfp", action="store_true")
    parser.add_argument("--no-native", action="store_true",
                        help="do not run autobatch's native (numba) engine")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per peer subprocess")
    parser.add_argument("--nuts-sampler", default=None,
                        help="chain counts for TFP's NoUTurnSampler table (e.g. "
                             "100,1000,10000; needs the TFP venv)")
    parser.add_argument("--nuts-steps", type=int, default=10,
                        help="sample_chain steps per call in the NUTS sampler table")
    parser.add_argument("--jax-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jax_worker:
        key, data, repeat = args.jax_worker
        jax_worker(key, data, int(repeat))
        return
    sys.path.insert(0, ROOT)
    jax_python = None if args.no_jax or not os.path.exists(args.jax_python) \
        else args.jax_python
    tfp_python = None if args.no_tfp or not os.path.exists(args.tfp_python) \
        else args.tfp_python
    if args.only == "nuts-sampler":
        if tfp_python is None:
            raise SystemExit(f"the NUTS sampler table needs TFP's venv ({args.tfp_python}: "
                             f"make tfp)")
        nuts_sampler_table(tfp_python, [int(c) for c in (args.nuts_sampler or
                                                          "100,1000,10000").split(",")],
                           args.nuts_steps, args.repeat, args.timeout)
        return
    print(f"NumPy {np.__version__}, BLAS threads 1; steady: median of {args.repeat}; "
          f"JAX: {jax_python or 'not run'}; TFP 0.25 (XLA): {tfp_python or 'not run'}\n")
    table = _bench.Table(["workload", "batch", "NumPy engine", "autobatch NumPy", "autobatch JAX",
                          "autobatch native", "JAX jit(vmap)", "hand NumPy", "plain Python",
                          "TFP 0.25 XLA", "best ours / JAX", "NumPy / hand", "default / hand",
                          "Python / best ours", "first call ours",
                          "first call native, disk cache", "first call JAX",
                          "first ours / JAX"], "lrl" + "r" * 15)
    from autobatch.backends.numpy import NumpyBackend
    from autobatch import native
    native_backend = None
    if not args.no_native and native.available():
        # numba's compiler starts once per process before any timing, as
        # JAX's runtime does.
        import numba
        numba.njit(lambda v: v + 1)(1)
        native_backend = NumpyBackend(native=True)
    jax_backend = None
    if not args.no_jax:
        from autobatch.backends.jax import JaxBackend
        jax_backend = JaxBackend()
        # JAX's runtime starts once per process, before any first call is
        # timed (the JAX worker's jnp.asarray of its inputs does the same).
        import jax.numpy as jnp
        jnp.zeros(1).block_until_ready()
    only = set(args.only.split(",")) if args.only else None
    start = time.perf_counter()
    for work in workloads(args.quick, args.seed):
        if only and work.key not in only:
            continue
        ours = run_ours(work, args.repeat, NumpyBackend(native=False))
        want = ours["want"]
        ours_jax = run_ours(work, args.repeat, jax_backend, want) \
            if jax_backend is not None and work.key in ("collatz", "gcd") else None
        ours_native = run_ours(work, args.repeat, native_backend, want) \
            if native_backend is not None else None
        best = min((r for r in (ours, ours_jax, ours_native) if r is not None),
                   key=lambda r: r["steady"])
        # what NumpyBackend() runs by default: native where the program lowers
        default = ours_native if ours_native is not None else ours
        jax = jax_run(jax_python, work, args.repeat, want, args.timeout) \
            if jax_python else None
        tfp = tfp_run(tfp_python, work, max(1, args.repeat // 2), want, args.timeout) \
            if tfp_python else None
        hand = None
        if work.hand is not None:
            if not same(work.hand(), want):
                raise AssertionError(f"{work.label}: hand NumPy disagrees with plain Python")
            # the NumPy engine again, alternating with the hand loop: the
            # "NumPy / hand" ratio is of times taken side by side
            ours["steady"], hand = paired_medians(ours["rerun"], work.hand, args.repeat)

        def python():
            return work.python()
        py = median_time(python, args.repeat)
        jax_steady, jax_s = peer_cell(jax, "steady")
        jax_first, jax_f = peer_cell(jax, "first")
        tfp_steady, _ = peer_cell(tfp, "steady")
        ours_jax_cell = fmt(ours_jax["steady"]) if ours_jax else "n/a"
        native_cell = fmt(ours_native["steady"]) if ours_native else "n/a"
        cached_cell = fmt(ours_native["cached"]) if ours_native else "n/a"
        table.row(work.label, f"{work.batch:,}", ours["engine"], fmt(ours["steady"]),
                  ours_jax_cell, native_cell, jax_steady, fmt(hand), fmt(py), tfp_steady,
                  ratio(best["steady"], jax_s), ratio(ours["steady"], hand),
                  ratio(default["steady"], hand), ratio(py, best["steady"]),
                  fmt(best["first"]), cached_cell, jax_first, ratio(best["first"], jax_f))
        sys.stdout.flush()
    if args.nuts_sampler and tfp_python is not None:
        nuts_sampler_table(tfp_python, [int(c) for c in args.nuts_sampler.split(",")],
                           args.nuts_steps, args.repeat, args.timeout)
    print(f"\nours / X below 1: autobatch is faster.  Total bench time "
          f"{time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
    main()
