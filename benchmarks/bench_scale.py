"""memory_optimize at scale: a synthetic legacy program of 100,000 ops.

Targets: ``memopt.memory_optimize`` finishes in under 20 s and under
2 GiB of memory on a 100,000-op legacy program.

    python benchmarks/bench_scale.py [--ops 100000] [--repeat 3]

The program is a deep residual MLP written straight into a ``ProgramDesc``
(building it through Paddle's layer API would take minutes), with a feed
and a fetch op as ``save_inference_model`` writes them: per layer a
``matmul_v2`` with its weight, a bias ``elementwise_add``, ``relu``,
``scale`` and, where the width does not change, a residual
``elementwise_add``; widths cycle through 64, 64, 128, 128, 32, the batch
dimension is ``-1``.  Every measured run gets a fresh copy of the program
(``Program.parse_from_string``, not timed).

Rows:

- ``memory_optimize`` (the whole call: read the program, plan, check,
  rewrite, report) per level and garbage-collector mode;
- the graph-level part alone: ``program_to_graph``, and ``plan_memory`` +
  ``check_plan`` on its graph;
- ``plan_memory`` + ``check_plan`` on a neutral :class:`memopt.graph.Graph`
  of the same shape built without Paddle.

Columns: median seconds over ``--repeat`` runs; the peak of Python
allocations during one run (``tracemalloc``, run separately: it slows
Python down); and, in a fresh child process that builds and loads the
program and runs only that step, the peak resident set over the child's
life (build and load included), during the step (``VmHWM`` reset through
``/proc/self/clear_refs`` right before it), and what the step added at its
peak over the resident set right before it.
"""
import argparse
import json
import os
import time
import tracemalloc

import _bench

WIDTHS = (64, 64, 128, 128, 32)
TARGET_SECONDS = 20.0
TARGET_BYTES = 2 * 1024 ** 3

#: step name -> (label, level, gc)
STEPS = {
    "optimize-l0-gcoff": ("memory_optimize, level 0, GC off", 0, False),
    "optimize-l1-gcoff": ("memory_optimize, level 1, GC off", 1, False),
    "optimize-l0-gcon": ("memory_optimize, level 0, GC on", 0, True),
    "to-graph": ("program_to_graph alone", 0, False),
    "plan-l0-gcoff": ("plan_memory + check_plan, level 0, GC off", 0, False),
    "plan-l1-gcoff": ("plan_memory + check_plan, level 1, GC off", 1, False),
    "neutral-l1-gcoff": ("neutral Graph (no Paddle): plan + check, level 1, GC off", 1, False),
}


# -- the synthetic program ----------------------------------------------------------

def layers_for(ops: int):
    """Layer widths ``(w_in, w_out)`` until about ``ops`` ops."""
    out, count, k = [], 0, 0
    w_in = WIDTHS[0]
    while count < ops:
        w_out = WIDTHS[k % len(WIDTHS)]
        out.append((w_in, w_out))
        count += 4 + (w_in == w_out)
        w_in, k = w_out, k + 1
    return out


