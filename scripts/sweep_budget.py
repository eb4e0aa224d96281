"""Sweep ``memory_optimize(budget=..., batch_size=...)`` over PIR training
programs that ``memopt.testing.models`` does not build (CPU, Paddle's defaults).

For each model a fresh process measures the unchanged program's peak ``P``
(``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)`` over
``--steps`` training steps, reset after the startup program: parameters and
optimizer state included) at batch ``B``; then, each in a fresh process,
``memory_optimize(budget=f * P, batch_size=B)`` (a float number of bytes)
for each fraction ``f``: planned or BudgetError, measured peak / budget
(the promise: <= 1.00), the added compute the report gives, whether losses,
fetches and parameters over the steps equal the unchanged run's bit for bit
(if not, both again with one executor thread), and whether the peak never
rose as the budget fell.  On a BudgetError the worker also checks the
program is exactly as it was (``str(program)``), and the driver runs
``budget=err.smallest_budget`` at ``B`` and ``budget=f * P`` at
``err.largest_batch`` (both must plan and fit).

Usage::

    python scripts/sweep_budget.py                       # every model
    python scripts/sweep_budget.py --models gru,vgg11 --fractions 1,0.6
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys

import _bench

FRACTIONS = (1.0, 0.8, 0.6, 0.45)


def _image(net, size, classes=10, aux=False):
    """A classifier on ``[B, 3, size, size]`` images: cross entropy of every
    output ``net`` returns (GoogLeNet's auxiliary heads too), Momentum."""
    def build():
        import paddle

        x = paddle.static.data("image", [-1, 3, size, size], "float32")
        y = paddle.static.data("label", [-1, 1], "int64")
        outs = net()(x)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        loss = paddle.add_n([paddle.mean(paddle.nn.functional.cross_entropy(o, y))
                             for o in outs])
        paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)

        def feed(rng, b):
            return {"image": rng.standard_normal((b, 3, size, size)).astype("float32"),
                    "label": rng.integers(0, classes, (b, 1)).astype("int64")}
        return feed, [loss, outs[0]]
    return build


def _vgg11():
    """VGG-11's convolutions (paddle.vision) with a small dropout head (its
    own 25088x4096 head alone is 400 MB)."""
    import paddle
    from paddle.vision.models import vgg11

    nn = paddle.nn
    return nn.Sequential(vgg11(num_classes=0, with_pool=False), nn.Flatten(),
                         nn.Dropout(0.5), nn.Linear(512, 10))


def _resnet18_dropout():
    import paddle
    from paddle.vision.models import resnet18

    nn = paddle.nn
    return nn.Sequential(resnet18(num_classes=0), nn.Flatten(), nn.Dropout(0.3),
                         nn.Linear(512, 10))


def _vision(name, **kw):
    def net():
        import paddle.vision.models as m

        return getattr(m, name)(num_classes=10, **kw)
    return net


