"""Probe: do the collector's late frees leave a budget plan if dead buffers are handed on?

Paddle 3.3.1's CPU garbage collector frees every buffer on its own thread
(``InterpreterCoreEventGarbageCollector::Free``), so a value's memory stays
counted for a few ops after its last reader; ``budget=`` checks every plan
with frees up to 4 ops late (``pir_budget.GC_LAG_OPS``).  No op can free a
buffer synchronously under Paddle's default flags (``docs/benchmarks.rst``,
"Synchronous frees").  What can bypass the collector: ``pd_op.share_var``
makes a later value ``W`` use the Variable of a dead value ``V`` (same shape
and dtype), so ``W``'s producer writes into ``V``'s buffer and nothing is
freed or allocated between them.

This probe takes a bench row's leanest ``budget=`` plan (the lowest checked
peak among the plans ``budget=`` may choose, as ``bench_recompute.py
--floors``), applies it, optionally hands dead buffers on (greedy, program
order: a value whose last reader is at most ``WINDOW`` ops before a producer
of a same-shape, same-dtype result; views, in-place ops, region ops, fed,
fetched and persistable values left alone, and values whose last reader
the executor's in-place pass writes over), and runs ``--steps`` training
steps in a fresh process per run, printing the allocator's step peaks against
the model's steady and lagged peaks, and a digest of the losses and
parameters (bit-identity).

``--small`` runs the two small checks instead: which ops release a dead
32 MiB buffer at all (GC off, so only an op can free it: the allocator's
count after one run), and a chain of 60 matmuls (1 MiB each, GC on) with
and without handoffs (step peaks of steps 2..n, fresh processes).
``--model`` prints, in the model only, the lowest plans' checked peaks
(what ``budget=`` compares with a budget) with and without the handoffs
counted as one buffer each.

Usage::

    python benchmarks/probe_gc_handoff.py --models unet,bert --repeat 3 --steps 6
    python benchmarks/probe_gc_handoff.py --small --repeat 4 --steps 10
    python benchmarks/probe_gc_handoff.py --model --models unet,bert   # model only
"""
from __future__ import annotations

import argparse
import json
import sys

import _bench
from bench_recompute import BENCH_MODELS, budget_choices, measured_steps, model_of

#: How many ops after a value's last reader its buffer may be handed on.
WINDOW = 8


def handoff_pairs(program, window: int = WINDOW) -> list:
    """``[(V, P, W)]``: dead value ``V`` whose buffer ``P``'s result ``W``
    takes (see the module docstring)."""
    from memopt.paddle.pir.program import DATA_OPS, PARAMETER_OP
    from memopt.paddle.pir.regions import VIEW_OPS

    from paddle.base import core

    ops = list(program.global_block().ops)
    last: dict = {}
    bad: set = set()

    def written(op) -> dict:
        """{result slot: operand slot} an in-place op writes over."""
        if not op.name().endswith("_"):
            return {}
        return dict(core.pir.get_op_inplace_info(op))

    def mark_sub(op) -> None:
        for blk in op.blocks():
            for inner in blk.ops:
                for v in inner.operands_source():
                    if v.initialized():
                        bad.add(v.id)
                mark_sub(inner)

    for i, op in enumerate(ops):
        name = op.name()
        over = set(written(op).values())
        for slot, v in enumerate(op.operands_source()):
            if not v.initialized():
                continue
            last[v.id] = i
            if name in VIEW_OPS or slot in over or op.num_regions() \
                    or name in ("pd_op.fetch", "builtin.shadow_output"):
                bad.add(v.id)
        mark_sub(op)

    def eligible(op) -> bool:
        name = op.name()
        return not (name in VIEW_OPS or op.num_regions() or name in DATA_OPS
                    or name == PARAMETER_OP or name.startswith("builtin.")
                    or name.startswith("cf."))

    def key(v):
        if not v.initialized() or not v.is_dense_tensor_type() or v.persistable:
            return None
        shape = tuple(int(d) for d in v.shape)
        # -1 only as the leading (batch) dim, the same batch everywhere
        ok = shape and all(d > 0 for d in shape[1:]) and (shape[0] > 0 or shape[0] == -1)
        return (shape, str(v.dtype)) if ok else None

    pool: dict = {}  # (shape, dtype) -> [(last reader position, V)]
    pairs = []
    for i, op in enumerate(ops):
        if eligible(op):
            fresh = [w for slot, w in enumerate(op.results()) if slot not in written(op)]
            for w in fresh:
                k = key(w)
                cands = pool.get(k, []) if k else []
                cands[:] = [(at, v) for at, v in cands if i - at <= window]
                if cands:
                    _, v = cands.pop()  # the most recently dead
                    pairs.append((v, op, w))
        for v in op.operands_source():
            if v.initialized() and last.get(v.id) == i and v.id not in bad and key(v) is not None:
                producer = v.get_defining_op()
                if producer is not None and eligible(producer) \
                        and v.index() not in written(producer):
                    pool.setdefault(key(v), []).append((i, v))
    return pairs


