"""memopt on distributed programs the bench and the tests do not run: two CPU ranks.

One ``paddle.distributed.spawn`` (2 ranks, gloo) per strategy of
``memopt/testing/fleet_strategies.py`` (fleet gradient merge k=4 / k=3
without averaging, recompute with checkpoints, lars, lamb, fused all-reduce,
graph optimization, sharding with Adam and with gradient merge, amp O1/O2,
pipeline, data parallel by hand with ``c_allreduce_sum`` or ``all_reduce``,
``paddle.distributed.split`` tensor parallel, fleet under PIR, a PIR
data-parallel program with Adam; auto-parallel ``to_static`` with gradient
merge, sharding stage 1, amp bf16), each killed after ``--timeout`` seconds.
In each rank every option (``memopt.testing.dist_sweep.Option``: unoptimized,
levels 0/1/2, ``budget=``, GC on and off, ``memory_optimize`` before
``minimize``) builds the program afresh, runs ``--steps`` optimizer steps
and is compared with the unoptimized run of the same rank: losses and every
persistable variable bit for bit, the communication ops unchanged.

Prints a markdown table: strategy x option -> verdict (ok / clean refusal /
BUG / Paddle fails unchanged), ``memopt.estimate`` of the rank's program as
run over the measured peak per rank (lowest optimizer step of 2-4,
``host_memory_stat_peak_value('Allocated', 0)``, what was allocated before
the startup program left out; auto-parallel rows: no estimate, the step's
peak over what was allocated before it).  Exit status 1 on any BUG.

    python scripts/sweep_distributed.py                 # every strategy, ~3 min
    python scripts/sweep_distributed.py gm4 lars        # some
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from memopt.testing.dist_sweep import Option, SweepConfig, launch, verdict  # noqa: E402
from memopt.testing.fleet_strategies import STRATEGIES  # noqa: E402

OPTIONS = (Option(), Option(level=0), Option(level=1), Option(level=2),
           Option(budget=0.5), Option(budget=0.0), Option(level=1, before=True),
           Option(gc=False), Option(level=1, gc=False), Option(level=2, gc=False))


def _first_line(message: str) -> str:
    lines = [line for line in (message or "").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:160].replace("|", "/")


def _ranks_note(strategy: str, recs: list) -> str:
    """Whether the unoptimized program keeps the ranks' parameters equal
    (every strategy here but tensor parallelism should)."""
    import numpy as np

    a, b = (rec.get("params", {}) for rec in recs)
    common = sorted(set(a) & set(b))
    differ = [k for k in common if not np.array_equal(a[k], b[k])]
    if not differ or strategy.startswith("ap_mp"):
        return ""
    return (f" (Paddle's program does not keep the ranks in step: {len(differ)} of "
            f"{len(common)} persistable variables differ between the ranks)")


def rows_of(strategy: str, result: dict) -> list:
    """Markdown rows of one launch."""
    what = STRATEGIES[strategy][0]
    if result["status"] == "timeout":
        return [f"| {strategy} | {what} | all | BUG: hang (killed) | |"]
    ranks = result["ranks"]
    if len(ranks) < 2:
        return [f"| {strategy} | {what} | all | launch failed: "
                f"{_first_line(result['stderr'])} | |"]
    rows = []
    reference = [r["options"][0] for r in ranks]
    for i, option in enumerate(ranks[0]["options"]):
        recs = [r["options"][i] for r in ranks]
        if reference[0]["outcome"] != "ran":
            text = f"Paddle fails unchanged ({reference[0]['outcome']}): " \
                   f"{_first_line(reference[0].get('message'))}"
            rows.append(f"| {strategy} | {what} | {option['label']} | {text} | |")
            break
        verdicts = {verdict(ref, rec) for ref, rec in zip(reference, recs)}
        text = " / ".join(sorted(verdicts))
        if text in ("refused", "refused at run"):
            where = "" if text == "refused" else " at the first run"
            text = f"clean refusal{where}: {_first_line(recs[0].get('message'))}"
        elif text.startswith("BUG"):
            text += f" ({_first_line(recs[0].get('message'))})" if recs[0].get("message") else ""
        if i == 0:
            text = "reference" + _ranks_note(strategy, recs)
        ratio = ""
        if all(rec.get("estimate") and rec.get("measured") for rec in recs):
            ratio = " / ".join(f"{rec['estimate'] / rec['measured']:.2f}" for rec in recs)
            ratio += " (" + " / ".join(f"{rec['measured'] / 1024:.0f}" for rec in recs) + " KiB)"
        elif all(rec.get("step_growth") for rec in recs):  # auto-parallel: no estimate
            ratio = "no estimate; step peak over the allocated before it " + " / ".join(
                f"{rec['step_growth'] / 1024:.1f}" for rec in recs) + " KiB"
        rows.append(f"| {strategy} | {what} | {option['label']} | {text} | {ratio} |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategies", nargs="*", default=list(STRATEGIES))
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    print("| strategy | program | memopt option | verdict (both ranks) | estimate / measured, rank 0 / 1 (measured) |")
    print("|---|---|---|---|---|")
    bug = False
    for strategy in args.strategies:
        start = time.time()
        result = launch(SweepConfig(strategy=strategy, options=OPTIONS, steps=args.steps),
                        tempfile.mkdtemp(prefix=f"sweep_{strategy}_"), timeout=args.timeout)
        for row in rows_of(strategy, result):
            bug |= "BUG" in row
            print(row, flush=True)
        print(f"<!-- {strategy}: {time.time() - start:.0f} s -->", file=sys.stderr)
    return 1 if bug else 0


if __name__ == "__main__":
    sys.exit(main())