def _transformer():
    """nn.TransformerEncoder (2 layers, dropout 0.1) with a key-padding
    attention mask fed per batch, Adam."""
    import paddle

    nn = paddle.nn
    seq, d, vocab = 32, 64, 200
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    mask = paddle.static.data("mask", [-1, 1, 1, seq], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = nn.Embedding(vocab, d)(tokens)
    layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.1)
    h = nn.TransformerEncoder(layer, 2)(h, src_mask=mask)
    logits = nn.Linear(d, 5)(paddle.mean(h, axis=1))
    loss = paddle.mean(nn.functional.cross_entropy(logits, y))
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng, b):
        lengths = rng.integers(seq // 2, seq + 1, b)
        m = (rng.random((b, 1, 1, seq)) * 0).astype("float32")
        for i, n in enumerate(lengths):
            m[i, ..., n:] = -1e4
        return {"tokens": rng.integers(0, vocab, (b, seq)).astype("int64"), "mask": m,
                "label": rng.integers(0, 5, (b, 1)).astype("int64")}
    return feed, [loss, logits]


def _rnn(cell):
    def build():
        import paddle

        nn = paddle.nn
        seq, feat = 16, 24
        x = paddle.static.data("x", [-1, seq, feat], "float32")
        y = paddle.static.data("label", [-1, 1], "int64")
        out, _ = getattr(nn, cell)(feat, 48, num_layers=2)(x)
        logits = nn.Linear(48, 4)(out[:, -1])
        loss = paddle.mean(nn.functional.cross_entropy(logits, y))
        paddle.optimizer.Adam(1e-3).minimize(loss)

        def feed(rng, b):
            return {"x": rng.standard_normal((b, seq, feat)).astype("float32"),
                    "label": rng.integers(0, 4, (b, 1)).astype("int64")}
        return feed, [loss, logits]
    return build


def _embedding_clip():
    """Embedding bag + MLP, gradients clipped by global norm, AdamW with
    weight decay."""
    import paddle

    nn = paddle.nn
    seq, vocab = 48, 5000
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = nn.Embedding(vocab, 64)(tokens)
    h = nn.functional.relu(nn.Linear(64, 256)(h))
    h = nn.Linear(256, 64)(nn.Dropout(0.2)(h))
    logits = nn.Linear(64, 8)(paddle.mean(h, axis=1))
    loss = paddle.mean(nn.functional.cross_entropy(logits, y))
    paddle.optimizer.AdamW(1e-3, weight_decay=0.01,
                           grad_clip=nn.ClipGradByGlobalNorm(1.0)).minimize(loss)

    def feed(rng, b):
        return {"tokens": rng.integers(0, vocab, (b, seq)).astype("int64"),
                "label": rng.integers(0, 8, (b, 1)).astype("int64")}
    return feed, [loss, logits]


#: name -> (batch, builder() -> (feed(rng, batch), fetch list, the loss first))
MODELS = {
    "vgg11": (8, _image(_vgg11, 32)),
    "squeezenet1_1": (8, _image(_vision("squeezenet1_1"), 64)),
    "shufflenet_v2_x0_5": (16, _image(_vision("shufflenet_v2_x0_5"), 64)),
    "mobilenet_v3_small": (16, _image(_vision("mobilenet_v3_small"), 64)),
    "googlenet": (2, _image(_vision("googlenet"), 192)),
    "resnet18_dropout": (8, _image(_resnet18_dropout, 64)),
    "transformer_encoder": (16, _transformer),
    "lstm2": (16, _rnn("LSTM")),
    "gru2": (16, _rnn("GRU")),
    "embedding_clip_adamw": (32, _embedding_clip),
    # not swept, Paddle 3.3.1 does not run them on one CPU process in PIR:
    # AMP O1 (paddle.static.amp.decorate: check_finite_and_unscale_ gets
    # None; paddle.amp.auto_cast bfloat16 segfaults in the oneDNN
    # matmul_grad; float16 has no CPU matmul) and GradientMergeOptimizer
    # (legacy programs only: "The loss should be an Variable")
}


def worker(name: str, config: str, batch: int, budget: float, steps: int) -> dict:
    import numpy as np
    import paddle

    paddle.enable_static()
    from paddle.base import core

    import memopt

    main, startup, feed, fetch = _bench.build_pir_model(MODELS, name)
    out: dict = {"model": name, "config": config, "batch": batch, "budget": budget}
    if config == "budget":
        before = str(main)
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                report = memopt.memory_optimize(main, budget=budget, batch_size=batch,
                                                fetch_list=fetch, print_log=True)
        except memopt.BudgetError as exc:
            out.update(error="BudgetError", smallest=exc.smallest_budget,
                       largest=exc.largest_batch, unchanged=str(main) == before,
                       message=str(exc)[:300])
            return out
        except Exception as exc:
            out.update(error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                       unchanged=str(main) == before)
            return out
        out.update(added=report.added_compute_percent, recomputed=len(report.recomputed),
                   predicted=report.peak_after,
                   log_says_recompute=("recompute" in log.getvalue().lower())
                   if report.recomputed else None)
    rng = np.random.default_rng(3)
    digest = hashlib.sha256()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(11)
        exe.run(startup)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        for _ in range(steps):
            for value in exe.run(main, feed=feed(rng, batch), fetch_list=fetch):
                digest.update(np.asarray(value).tobytes())
        out["peak"] = core.host_memory_stat_peak_value("Allocated", 0)
        for pname in _bench.pir_parameter_names(main):
            digest.update(np.array(scope.find_var(pname).get_tensor()).tobytes())
    out["digest"] = digest.hexdigest()
    return out


def run(name, config, batch, budget, steps, env=None) -> dict:
    return _bench.run_worker(__file__, [name, config, batch, repr(float(budget)), steps], env)


def sweep(name, steps, fractions) -> dict:
    batch = MODELS[name][0]
    base = run(name, "default", batch, 0, steps)
    row = {"model": name, "batch": batch, "base": base, "budgets": []}
    if "peak" not in base:
        return row
    for f in fractions:
        r = run(name, "budget", batch, f * base["peak"], steps)
        if r.get("error") == "BudgetError":
            r["at_smallest"] = run(name, "budget", batch, r["smallest"], steps)
            if r["largest"]:
                r["at_largest"] = run(name, "budget", r["largest"], f * base["peak"], steps)
        row["budgets"].append((f, r))
    differs = [(f, r) for f, r in row["budgets"]
               if r.get("digest", base["digest"]) != base["digest"]]
    if differs:
        # Paddle's multi-thread executor runs the random ops of independent
        # branches (GoogLeNet's three dropout heads) in whichever order its
        # threads reach them, so the unchanged program's own results hang on
        # its schedule; with one thread (FLAGS_new_executor_serial_run) the
        # order is the program's dataflow order, the same in both programs
        serial = {"FLAGS_new_executor_serial_run": "1"}
        f = differs[0][0]
        a = run(name, "default", batch, 0, steps, serial)
        b = run(name, "budget", batch, f * base["peak"], steps, serial)
        row["serial_same"] = "digest" in a and a.get("digest") == b.get("digest")
    return row


def _fit(r, base_digest=None) -> str:
    if "peak" not in r:
        return r.get("error", "?")[:80]
    same = "" if base_digest is None or r["digest"] == base_digest else " NOT-IDENTICAL"
    return f"{r['peak'] / r['budget']:.2f}{same}"


def table(rows) -> str:
    fr = [f for f, _ in rows[0]["budgets"]] if rows else FRACTIONS
    head = ["model", "batch", "default peak"] + [f"b={round(f * 100)}%" for f in fr] \
        + ["monotone", "bit-identical", "BudgetError follow-ups"]
    out: list = []
    _bench.Table(head, out=out.append)
    for row in rows:
        base = row["base"]
        if "peak" not in base:
            out.append(f"| {row['model']} | {row['batch']} | {base.get('error')} |")
            continue
        cells = [row["model"], str(row["batch"]), f"{base['peak'] / 2 ** 20:.1f} MiB"]
        peaks, same, notes = [], True, []
        for f, r in row["budgets"]:
            if "peak" in r:
                cells.append(f"{r['peak'] / r['budget']:.2f} (+{r.get('added', 0):.0f}%, "
                             f"{r.get('recomputed', 0)} rec)")
                peaks.append(r["peak"])
                same &= r["digest"] == base["digest"]
                if r.get("log_says_recompute") is False:
                    notes.append(f"{f}: print_log silent on recompute")
            elif r.get("error") == "BudgetError":
                cells.append("BudgetError" + ("" if r.get("unchanged") else " CHANGED-PROGRAM"))
                notes.append(f"{f}: smallest {r['smallest'] / 2 ** 20:.1f} MiB -> "
                             f"{_fit(r['at_smallest'], base['digest'])}; largest batch "
                             f"{r['largest']} -> "
                             + (_fit(r['at_largest']) if 'at_largest' in r else "-"))
            else:
                cells.append(r.get("error", "?")[:80].replace("|", "/")
                             + ("" if r.get("unchanged", True) else " CHANGED-PROGRAM"))
        mono = all(b <= a for a, b in zip(peaks, peaks[1:]))
        identical = "yes" if same else "NO" + {
            True: " (identical with one executor thread)",
            False: " (nor with one executor thread)"}.get(row.get("serial_same"), "")
        cells += ["yes" if mono else "NO", identical, "; ".join(notes) or "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", nargs=5)
    args = parser.parse_args(argv)
    if args.worker:
        name, config, batch, budget, steps = args.worker
        print(json.dumps(worker(name, config, int(batch), float(budget), int(steps))))
        return 0
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for name in args.models.split(","):
        rows.append(sweep(name, args.steps, fractions))
        print(json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