def kept_pairs(program, window: int, runtime) -> list:
    """:func:`handoff_pairs` without a ``V`` whose last reader the executor's
    in-place pass writes over (a later ``share_var`` read would keep that
    reader from running in place, so it would allocate)."""
    from memopt.paddle.pir import program as pir
    from memopt.paddle.runtime import executed

    read = executed(pir.convert(program), runtime)
    over = {src for _, src, _ in read.inplace}
    name_of = read.pir_graph.name_of
    return [(v, op, w) for v, op, w in handoff_pairs(program, window)
            if name_of.get(v.id) and name_of.get(w.id) and name_of[v.id] not in over]


def apply_handoffs(program, pairs) -> int:
    """Insert ``share_var([V, W])`` right after each ``P``; the count."""
    import paddle

    block = program.global_block()
    for v, op, w in pairs:
        ops = list(block.ops)
        at = next(k for k, o in enumerate(ops) if o.id() == op.id())
        with paddle.static.program_guard(program):
            if at + 1 < len(ops):
                paddle.pir.set_insertion_point(ops[at + 1])
            else:
                paddle.pir.set_insertion_point_to_block_end(block)
            paddle._C_ops.share_var([v, w])
    paddle.pir.set_insertion_point_to_block_end(block)
    return len(pairs)


def worker(row: str, mode: str, steps: int, window: int = WINDOW) -> dict:
    import paddle

    paddle.enable_static()
    from memopt.testing import models
    from memopt.paddle.pir import recompute as pir_recompute

    out: dict = {"row": row, "mode": mode}
    if mode == "default":
        batch, opts = BENCH_MODELS[row]
        m = models.build(model_of(row), "pir", batch_size=batch, **dict(opts))
    else:
        batch, m, runtime, pg, _, choices = budget_choices(row)
        lean = min(choices, key=lambda c: (c.peak, c.plan.flops))
        pir_recompute.apply_plan(pg, lean.plan)
        out.update(plan=lean.label, checked=lean.peak,
                   steady=lean.prediction.total_peak(batch))
        if mode == "handoff":
            out["handoffs"] = apply_handoffs(m.main, kept_pairs(m.main, window, runtime))
    _, peaks, times, digest = measured_steps(m, steps)
    out.update(peaks=peaks, digest=digest, step_s=_bench.median(times[1:]))
    return out


def release_worker(how: str) -> dict:
    """MiB still allocated after one run (GC off) of: a 32 MiB value read by
    ``sum``, then ``how`` -- ``none``; ``set_`` (its buffer replaced by a
    1-element one's); ``assign_out_`` (a 1-element value written over it);
    ``share_var`` (a later 32 MiB result made in its Variable)."""
    import numpy as np
    import paddle

    paddle.enable_static()
    from paddle.base import core

    n = 8 * 2 ** 20
    main_p, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_p, start):
        x = paddle.static.data("x", [1], "float32")
        big = paddle.expand(x, [n])
        r = paddle.sum(big, keepdim=True)
        tiny = paddle.full([1], 0.0, "float32")
        if how == "set_":
            r = r + paddle._C_ops.set_(big, tiny, [1], [1], 0) * 0.0
        elif how == "assign_out_":
            r = r + paddle._C_ops.assign_out_(tiny, big)[:1] * 0.0
        later = paddle.expand(r, [n])
        if how == "share_var":
            paddle._C_ops.share_var([big, later])
        loss = paddle.sum(later)
    exe = paddle.static.Executor(paddle.CPUPlace())
    before = core.host_memory_stat_current_value("Allocated", 0)
    out = exe.run(main_p, feed={"x": np.ones([1], "float32")}, fetch_list=[loss])[0]
    held = core.host_memory_stat_current_value("Allocated", 0) - before
    return {"how": how, "held_mib": _bench.mib(held), "loss": float(out)}


