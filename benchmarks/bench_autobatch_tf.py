"""autobatch on TensorFlow (eager / tf.function / XLA) against TFP 0.25's auto_batching.

    python benchmarks/bench_autobatch_tf.py [--quick] [--repeat 3] [--modes eager,graph,xla]
        [--workloads fib1k,fib10k,collatz10k,nuts1k] [--tfp-python .tfp-venv/bin/python]

Workloads (inputs drawn uniformly, seeded; the same arrays go to both engines):
fib batch 1,000 and 10,000 with n <= 20; Collatz step counts, batch 10,000,
n <= 1,000; the NUTS-shaped program (a loop around a doubly recursive tree
build whose leaf does a 256 x 256 matrix-vector product; integer-valued
floats, so every engine's result is bit-identical), batch 1,000.

autobatch runs the programs as decorated Python (``@ctx.batch``, defined in
this file), each (workload, mode) in a fresh Context, so the first call pays
translation, typing, lowering and tracing/compiling: the "first call" column;
"compile" is first call minus the steady run.  Steady runs: median of
``--repeat`` (1 for eager mode, whose runs are long), half of them before and
half after TFP's runs of the same workload.

TFP 0.25 cannot be installed beside this project's TensorFlow; given a Python
that has it (``--tfp-python``; by default the repo's ``.tfp-venv``, which
``make tfp`` builds, else ``/work/tfp-venv``, when one exists), the same
programs, written in the subset TFP's frontend accepts (recursion instead of
loops, ``def`` type functions, explicit ``else``), run
in a subprocess per (workload, mode) on the same inputs (not eagerly on fib
unless --tfp-eager-fib: TFP's eager VM takes 31 s at batch 1,000 with n <= 14,
2,438 steps, and minutes for these).  Every result (ours and TFP's) is checked
against plain Python.

The machine is shared: absolute times move with its load; compare the ratios
of one run.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import _bench

MAX_NUTS_DEPTH = 6
NUTS_SIZE = 256
STOP_ONE_IN = 11.0

def nuts_matrices(size: int = NUTS_SIZE, seed: int = 0):
    """``(leaf, weights)``: ``x @ leaf`` is the leaf's matrix-vector product
    (a matrix of -1/0/1) and ``y @ weights`` a ``[size, 1]`` column of small
    integers, float64."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(-1, 2, size=(size, size)).astype(np.float64)
    weights = rng.integers(0, 5, size=size).astype(np.float64)
    return np.ascontiguousarray(matrix.T), weights[:, None]


# -- plain Python references ------------------------------------------------------------------

def fib_reference(values: np.ndarray) -> np.ndarray:
    table = [1, 1]
    while len(table) <= int(values.max(initial=1)):
        table.append(table[-1] + table[-2])
    return np.array([table[v] for v in values])


def collatz_reference(values: np.ndarray) -> np.ndarray:
    out = []
    for v in values.tolist():
        count = 0
        while v != 1:
            v = v // 2 if v % 2 == 0 else 3 * v + 1
            count += 1
        out.append(count)
    return np.array(out)


def nuts_reference(xs: np.ndarray, leaf: np.ndarray, weights: np.ndarray):
    def build(row, level):
        if level == 0:
            out = (row @ leaf) % 1009.0
            return out, (out @ weights)[0] % STOP_ONE_IN == 0.0
        out, halt = build(row, level - 1)
        if halt:
            return out, halt
        return build(out, level - 1)

    rows, levels = [], []
    for row in xs:
        level = 0
        while True:
            row, halt = build(row, level)
            level += 1
            if halt or level >= MAX_NUTS_DEPTH:
                break
        rows.append(row)
        levels.append(level)
    return np.stack(rows), np.array(levels)


# -- workloads ------------------------------------------------------------------------------

class Workload:
    def __init__(self, key: str, label: str, batch: int, inputs: List[np.ndarray],
                 reference: Callable[[], Any], depth: int, tfp_depth: int) -> None:
        self.key, self.label, self.batch = key, label, batch
        self.inputs, self.reference = inputs, reference
        self.depth, self.tfp_depth = depth, tfp_depth


def workloads(quick: bool, seed: int) -> Dict[str, Workload]:
    rng = np.random.default_rng(seed)
    out: Dict[str, Workload] = {}
    for key, batch in (("fib1k", 1_000), ("fib10k", 10_000)):
        batch = batch // 10 if quick else batch
        values = rng.integers(0, 21, batch)
        out[key] = Workload(key, "fib n<=20", batch, [values],
                            lambda v=values: fib_reference(v), 21, 25)
    batch = 1_000 if quick else 10_000
    values = rng.integers(1, 1_001, batch)
    out["collatz10k"] = Workload("collatz10k", "Collatz n<=1,000", batch, [values],
                                 lambda v=values: collatz_reference(v), 2, 200)
    batch = 100 if quick else 1_000
    xs = rng.integers(0, 1009, (batch, NUTS_SIZE)).astype(np.float64)
    leaf, weights = nuts_matrices()
    out["nuts1k"] = Workload("nuts1k", "NUTS-shaped, 256 matvec", batch, [xs],
                             lambda v=xs: nuts_reference(v, leaf, weights),
                             MAX_NUTS_DEPTH + 2, 2 * MAX_NUTS_DEPTH + 2)
    return out


