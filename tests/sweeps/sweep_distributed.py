"""memopt on distributed programs the bench and the tests do not run: two CPU ranks.

One ``paddle.distributed.spawn`` (2 ranks, gloo) per strategy of
``memopt/testing/fleet_strategies.py`` (fleet gradient merge k=4 / k=3
without averaging, recompute with checkpoints, lars, lamb, fused all-reduce,
graph optimization, sharding with Adam and with gradient merge, amp O1/O2,
pipeline, data parallel by hand with ``c_allreduce_sum`` or ``all_reduce``,
``paddle.distributed.split`` tensor parallel, fleet under PIR, a PIR
data-parallel program with Adam; auto-parallel ``to_static`` with gradient
merge, sharding stage 1, amp bf16), each killed after a timeout.
In each rank every option (``memopt.testing.dist_sweep.Option``: unoptimized,
levels 0/1/2, ``budget=``, GC on and off, ``memory_optimize`` before
``minimize``) builds the program afresh, runs 4 optimizer steps
and is compared with the unoptimized run of the same rank: losses and every
persistable variable bit for bit, the communication ops unchanged.

The cells are tests of ``test_sweep_distributed.py``: strategy x option ->
ok / clean refusal / BUG / Paddle fails unchanged (:func:`option_cell`).
"""
from __future__ import annotations

from memopt.testing.dist_sweep import Option, verdict

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


def option_cell(strategy: str, result: dict, index: int) -> str:
    """The cell of option ``OPTIONS[index]`` in one launch's ``result``:
    ``ok`` (both ranks bit-identical to their unoptimized run, the
    communication ops unchanged), ``refused: ...`` (a memopt error, the
    program unchanged; or memopt's guard refused the run), ``paddle fails
    unchanged: ...`` or ``BUG: ...`` (a hang, a launch that made no ranks,
    a difference)."""
    if result["status"] == "timeout":
        return "BUG: hang (killed)"
    ranks = result["ranks"]
    if len(ranks) < 2:
        return f"BUG: launch failed: {_first_line(result['stderr'])}"
    reference = [r["options"][0] for r in ranks]
    if reference[0]["outcome"] != "ran":
        return (f"paddle fails unchanged ({reference[0]['outcome']}): "
                f"{_first_line(reference[0].get('message'))}")
    recs = [r["options"][index] for r in ranks]
    if index == 0:
        return "ok (the reference" + _ranks_note(strategy, recs) + ")"
    verdicts = sorted({verdict(ref, rec) for ref, rec in zip(reference, recs)})
    text = " / ".join(verdicts)
    if any(v.startswith("BUG") for v in verdicts):
        message = _first_line(recs[0].get("message"))
        return "BUG: " + text + (f" ({message})" if message else "")
    if text in ("refused", "refused at run"):
        return f"{text}: {_first_line(recs[0].get('message'))}"
    return "ok" + ("" if text == "ok" else f" ({text})")  # "over budget": measured, not judged