def chain_worker(mode: str, steps: int, layers: int = 60) -> dict:
    """Step peaks (MiB above the step's start, GC on, default executor) of
    ``y_{i+1} = y_i @ w_i`` ([4096, 64] float32, 1 MiB each); ``share``:
    each ``y_{i+1}`` made in ``y_{i-1}``'s Variable (``share_var``)."""
    import numpy as np
    import paddle

    paddle.enable_static()
    from paddle.base import core

    main_p, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_p, start):
        ys = [paddle.static.data("x", [4096, 64], "float32")]
        for i in range(layers):
            w = paddle.create_parameter([64, 64], "float32", name=f"w{i}",
                                        default_initializer=paddle.nn.initializer.Assign(
                                            np.eye(64, dtype="float32") * 0.99))
            ys.append(paddle.matmul(ys[-1], w))
            if mode == "share" and i >= 2:
                paddle._C_ops.share_var([ys[-3], ys[-1]])
        loss = paddle.mean(ys[-1])
    rng = np.random.default_rng(0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(start)
    peaks, losses = [], []
    for _ in range(steps):
        feed = {"x": rng.standard_normal((4096, 64)).astype("float32")}
        base = core.host_memory_stat_current_value("Allocated", 0)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        losses.append(float(exe.run(main_p, feed=feed, fetch_list=[loss])[0]).hex())
        peaks.append(_bench.mib(core.host_memory_stat_peak_value("Allocated", 0) - base))
    return {"mode": mode, "peaks": peaks, "losses": losses}


def model_row(row: str, windows=(2, 8), lowest: int = 3) -> list:
    """Model only: the ``lowest`` plans (by checked peak) ``budget=`` may
    choose at the row's batch, each applied, read back and checked as
    ``pir_budget.guarded_peak`` does (frees 4 ops late; 1, 2 and 4
    workers), then with the handoffs of each window counted as one buffer
    (``from_graph(same_variable=...)``: no free and no allocation between
    ``V`` and ``W``, the gap held; the pairs of :func:`kept_pairs`).  MiB
    rows."""
    from dataclasses import replace

    from memopt.analysis import from_graph_modes
    from memopt.paddle.pir import program as pir, budget as pir_budget, recompute as pir_recompute
    from memopt.paddle.runtime import executed

    batch, m, runtime, pg, default, vouched = budget_choices(row)
    choices = sorted(vouched, key=lambda c: (c.peak, c.plan.flops))
    modes = [replace(runtime, workers=w) for w in sorted({runtime.workers, 1, 2})]
    out = []
    for c in choices[:lowest]:
        if not c.k:
            continue
        applied = pir_recompute.apply_plan(pg, c.plan)
        try:
            read = executed(pir.convert(m.main), runtime)
            name_of = read.pir_graph.name_of
            cells = [row, c.label, f"+{c.plan.added_percent:.0f}%", f"{_bench.mib(default):.2f}"]
            for window in (0, *windows):
                same = [(name_of[v.id], name_of[w.id])
                        for v, _, w in kept_pairs(m.main, window, runtime)] if window else []
                preds = from_graph_modes(read.graph, batch, modes, read.inplace, same)
                steady = max(p.total_peak(batch) for p in preds)
                checked = max(p.total_peak_pending(pir_budget.GC_LAG_OPS, batch) for p in preds)
                cells.append(f"{len(same)}: {_bench.mib(steady):.2f} / "
                             f"{_bench.mib(checked):.2f} ({checked / default:.2f})")
            out.append(cells)
        finally:
            applied.undo()
    return out


def small(repeat: int, steps: int) -> None:
    """The two small checks of ``--small`` (module docstring)."""
    table = _bench.Table(["GC off: after the last reader of a 32 MiB value",
                          "MiB held after the run"])
    for how in ("none", "set_", "assign_out_", "share_var"):
        r = _bench.run_worker(__file__, ["release", how, 0, 0],
                              env={"FLAGS_eager_delete_tensor_gb": "-1"})
        table.row(how, f"{r['held_mib']:.2f}" if "held_mib" in r else r.get("error"))
    print()
    table = _bench.Table(["matmul chain, GC on", "steps 2..n lowest-highest MiB, per process",
                          "steps 0.5 MiB above the lowest", "losses identical"])
    runs: dict = {"none": [], "share": []}
    for _ in range(repeat):
        for mode in runs:
            runs[mode].append(_bench.run_worker(__file__, ["chain", mode, steps, 0]))
    ref = runs["none"][0].get("losses")
    for mode, rs in runs.items():
        ok = [r for r in rs if "peaks" in r]
        low = min(min(r["peaks"][1:]) for r in ok)
        spans = ", ".join(f"{min(r['peaks'][1:]):.1f}-{max(r['peaks'][1:]):.1f}" for r in ok)
        above = sum(p > low + 0.5 for r in ok for p in r["peaks"][1:])
        total = sum(len(r["peaks"][1:]) for r in ok)
        same = all(r["losses"] == ref for r in ok)
        table.row(mode, spans, f"{above} of {total}", "yes" if same else "NO")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="unet,bert")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--window", type=int, default=WINDOW,
                        help="ops after a value's last reader its buffer may be handed on")
    parser.add_argument("--small", action="store_true", help="the two small checks")
    parser.add_argument("--model", action="store_true",
                        help="model only: the lowest plans' checked peaks with handoffs counted")
    parser.add_argument("--worker", nargs=4)
    args = parser.parse_args()
    if args.worker:
        row, mode, steps, window = args.worker
        if row == "release":
            print(json.dumps(release_worker(mode)))
        elif row == "chain":
            print(json.dumps(chain_worker(mode, int(steps))))
        else:
            print(json.dumps(worker(row, mode, int(steps), int(window))))
        return
    if args.small:
        small(args.repeat, args.steps)
        return
    if args.model:
        table = _bench.Table(["row", "plan", "FLOPs", "default steady",
                              "no handoff: steady / checked (of default)",
                              "W=2: handoffs: steady / checked",
                              "W=8: handoffs: steady / checked"])
        for row in args.models.split(","):
            for cells in model_row(row):
                table.row(*cells)
            sys.stdout.flush()
        return
    mib = _bench.mib
    table = _bench.Table(["row", "run", "plan", "handoffs", "model steady",
                          "model checked (4 ops late)", "steps 2..n lowest-highest, per process",
                          "highest / model steady", "steps > 1.05x their process's lowest",
                          "step time / default", "bit-identical"])
    for row in args.models.split(","):
        base = _bench.run_worker(__file__, [row, "default", args.steps, args.window])
        runs = {"plan": [], "handoff": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(_bench.run_worker(__file__, [row, mode, args.steps, args.window]))
        for mode, rs in [("default", [base]), *runs.items()]:
            ok = [r for r in rs if "peaks" in r]
            if not ok:
                table.row(row, mode, rs[0].get("error"), *[""] * 8)
                continue
            r0 = ok[0]
            spans = ", ".join(f"{mib(min(r['peaks'][1:])):.2f}-{mib(max(r['peaks'][1:])):.2f}"
                              for r in ok)
            steady = r0.get("steady")
            high = max(p for r in ok for p in r["peaks"][1:])
            over = f"{high / steady:.2f}" if steady else ""
            spiky = sum(p > 1.05 * min(r["peaks"][1:]) for r in ok for p in r["peaks"][1:])
            spikes = f"{spiky} of {sum(len(r['peaks'][1:]) for r in ok)}"
            slow = _bench.median(r["step_s"] for r in ok) / base["step_s"] \
                if "step_s" in base else 0
            same = all(r["digest"] == base.get("digest") for r in ok)
            model = f"{mib(steady):.2f}" if steady else "-"
            checked = f"{mib(r0['checked']):.2f}" if "checked" in r0 else "-"
            table.row(row, mode, r0.get("plan", ""), r0.get("handoffs", ""), model, checked,
                      spans, over, spikes, f"{slow:.2f}x", "yes" if same else "NO")


if __name__ == "__main__":
    main()
