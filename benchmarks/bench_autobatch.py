"""Speed and memory of the autobatch VM (NumPy backend) against plain Python.

    python benchmarks/bench_autobatch.py [--quick] [--repeat 3] [--blas-threads 1]
        [--tf [--tfp-python PATH]]

Workloads (inputs drawn uniformly, seeded): fib (batch 1,000 and 10,000,
n <= 20), is_even by mutual recursion (batch 10,000, n <= 100; tail calls,
and a variant with work after every call, which needs stack frames), Collatz
step counts (batch 10,000, n <= 1,000), a NUTS-shaped program (a loop around
a doubly recursive tree build whose leaf does a 256 x 256 matrix-vector
product; batch 100 and 1,000), fib batch 1,000 with n <= 10 and is_even batch
1,000 with n <= 50.  Peers (JAX, hand-vectorized NumPy, TFP 0.25) are
measured side by side in ``benchmarks/bench_autobatch_peers.py``.

Columns: the engine the pipeline picks on NumPy (the fused loop for
call-free programs, the VM otherwise), its seconds (wall-clock and CPU,
medians of --repeat runs), steps (VM steps, or the fused loop's block runs),
peak memory traced by tracemalloc during one run, the VM alone, the
stackless executor (one run), plain Python looping over the examples one by
one (medians), and the ratio.  Every run's result is checked against plain
Python.

``--tf`` then runs ``benchmarks/bench_autobatch_tf.py`` (the TensorFlow
backend in eager, graph and XLA mode, and TFP 0.25's own engine side by side
when a Python that has it is found) and prints its table.

BLAS threads default to 1 (set before NumPy is imported): on a shared
machine a multi-threaded BLAS makes small matrix products erratic, and the
one-by-one baseline (matrix-vector products) runs on one thread anyway.
"""
import argparse
import os
import sys


def _blas_threads_from_argv() -> str:
    for i, arg in enumerate(sys.argv):
        if arg == "--blas-threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--blas-threads="):
            return arg.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _blas_threads_from_argv())

import time  # noqa: E402
import tracemalloc  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, List  # noqa: E402

import numpy as np  # noqa: E402

import _bench  # noqa: E402

from autobatch import examples, stackless  # noqa: E402
from autobatch.backends.numpy import NumpyBackend  # noqa: E402
from autobatch.pipeline import argument_types, compile_program  # noqa: E402
from autobatch.virtual_machine import VirtualMachine  # noqa: E402


@dataclass
class Workload:
    name: str
    batch: int
    program: Any
    args: List[Any]
    python: Callable[[], Any]       # plain Python over all examples
    max_stack_depth: int
    quick: bool = True               # part of --quick