def program_bytes(ops: int) -> bytes:
    """A serialized legacy ``ProgramDesc`` of about ``ops`` ops."""
    from paddle.base.proto import framework_pb2 as pb

    prog = pb.ProgramDesc()
    blk = prog.blocks.add()
    blk.idx, blk.parent_idx = 0, -1

    def var(name, shape, persistable=False):
        v = blk.vars.add()
        v.name, v.persistable = name, persistable
        v.type.type = pb.VarType.DENSE_TENSOR
        v.type.dense_tensor.tensor.data_type = pb.VarType.FP32
        v.type.dense_tensor.tensor.dims.extend(shape)
        return name

    def op(op_type, inputs, outputs, **attrs):
        o = blk.ops.add()
        o.type = op_type
        for slot, names in inputs.items():
            entry = o.inputs.add()
            entry.parameter = slot
            entry.arguments.extend(names)
        for slot, names in outputs.items():
            entry = o.outputs.add()
            entry.parameter = slot
            entry.arguments.extend(names)
        for name, value in (("op_role", 0), *attrs.items()):
            a = o.attrs.add()
            a.name = name
            if isinstance(value, bool):
                a.type, a.b = pb.BOOLEAN, value
            elif isinstance(value, int):
                a.type, a.i = pb.INT, value
            else:
                a.type, a.f = pb.FLOAT, value

    for name, kind in (("feed", pb.VarType.FEED_MINIBATCH), ("fetch", pb.VarType.FETCH_LIST)):
        v = blk.vars.add()
        v.name, v.persistable = name, True
        v.type.type = kind
    var("x", [-1, WIDTHS[0]])
    blk.vars[-1].need_check_feed = True
    op("feed", {"X": ["feed"]}, {"Out": ["x"]}, col=0)   # as save_inference_model writes it
    h = "x"
    for i, (w_in, w_out) in enumerate(layers_for(ops)):
        w = var(f"fc_{i}.w_0", [w_in, w_out], persistable=True)
        b = var(f"fc_{i}.b_0", [w_out], persistable=True)
        mm = var(f"fc_{i}.tmp_0", [-1, w_out])
        op("matmul_v2", {"X": [h], "Y": [w]}, {"Out": [mm]}, trans_x=False, trans_y=False)
        pre = var(f"fc_{i}.tmp_1", [-1, w_out])
        op("elementwise_add", {"X": [mm], "Y": [b]}, {"Out": [pre]}, axis=-1)
        act = var(f"relu_{i}.tmp_0", [-1, w_out])
        op("relu", {"X": [pre]}, {"Out": [act]})
        out = var(f"scale_{i}.tmp_0", [-1, w_out])
        op("scale", {"X": [act]}, {"Out": [out]}, scale=0.5, bias=0.0, bias_after_scale=True)
        if w_in == w_out:
            res = var(f"res_{i}.tmp_0", [-1, w_out])
            op("elementwise_add", {"X": [out], "Y": [h]}, {"Out": [res]}, axis=-1)
            out = res
        h = out
    op("fetch", {"X": [h]}, {"Out": ["fetch"]}, col=0)
    return prog.SerializeToString()


def load(data: bytes):
    from paddle.base.framework import Program
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        return Program.parse_from_string(data)


def neutral_graph(ops: int):
    """The same network as a :class:`memopt.graph.Graph`, without Paddle."""
    from memopt.graph import Graph, Op, Var

    g = Graph()
    b0 = g.global_block
    b0.add_var(Var("x", (-1, WIDTHS[0]), is_feed=True, is_data=True))
    h = "x"
    for i, (w_in, w_out) in enumerate(layers_for(ops)):
        names = [f"fc_{i}.tmp_0", f"fc_{i}.tmp_1", f"relu_{i}.tmp_0", f"scale_{i}.tmp_0"]
        for name in names:
            b0.add_var(Var(name, (-1, w_out)))
        b0.add_var(Var(f"fc_{i}.w_0", (w_in, w_out), persistable=True))
        b0.add_var(Var(f"fc_{i}.b_0", (w_out,), persistable=True))
        b0.add_op(Op("matmul_v2", (h, f"fc_{i}.w_0"), (names[0],)))
        for op_type, src, dst, extra in (("elementwise_add", names[0], names[1], f"fc_{i}.b_0"),
                                         ("relu", names[1], names[2], None),
                                         ("scale", names[2], names[3], None)):
            reads = (src, extra) if extra else (src,)
            b0.add_op(Op(op_type, reads, (dst,), attrs={"inplace": (src, dst)}))
        out = names[3]
        if w_in == w_out:
            b0.add_var(Var(f"res_{i}.tmp_0", (-1, w_out)))
            b0.add_op(Op("elementwise_add", (out, h), (f"res_{i}.tmp_0",)))
            out = f"res_{i}.tmp_0"
        h = out
    for index, op in enumerate(b0.ops):
        op.attrs["index"] = index
    g.blocks[0].vars[h].is_fetch = True
    g.fetch_names = (h,)
    return g


# -- the steps -------------------------------------------------------------------------

def prepare(step: str, data: bytes, ops: int):
    """What ``step`` runs on, made fresh (not measured)."""
    if step.startswith("neutral"):
        return neutral_graph(ops)
    program = load(data)
    if step.startswith("plan"):
        from memopt.paddle.legacy.program import program_to_graph

        return program_to_graph(program)
    return program


