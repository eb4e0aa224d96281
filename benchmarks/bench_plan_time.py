"""Planning time of memory_optimize and analyze on big programs.

One markdown table: per program its op count and the wall seconds of
``memopt.memory_optimize(program, level=0)``, ``level=1``, ``level=2``,
``memory_optimize(program, budget=0.7 * predicted peak, batch_size=B)``
and ``memopt.analyze(program)``, each on a fresh build of the program (the
build is not timed; the programs are never run).

    python benchmarks/bench_plan_time.py [--programs bert12,resnet50] [--repeat 1]
    python benchmarks/bench_plan_time.py --versions /work/main,/work/wK

Programs (all training programs: forward, backward, momentum):

- ``bert12`` / ``bert24`` / ``bert48``: PIR BERT-base-like encoders (hidden
  768, 12 heads, feed-forward 3072, seq 128, vocab 30522), 12, 24 and 48 layers;
- ``gpt24`` / ``gpt48``: PIR GPTs (hidden 768, seq 128, vocab 50257), 24 and
  48 layers;
- ``resnet152`` / ``resnet50``: PIR ``paddle.vision`` ResNets, 224 px;
- ``legacy_resnet50``, ``legacy_transformer12``: the legacy IR
  (``FLAGS_enable_pir_api=0``): ResNet-50 at 224 px, a 12-layer einsum
  Transformer encoder (hidden 768, seq 128).

Cells are wall seconds with this process's CPU seconds in brackets (on
a loaded machine compare the CPU seconds); the ``per 1k ops`` column is the
CPU seconds of each step (level 0 / 1 / 2 / budget / analyze) per 1,000 ops,
which stays flat from a 24- to a 48-layer model when planning is linear.  ``B`` is 8.  The budget is 0.7 of ``analyze(program).total_peak(B)``.

Each program runs in its own fresh process (``_bench.run_worker``).  With
``--versions a,b``, each program is measured under each ``PYTHONPATH`` in
turn (alternating, same load), one row per version, and the ``digest``
column hashes what each call did: the rewritten programs' text and the
reports' plan numbers (recomputed names, merged count, peaks).  Equal
digests across versions mean the same plans.

``--profile STEP`` (with ``--worker``) prints the cProfile top functions of
one step instead.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import _bench

BATCH = 8
BUDGET_FRACTION = 0.7

#: name -> (ir, models.build name or a local builder, options)
PROGRAMS = {
    "bert12": ("pir", "bert", dict(layers=12, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                   vocab=30522)),
    "bert24": ("pir", "bert", dict(layers=24, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                   vocab=30522)),
    "bert48": ("pir", "bert", dict(layers=48, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                   vocab=30522)),
    "gpt24": ("pir", "gpt", dict(layers=24, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                 vocab=50257)),
    "gpt48": ("pir", "gpt", dict(layers=48, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                 vocab=50257)),
    "resnet152": ("pir", "resnet152", dict(image_size=224)),
    "resnet50": ("pir", "resnet50", dict(image_size=224)),
    "legacy_resnet50": ("legacy", "resnet50", dict(image_size=224)),
    "legacy_transformer12": ("legacy", "transformer",
                             dict(layers=12, d_model=768, heads=12, d_ff=3072, seq_len=128,
                                  vocab=30522)),
}
STEPS = ("level0", "level1", "level2", "budget", "analyze")


def build(name: str):
    """``(main program, fetch list)`` of program ``name``, built fresh."""
    import paddle

    from memopt.testing import models

    ir, model, opts = PROGRAMS[name]
    if model == "resnet152":
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            size = opts["image_size"]
            x = paddle.static.data("image", [-1, 3, size, size], "float32")
            y = paddle.static.data("label", [-1, 1], "int64")
            logits = paddle.vision.models.resnet152(num_classes=10)(x)
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
            paddle.optimizer.Momentum(0.01).minimize(loss)
        return main, [loss, logits]
    built = models.build(model, ir, BATCH, **opts)
    return built.main, built.fetch_list


def _program_text(program) -> str:
    """The program as its plan changes it: PIR's text; a legacy program's
    ops (type, input and output slots), not its desc, which keeps each op's
    Python call stack (the paths of the ``PYTHONPATH`` it was built under)."""
    if hasattr(program, "global_block") and hasattr(program, "num_ops"):
        return str(program)   # PIR
    return json.dumps([[(op.type, {s: op.input(s) for s in op.input_names},
                         {s: op.output(s) for s in op.output_names}) for op in block.ops]
                       for block in program.blocks])


def _digest(program, report) -> str:
    d = report.to_dict()
    keep = {k: d.get(k) for k in ("merged_count", "peak_before", "peak_after", "not_merged",
                                  "recomputed", "added_compute_percent")}
    keep["reuses"] = sorted((r["var"], r["takes"], r["how"]) for r in d.get("reuses", []))
    text = _program_text(program) + json.dumps(keep, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_step(name: str, step: str, budget: int):
    """Build ``name`` fresh, run ``step`` once; ``((wall, cpu) seconds, digest, ops)``."""
    import memopt

    main, fetch = build(name)
    ops = len(main.global_block().ops)
    start, cpu = time.perf_counter(), time.process_time()
    if step == "analyze":
        analysis = memopt.analyze(main, BATCH, fetch_list=fetch)
        peak = analysis.total_peak(BATCH)
        seconds = time.perf_counter() - start, time.process_time() - cpu
        return seconds, hashlib.sha256(str(peak).encode()).hexdigest()[:12], ops
    if step == "budget":
        report = memopt.memory_optimize(main, fetch_list=fetch, budget=budget,
                                        batch_size=BATCH)
    else:
        report = memopt.memory_optimize(main, fetch_list=fetch, level=int(step[-1]),
                                        batch_size=BATCH if step == "level2" else None)
    seconds = time.perf_counter() - start, time.process_time() - cpu
    return seconds, _digest(main, report), ops


def worker(name: str, repeat: int, profile: str, steps=STEPS) -> None:
    import paddle

    import memopt

    paddle.enable_static()
    main, fetch = build(name)
    budget = int(BUDGET_FRACTION * memopt.analyze(main, BATCH, fetch_list=fetch).total_peak(BATCH))
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run_step(name, profile, budget)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    out = {"budget_bytes": budget}
    for step in steps:
        times, cpus, digest = [], [], ""
        for _ in range(repeat):
            try:
                (seconds, cpu), digest, ops = run_step(name, step, budget)
            except Exception as exc:   # a row shows the error instead of a time
                seconds, cpu, digest = float("nan"), float("nan"), f"{type(exc).__name__}"
                ops = out.get("ops", 0)
            times.append(seconds)
            cpus.append(cpu)
        out[step] = _bench.median(times)
        out[step + "_cpu"] = _bench.median(cpus)
        out[step + "_digest"] = digest
        out["ops"] = ops
    print(json.dumps(out))


def _per_thousand_ops(r: dict) -> str:
    """CPU seconds per 1,000 ops of each step measured in ``r`` (a worker's line)."""
    ops = r.get("ops") or 0
    if not ops:
        return "-"
    return "/".join(f"{1000 * r[s + '_cpu'] / ops:.2f}" if s in r else "-" for s in STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--versions", default="",
                        help="comma-separated PYTHONPATHs to compare, alternating")
    parser.add_argument("--worker", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default="", choices=("",) + STEPS)
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    if args.worker is not None:
        worker(args.programs, args.repeat, args.profile, args.steps.split(","))
        return
    versions = [v for v in args.versions.split(",") if v] or [None]
    cols = ["program", "ops"] + (["version"] if versions[0] else []) + [
        "level 0 s", "level 1 s", "level 2 s", "budget s", "analyze s",
        "per 1k ops (CPU s: 0/1/2/budget/analyze)", "digest (0/1/2/budget)"]
    table = _bench.Table(cols, "lr" + ("l" if versions[0] else "") + "rrrrrll")
    for name in args.programs.split(","):
        ir = PROGRAMS[name][0]
        for version in versions:
            env = {"FLAGS_enable_pir_api": "0" if ir == "legacy" else "1"}
            if version:
                env["PYTHONPATH"] = version
            r = _bench.run_worker(__file__, ["--programs", name, "--repeat", args.repeat,
                                             "--steps", args.steps], env=env, timeout=3600)
            if "error" in r:
                table.row(name, "", *([version] if version else []), r["error"], "", "", "", "",
                          "", "")
                continue
            digest = "/".join(r[s + "_digest"][:6] for s in STEPS[:4] if s in r)
            table.row(name, r["ops"], *([version] if version else []),
                      *(f"{r[s]:.2f} ({r[s + '_cpu']:.2f})" if s in r else "-" for s in STEPS),
                      _per_thousand_ops(r), digest)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