def same(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return all(same(g, w) for g, w in zip(got, want, strict=True))
    return np.array_equal(np.asarray(got), np.asarray(want))


def workloads(rng: np.random.Generator) -> List[Workload]:
    out = []

    def fib(batch: int, n_max: int, quick: bool = True) -> None:
        n = rng.integers(0, n_max + 1, size=batch)
        out.append(Workload(f"fib n<={n_max}", batch, examples.fibonacci(), [n],
                            lambda: np.array([examples.fib_python(int(v)) for v in n]),
                            max(n_max, 1), quick))

    def even(batch: int, n_max: int, tail: bool) -> None:
        n = rng.integers(0, n_max + 1, size=batch)
        label = "tail calls" if tail else "stack"
        out.append(Workload(f"is_even n<={n_max} ({label})", batch, examples.even_odd(tail),
                            [n], lambda: np.array([examples.is_even_python(int(v))
                                                   for v in n]),
                            n_max + 1))

    def collatz(batch: int, n_max: int) -> None:
        n = rng.integers(1, n_max + 1, size=batch)
        out.append(Workload(f"Collatz n<={n_max}", batch, examples.collatz(), [n],
                            lambda: np.array([examples.collatz_python(int(v)) for v in n]),
                            1))

    def nuts(batch: int) -> None:
        matrix, weights = examples.nuts_problem(256)
        x = rng.integers(0, 1009, size=(batch, 256)).astype(np.float64)

        def python():
            pairs = [examples.nuts_python(row, matrix, weights) for row in x]
            return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        out.append(Workload("NUTS-shaped, 256 matvec", batch,
                            examples.nuts_shaped(matrix, weights), [x], python, 8))

    fib(1_000, 10)
    even(1_000, 50, tail=True)
    even(1_000, 50, tail=False)
    collatz(10_000, 1_000)
    fib(1_000, 20)
    fib(10_000, 20, quick=False)
    even(10_000, 100, tail=True)
    even(10_000, 100, tail=False)
    nuts(100)
    nuts(1_000)
    return out


def run(work: Workload, repeat: int, backend: NumpyBackend) -> dict:
    compiled = compile_program(work.program, argument_types(work.args, backend), backend)
    engine = compiled.engine(backend)
    vm = VirtualMachine(compiled.lowered, backend, max_stack_depth=work.max_stack_depth)
    runner = compiled.fused if engine == "fused" else vm
    want = work.python()
    for name, executor in (("the engine", runner), ("the VM", vm)):
        if not same(executor.run(work.args), want):
            raise AssertionError(f"{work.name}: {name} disagrees with plain Python")
    run_s, run_cpu = _bench.median_time(lambda: runner.run(work.args), repeat)
    steps = runner.steps
    vm_s = run_s if runner is vm else _bench.median_seconds(lambda: vm.run(work.args), repeat)
    tracemalloc.start()
    runner.run(work.args)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t0 = time.perf_counter()
    sl = stackless.execute(compiled.program, work.args, backend, work.max_stack_depth)
    stackless_s = time.perf_counter() - t0
    if not same(sl, want):
        raise AssertionError(f"{work.name}: the stackless executor disagrees")
    python_s, python_cpu = _bench.median_time(work.python, repeat)
    return dict(engine=engine, run=run_s, cpu=run_cpu, steps=steps, peak=peak, vm=vm_s,
                stackless=stackless_s, python=python_s, python_cpu=python_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip fib at batch 10,000; "
                        "one timed run each")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per measurement")
    parser.add_argument("--blas-threads", default="1", help="BLAS threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tf", action="store_true",
                        help="then run benchmarks/bench_autobatch_tf.py: the TensorFlow backend "
                        "(eager, graph, XLA) and, where a Python with TFP 0.25 is given "
                        "(--tfp-python), TFP's engine on the same programs, side by side")
    parser.add_argument("--tfp-python", default=None,
                        help="with --tf: a Python that has TFP 0.25 (see bench_autobatch_tf.py)")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    backend = NumpyBackend(native=False)  # the native engine: bench_autobatch_peers.py
    rng = np.random.default_rng(args.seed)
    print(f"autobatch, NumPy {np.__version__} backend, BLAS threads "
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}, median of {repeat} run(s)\n")
    table = _bench.Table(["program", "batch", "engine", "s", "CPU s", "steps", "peak MiB",
                          "VM s", "stackless s", "plain Python s", "Python CPU s",
                          "Python / ours"], "lrlrrrrrrrrr")
    start = time.perf_counter()
    for work in workloads(rng):
        if args.quick and not work.quick:
            continue
        r = run(work, repeat, backend)
        table.row(work.name, f"{work.batch:,}", r["engine"], f"{r['run']:.3f}",
                  f"{r['cpu']:.3f}", f"{r['steps']:,}", f"{_bench.mib(r['peak']):.1f}",
                  f"{r['vm']:.3f}", f"{r['stackless']:.3f}", f"{r['python']:.3f}",
                  f"{r['python_cpu']:.3f}", f"{r['python'] / r['run']:.2f}x")
        sys.stdout.flush()
    print("\nRatios use wall-clock medians.  CPU seconds are this process's only: on a "
          "shared machine\nthey show what the wall clock would be without the other "
          "load (the BLAS runs one thread).")
    print(f"\ntotal bench time {time.perf_counter() - start:.0f} s")
    if args.tf:
        run_tensorflow_bench(args)


def run_tensorflow_bench(args: argparse.Namespace) -> None:
    """The TensorFlow table, in its own process (TensorFlow's threads must
    not share this one's BLAS settings and imports)."""
    import subprocess
    command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "bench_autobatch_tf.py"),
               "--repeat", str(args.repeat), "--seed", str(args.seed)]
    if args.quick:
        command.append("--quick")
    if args.tfp_python:
        command += ["--tfp-python", args.tfp_python]
    print(flush=True)
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