def run_step(step: str, subject) -> dict:
    """Run ``step`` once on ``subject``; returns facts about the result."""
    from memopt.testing import models

    _, level, gc = STEPS[step]
    with models.flags(eager_delete_tensor_gb=0.0 if gc else -1.0):
        if step.startswith("optimize"):
            import memopt

            with models.ir_guard("legacy"):
                report = memopt.memory_optimize(subject, level=level)
            return {"merged": report.merged_count}
        if step == "to-graph":
            from memopt.paddle.legacy.program import program_to_graph

            return {"ops": program_to_graph(subject).num_ops()}
        from memopt.plan import Options
        from memopt.planner import plan_memory
        from memopt.verify import check_plan

        plan = plan_memory(subject, Options(level=level), gc)
        check_plan(subject, plan)
        return {"merged": len(plan.reuses)}


def _status(key: str) -> int:
    """A size line of ``/proc/self/status`` (Linux), in bytes; 0 when absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Reset the process's peak resident set (``VmHWM``); False if Linux refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(step: str, ops: int) -> None:
    """In a fresh process: build, load, run ``step`` once; print as JSON the
    process's peak resident set over its life and during the step, and what
    the step added at its peak over the resident set right before it.

    (``ru_maxrss`` is not used: Linux carries the parent's peak into a child
    across fork and exec.)"""
    import gc

    import paddle

    paddle.enable_static()
    subject = prepare(step, program_bytes(ops) if not step.startswith("neutral") else b"", ops)
    gc.collect()
    life_peak = _status("VmHWM")
    before = _status("VmRSS")
    exact = reset_peak_rss()
    run_step(step, subject)
    step_peak = _status("VmHWM")
    print(json.dumps({"rss_peak": max(life_peak, step_peak), "rss_step_peak": step_peak,
                      "rss_growth": max(0, step_peak - before), "exact": exact}))


def measure(step: str, data: bytes, ops: int, repeat: int) -> dict:
    times = []
    facts = {}
    for _ in range(repeat):
        subject = prepare(step, data, ops)
        start = time.perf_counter()
        facts = run_step(step, subject)
        times.append(time.perf_counter() - start)
        del subject
    subject = prepare(step, data, ops)
    tracemalloc.start()
    run_step(step, subject)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del subject
    rss = _bench.run_worker(__file__, [step, "--ops", ops], flag="--child")
    if "error" in rss:
        raise RuntimeError(f"child for {step} failed: {rss['error']}\n{rss.get('stderr', '')}")
    return {"seconds": _bench.median(times), "runs": times, "traced": traced, **rss,
            **facts}


def mib(n: int) -> str:
    return f"{_bench.mib(n):,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    if args.child:
        child(args.child, args.ops)
        return
    import paddle

    paddle.enable_static()
    start = time.perf_counter()
    data = program_bytes(args.ops)
    program = load(data)
    n_ops, n_vars = len(program.global_block().ops), len(program.global_block().vars)
    print(f"synthetic legacy program: {n_ops:,} ops, {n_vars:,} variables "
          f"(built and loaded in {time.perf_counter() - start:.1f} s); "
          f"median of {args.repeat} runs\n")
    del program
    table = _bench.Table(["step", "median s", "runs s", "tracemalloc peak",
                          "process peak RSS", "peak RSS in the step", "added by the step",
                          "merged / result"], "lrlrrrrr")
    verdicts = []
    for step in args.steps:
        r = measure(step, data, args.ops, args.repeat)
        label = STEPS[step][0]
        result = r.get("merged", r.get("ops", ""))
        table.row(label, f"{r['seconds']:.2f}", ", ".join(f"{t:.2f}" for t in r["runs"]),
                  mib(r["traced"]), mib(r["rss_peak"]), mib(r["rss_step_peak"]),
                  mib(r["rss_growth"]), result)
        if step.startswith("optimize"):
            ok = r["seconds"] < TARGET_SECONDS and r["rss_step_peak"] < TARGET_BYTES
            verdicts.append(f"{label}: {r['seconds']:.1f} s (target < {TARGET_SECONDS:.0f} s), "
                            f"peak RSS during the call {mib(r['rss_step_peak'])} "
                            f"(target < 2 GiB): {'met' if ok else 'MISSED'}")
    print()
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
