"""``level=2`` and ``budget=`` on three small PIR training programs of kinds
the other sweeps do not build (CPU, Paddle's defaults):

* ``decoder_loop``: a beam-search-like decoder: a ``while_loop`` whose body
  runs a ``static.nn.cond`` and whose condition reads the state (a
  data-dependent break), then a ``static.nn.switch_case`` head;
* ``cond_big_reads``: wide forward activations read by both branches of a
  ``cond`` (and by a ``switch_case``) well after they are made, so what a
  region op reads must stay pinned;
* ``gpt_clip_sched``: a small GPT (token and position embeddings, causal
  self-attention blocks with dropout, tied-free head) trained with
  ``ClipGradByGlobalNorm`` and AdamW on a warm-up + cosine LR scheduler.

Each configuration runs in a fresh process: ``default`` (unchanged),
``level2`` and ``budget`` at a fraction of the unchanged program's guarded
predicted peak with its fetches (what ``budget=`` checks against).  A worker builds the
program, applies memopt, runs the startup program, resets the allocator's
peak before each of ``--steps`` steps and reads
``host_memory_stat_peak_value('Allocated', 0)`` of each step (its lowest
and highest: Paddle's CPU collector frees on its own thread, so on a busy
machine a step can peak above the plan, ``pir_budget.GC_LAG_OPS``); then one step of a
``clone(paddle.pir.IrMapping())`` of the program (the eval workflow).  The
digest covers every fetch, the clone's fetches and the parameters after
the steps; a BudgetError worker checks ``str(program)`` is unchanged.

The cells are tests of ``test_sweep_region_programs.py`` (``--worker MODEL
CONFIG FRACTION STEPS`` prints one JSON object).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

import cells

BATCH = int(os.environ.get("SWEEP_BATCH", 8))
#: cond_big_reads' batch: its activations (batch x 1024 floats each) outweigh
#: its parameters and their Momentum state
BIG_BATCH = 64
FRACTIONS = (1.0, 0.9, 0.8)


def _decoder_loop(paddle):
    """A decoder loop with a data-dependent break and a cond in its body."""
    nn, F = paddle.nn, paddle.nn.functional
    width, vocab = 64, 32
    x = paddle.static.data("x", [-1, width], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    head = paddle.static.data("head", [1], "int32")
    enc = F.relu(nn.Linear(width, width)(x))
    enc = nn.Linear(width, width)(enc)
    cell, gate, alt = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
    limit = paddle.full([1], 4, "int64")

    def keep_going(i, h):
        # stops after 4 steps, or earlier once the state's mean is large
        return paddle.logical_and(i < limit, paddle.mean(paddle.abs(h)) < 50.0)

    def body(i, h):
        s = paddle.tanh(cell(h)) + enc * 0.5
        s = paddle.static.nn.cond(paddle.mean(s) > 0, lambda: F.sigmoid(gate(s)) * s,
                                  lambda: paddle.tanh(alt(s)) - s)
        return [i + 1, s + h * 0.5]

    _, h = paddle.static.nn.while_loop(keep_going, body, [paddle.full([1], 0, "int64"), enc])
    outs = [nn.Linear(width, vocab) for _ in range(3)]
    logits = paddle.static.nn.switch_case(
        head, {0: lambda: outs[0](h), 1: lambda: outs[1](F.relu(h)),
               2: lambda: outs[2](paddle.tanh(h))})
    loss = paddle.mean(F.cross_entropy(logits, y))
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, width)).astype("float32"),
                "label": rng.integers(0, vocab, (BATCH, 1)).astype("int64"),
                "head": np.array([rng.integers(0, 3)], "int32")}
    return feed, [loss, logits], None


def _cond_big_reads(paddle):
    """Wide activations made early and read inside a cond and a switch_case
    after more layers (their lifetimes end inside region ops)."""
    nn, F = paddle.nn, paddle.nn.functional
    width, wide, classes = 64, 1024, 10
    x = paddle.static.data("x", [-1, width], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    flag = paddle.static.data("flag", [1], "float32")
    which = paddle.static.data("which", [1], "int32")
    big1 = F.relu(nn.Linear(width, wide)(x))
    big2 = F.gelu(big1 * 0.5 + paddle.sin(big1))  # elementwise: activations, not weights
    h = F.relu(nn.Linear(wide, width)(big2))
    for _ in range(2):
        h = F.relu(nn.Linear(width, width)(h))
    down_a, down_b = nn.Linear(wide, width), nn.Linear(wide, width)
    h = paddle.static.nn.cond(paddle.mean(flag) > 0, lambda: h + down_a(big1 * big2),
                              lambda: h - down_b(F.relu(big2 - big1)))
    heads = [nn.Linear(wide, width) for _ in range(2)]
    h = h + paddle.static.nn.switch_case(
        which, {0: lambda: heads[0](big1), 1: lambda: heads[1](F.dropout(big2, 0.2))},
        default=lambda: paddle.zeros_like(h))
    logits = nn.Linear(width, classes)(F.relu(h))
    loss = paddle.mean(F.cross_entropy(logits, y))
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)

    def feed(rng, batch=BIG_BATCH):
        return {"x": rng.standard_normal((batch, width)).astype("float32"),
                "label": rng.integers(0, classes, (batch, 1)).astype("int64"),
                "flag": np.array([rng.choice([-1.0, 1.0])], "float32"),
                "which": np.array([rng.integers(0, 3)], "int32")}
    return feed, [loss, logits], None


def _gpt_clip_sched(paddle):
    """Token + position embeddings, 2 pre-norm causal attention blocks with
    dropout, an LM head; ClipGradByGlobalNorm, AdamW on warm-up + cosine."""
    nn, F = paddle.nn, paddle.nn.functional
    vocab, seq, d, heads = 64, 16, 32, 4
    tok = paddle.static.data("tokens", [-1, seq], "int64")
    nxt = paddle.static.data("next", [-1, seq], "int64")
    pos = paddle.arange(seq, dtype="int64").unsqueeze(0)
    h = nn.Embedding(vocab, d)(tok) + nn.Embedding(seq, d)(pos)
    causal = paddle.triu(paddle.full([seq, seq], float("-inf"), "float32"), 1)
    for _ in range(2):
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1,
                                           normalize_before=True)
        h = layer(h, src_mask=causal)
    logits = nn.Linear(d, vocab)(nn.LayerNorm(d)(h))
    loss = paddle.mean(F.cross_entropy(logits, nxt.unsqueeze(-1)))
    sched = paddle.optimizer.lr.LinearWarmup(
        paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=10), 2, 0.0, 3e-3)
    paddle.optimizer.AdamW(sched, weight_decay=0.01,
                           grad_clip=nn.ClipGradByGlobalNorm(1.0)).minimize(loss)

    def feed(rng):
        t = rng.integers(0, vocab, (BATCH, seq + 1)).astype("int64")
        return {"tokens": t[:, :-1], "next": t[:, 1:]}
    return feed, [loss, logits], sched


PROGRAMS = {"decoder_loop": _decoder_loop, "cond_big_reads": _cond_big_reads,
            "gpt_clip_sched": _gpt_clip_sched}


def build(paddle, name):
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        feed, fetch, sched = PROGRAMS[name](paddle)
    return main, startup, feed, fetch, sched


def _param_names(program):
    return sorted(op.attrs()["parameter_name"] for op in program.global_block().ops
                  if op.name() == "builtin.parameter")


def worker(name: str, config: str, fraction: float, steps: int) -> dict:
    import paddle
    from paddle.base import core

    import memopt
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.budget import guarded_peak
    from memopt.paddle.pir.loops import runtime_for

    paddle.enable_static()
    main, startup, feed, fetch, sched = build(paddle, name)
    batch = BIG_BATCH if name == "cond_big_reads" else BATCH
    try:
        runtime = runtime_for(main, runtime_model("pir"), budget=True)
    except memopt.UnsupportedProgramError:  # a loop's trip count memopt cannot read
        runtime = runtime_for(main, runtime_model("pir"), budget=False)
    predicted = guarded_peak(memopt.analyze(main, batch, fetch_list=fetch, runtime=runtime),
                             batch)
    out: dict = {"model": name, "config": config, "fraction": fraction,
                 "predicted_default": predicted}
    if config == "budget":
        budget = int(predicted * fraction)
        out["budget"] = budget
        before = str(main)
        try:
            report = memopt.memory_optimize(main, budget=budget, batch_size=batch,
                                            fetch_list=fetch)
        except memopt.BudgetError as exc:
            out.update(error="BudgetError", smallest=exc.smallest_budget,
                       largest=exc.largest_batch, unchanged=str(main) == before)
            return out
        except memopt.UnsupportedProgramError as exc:
            out.update(error="refused: " + str(exc)[:60], unchanged=str(main) == before)
            return out
        out.update(added=report.added_compute_percent, recomputed=len(report.recomputed),
                   predicted=report.predicted_peak_bytes
                   if hasattr(report, "predicted_peak_bytes") else None)
    elif config == "level2":
        report = memopt.memory_optimize(main, level=2, batch_size=batch, fetch_list=fetch)
        out["notes"] = [n for n in report.notes if n.startswith("level 2")]
        out["predicted"] = guarded_peak(
            memopt.analyze(main, batch, fetch_list=fetch, runtime=runtime), batch)
    rng = np.random.default_rng(3)
    digest = hashlib.sha256()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        steps_peaks = []
        for _ in range(steps):
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            for value in exe.run(main, feed=feed(rng), fetch_list=fetch):
                digest.update(np.asarray(value).tobytes())
            steps_peaks.append(core.host_memory_stat_peak_value("Allocated", 0))
            if sched is not None:
                sched.step()
        out["peak"], out["low"] = max(steps_peaks), min(steps_peaks)
        for pname in _param_names(main):
            digest.update(np.array(scope.find_var(pname).get_tensor()).tobytes())
        mapping = paddle.pir.IrMapping()
        clone = main.clone(mapping)
        for value in exe.run(clone, feed=feed(rng),
                             fetch_list=[mapping.look_up(v) for v in fetch]):
            digest.update(np.asarray(value).tobytes())
    out["digest"] = digest.hexdigest()
    return out


def run(name: str, config: str, fraction: float, steps: int) -> dict:
    """The worker's result, in a fresh process."""
    return cells.fresh_process(__file__, [name, config, repr(fraction), steps])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=4, metavar=('MODEL', 'CONFIG', 'FRACTION', 'STEPS'), required=True)
    args = parser.parse_args(argv)
    name, config, fraction, steps = args.worker
    print(json.dumps(worker(name, config, float(fraction), int(steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