def same(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    return np.array_equal(np.asarray(got), np.asarray(want))


# -- autobatch ------------------------------------------------------------------------------

def our_programs() -> Dict[str, Any]:
    """The workloads' programs batched in a new Context (plain Python with
    while loops, as a user writes them)."""
    import autobatch

    ctx = autobatch.Context()
    leaf, weights = nuts_matrices()

    @ctx.batch(type_inference=lambda arg_types: [arg_types[0]])
    def fib(n):
        if n > 1:
            return fib(n - 1) + fib(n - 2)
        return 1

    @ctx.batch()
    def collatz(n):
        steps = 0
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps = steps + 1
        return steps

    @ctx.batch()
    def tree(x, depth):
        if depth == 0:
            y = (x @ leaf) % 1009.0
            return y, (y @ weights)[..., 0] % STOP_ONE_IN == 0.0
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
            if stop or depth >= MAX_NUTS_DEPTH:
                return x, depth

    return {"fib1k": fib, "fib10k": fib, "collatz10k": collatz, "nuts1k": nuts}


class Ours:
    """One workload in one mode on autobatch: the first call at once, steady
    runs on request (so that they can be interleaved with TFP's)."""

    def __init__(self, work: Workload, mode: str) -> None:
        from autobatch.backends.tf import TensorFlowBackend
        self.function = our_programs()[work.key]
        backend = TensorFlowBackend(mode)
        inputs = [np.asarray(a) for a in work.inputs]
        self.call = lambda: self.function(*inputs, backend=backend,
                                          max_stack_depth=work.depth)
        t0 = time.perf_counter()
        result = self.call()
        self.first = time.perf_counter() - t0
        got = tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else \
            np.asarray(result)
        if not same(got, work.reference()):
            raise AssertionError(f"{work.key} ({mode}): autobatch disagrees with plain Python")
        self.times: List[float] = []

    def run(self, times: int) -> None:
        for _ in range(times):
            t0 = time.perf_counter()
            self.call()
            self.times.append(time.perf_counter() - t0)

    @property
    def steady(self) -> float:
        return _bench.median(self.times)


# -- TFP (runs in another Python) -------------------------------------------------------------

def tfp_programs(leaf: np.ndarray, weights: np.ndarray) -> Dict[str, Any]:
    """The programs in TFP's accepted subset, one Context per program (TFP
    types every function of a Context from the entry point)."""
    from tensorflow_probability.python.experimental import auto_batching as ab

    def first_type(types):
        return types[0]

    def second_type(types):
        return types[1]

    def tree_type(types):
        return (types[0], ab.TensorType(np.bool_, ()))

    def pair_type(types):
        return (types[0], types[1])

    fib_ctx = ab.Context()

    @fib_ctx.batch(type_inference=first_type)
    def fib(n):
        if n > 1:
            return fib(n - 1) + fib(n - 2)
        else:
            return 1

    collatz_ctx = ab.Context()

    @collatz_ctx.batch(type_inference=second_type)
    def collatz(n, steps):
        if n == 1:
            return steps
        else:
            if n % 2 == 0:
                return collatz(n // 2, steps + 1)
            else:
                return collatz(3 * n + 1, steps + 1)

    nuts_ctx = ab.Context()

    @nuts_ctx.batch(type_inference=tree_type)
    def tree(x, depth):
        if depth == 0:
            y = (x @ leaf) % 1009.0
            s = (y @ weights)[..., 0] % 11.0 == 0.0
            return y, s
        else:
            y, stop = tree(x, depth - 1)
            if stop:
                return y, stop
            else:
                return tree(y, depth - 1)

    @nuts_ctx.batch(type_inference=pair_type)
    def nuts(x, depth):
        y, stop = tree(x, depth)
        if stop:
            return y, depth + 1
        else:
            if depth + 1 >= 6:
                return y, depth + 1
            else:
                return nuts(y, depth + 1)

    return {"fib1k": fib, "fib10k": fib, "collatz10k": collatz, "nuts1k": nuts}


def tfp_worker(key: str, mode: str, repeat: int, depth: int, data: str) -> None:
    """Run one workload with TFP; prints one JSON line, saves the result."""
    import tensorflow as tf
    from tensorflow_probability.python.experimental import auto_batching as ab

    leaf, weights = nuts_matrices()
    function = tfp_programs(leaf, weights)[key]
    values = tf.constant(np.load(data)["input"])
    extra = [tf.zeros_like(values)] if key == "collatz10k" else []
    if key == "nuts1k":
        extra = [tf.zeros([values.shape[0]], tf.int64)]
    backend = ab.TensorFlowBackend()
    cache: dict = {}

    def call(*args):
        return function(*args, max_stack_depth=depth, backend=backend, block_code_cache=cache)

    run = call if mode == "eager" else tf.function(call, jit_compile=mode == "xla",
                                                    autograph=False)
    t0 = time.perf_counter()
    result = run(values, *extra)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run(values, *extra)
        times.append(time.perf_counter() - t0)
    parts = result if isinstance(result, (tuple, list)) else [result]
    np.savez(data + ".out.npz", *[np.asarray(p) for p in parts])
    print(json.dumps({"first": first, "steady": _bench.median(times)}), flush=True)


def run_tfp(python: str, work: Workload, mode: str, repeat: int,
            timeout: float) -> Optional[Dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "input.npz")
        np.savez(data, input=work.inputs[0])
        out = _bench.run_worker(__file__, [work.key, mode, repeat, work.tfp_depth, data],
                                {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""},
                                timeout=timeout, flag="--tfp-worker", python=python)
        if str(out.get("error", "")).startswith("timeout"):
            return {"timeout": timeout}
        if "error" in out:
            return {"error": out["error"]}
        saved = np.load(data + ".out.npz")
        parts = tuple(saved[f"arr_{i}"] for i in range(len(saved.files)))
        want = work.reference()
        got = parts if isinstance(want, tuple) else parts[0]
        out["correct"] = same(got, want)
        return out


def default_tfp_python() -> str:
    """The repo's ``.tfp-venv`` (``make tfp``) if built, else ``/work/tfp-venv``."""
    local = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         ".tfp-venv", "bin", "python")
    return local if os.path.exists(local) else "/work/tfp-venv/bin/python"


# -- report ------------------------------------------------------------------------------------

def fmt(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.3f}" if seconds < 10 else f"{seconds:.1f}"


def compile_time(first: float, steady: float) -> str:
    """First call minus a steady run; "~0" where noise hides it."""
    extra = first - steady
    return "~0" if extra < 0.05 * first else fmt(extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="batches / 10 (Collatz 1,000, NUTS 100)")
    parser.add_argument("--repeat", type=int, default=3, help="steady runs (graph, XLA)")
    parser.add_argument("--modes", default="eager,graph,xla")
    parser.add_argument("--workloads", default="fib1k,fib10k,collatz10k,nuts1k")
    parser.add_argument("--tfp-python", default=default_tfp_python(),
                        help="a Python that has TFP 0.25 (`make tfp` builds .tfp-venv)")
    parser.add_argument("--no-tfp", action="store_true")
    parser.add_argument("--tfp-timeout", type=float, default=1800.0,
                        help="seconds per TFP subprocess")
    parser.add_argument("--tfp-eager-fib", action="store_true",
                        help="also run TFP eagerly on fib (tens of minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tfp-worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tfp_worker:
        key, mode, repeat, depth, data = args.tfp_worker
        tfp_worker(key, mode, int(repeat), int(depth), data)
        return

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tfp_python = None if args.no_tfp or not os.path.exists(args.tfp_python) else \
        args.tfp_python
    modes = args.modes.split(",")
    works = workloads(args.quick, args.seed)
    print(f"autobatch TensorFlowBackend, TensorFlow {tf.__version__}, CPU; "
          f"TFP: {'0.25 via ' + tfp_python if tfp_python else 'not run'}; steady runs: "
          f"median of {args.repeat} (eager: 1){'; --quick' if args.quick else ''}\n")
    table = _bench.Table(["program", "batch", "mode", "VM steps", "first call s", "compile s",
                          "steady s", "TFP first s", "TFP steady s", "TFP / ours"],
                         "lrlrrrrrrr")
    start = time.perf_counter()
    for key in args.workloads.split(","):
        work = works[key]
        for mode in modes:
            repeat = 1 if mode == "eager" else args.repeat
            # Our steady runs before and after TFP's, so that a change in the
            # machine's load weighs on both.
            ours = Ours(work, mode)
            ours.run((repeat + 1) // 2)
            skip_tfp = mode == "eager" and key.startswith("fib") and not args.tfp_eager_fib
            tfp = run_tfp(tfp_python, work, mode, repeat, args.tfp_timeout) \
                if tfp_python and not skip_tfp else None
            ours.run(repeat // 2)
            tfp_first = tfp_steady = ratio = "-"
            if tfp is not None:
                if "error" in tfp:
                    tfp_first = f"error: {tfp['error'][:60]}"
                elif "timeout" in tfp:
                    tfp_first = f"> {tfp['timeout']:.0f} (timeout)"
                else:
                    if not tfp["correct"]:
                        raise AssertionError(f"{key} ({mode}): TFP disagrees with plain Python")
                    tfp_first, tfp_steady = fmt(tfp["first"]), fmt(tfp["steady"])
                    ratio = f"{tfp['steady'] / ours.steady:.1f}x"
            table.row(work.label, f"{work.batch:,}", mode, f"{ours.function.last_steps:,}",
                      fmt(ours.first), compile_time(ours.first, ours.steady), fmt(ours.steady),
                      tfp_first, tfp_steady, ratio)
            sys.stdout.flush()
    print(f"\ntotal bench time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
