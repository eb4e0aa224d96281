"""Check ``level=2`` and ``budget=`` (issue 15) on PIR training programs no
other script builds, as a user would run them (CPU, Paddle's defaults: GC
on, the in-place pass, the multi-thread executor).

For each model, each configuration in a fresh process: the unchanged
program (its predicted peak ``memopt.analyze(main, B).total_peak()`` and its
measured step peaks), ``memory_optimize(main, level=2, batch_size=B)`` and
``memory_optimize(main, budget=X, batch_size=B)`` for ``X`` at 100/80/60/40%
of the predicted peak (``pred``) and of the measured one (``meas``: the
unchanged program's lowest step).  A step's peak is
``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)`` reset
before the step (parameters and optimizer state included, they are
allocated by then); the table shows the lowest and the largest of steps
2..``--steps`` over the budget (the promise: <= 1.00), the added compute,
the planning seconds of the call, whether the losses, fetches and
parameters over the steps equal the unchanged run's bit for bit, and
whether the lowest step peak never rose as the budget fell.  A BudgetError
must leave the program as it was (``str(program)``); planning again at
``err.smallest_budget`` (batch B) and at ``err.largest_batch`` (the same
budget) must succeed and fit (both are run).

Usage::

    python scripts/sweep_budget_unknown.py                        # every model
    python scripts/sweep_budget_unknown.py --models gpt6,mixer --fractions 1,0.6
    python scripts/sweep_budget_unknown.py 2> rows.jsonl   # each model's row on stderr
    python scripts/sweep_budget_unknown.py --rows rows.jsonl   # the table again
"""
from __future__ import annotations

import os
import argparse
import contextlib
import hashlib
import io
import json
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))  # the shared bench harness
import _bench  # noqa: E402

FRACTIONS = (1.0, 0.8, 0.6, 0.4)


def _classify(logits, classes):
    """Cross entropy of ``logits`` against a fed ``label`` [B, 1]."""
    import paddle

    y = paddle.static.data("label", [-1, 1], "int64")
    return paddle.mean(paddle.nn.functional.cross_entropy(logits, y)), classes


def _vit_tiny():
    """ViT-tiny: a 4x4 patch-embedding conv on 32x32 images (64 tokens, a
    class token, learned positions), 4 pre-norm encoder layers of width
    96 (3 heads), AdamW."""
    import paddle

    nn = paddle.nn
    d = 96
    x = paddle.static.data("image", [-1, 3, 32, 32], "float32")
    h = nn.Conv2D(3, d, 4, stride=4)(x)                      # [B, d, 8, 8]
    h = paddle.transpose(paddle.flatten(h, 2), [0, 2, 1])    # [B, 64, d]
    cls = paddle.create_parameter([1, 1, d], "float32")
    h = paddle.concat([paddle.expand(cls, [paddle.shape(h)[0], 1, d]), h], axis=1)
    h = h + paddle.create_parameter([1, 65, d], "float32")
    layer = nn.TransformerEncoderLayer(d, 3, 4 * d, dropout=0.0, activation="gelu",
                                       normalize_before=True)
    h = nn.TransformerEncoder(layer, 4, norm=nn.LayerNorm(d))(h)
    logits = nn.Linear(d, 10)(h[:, 0])
    loss, _ = _classify(logits, 10)
    paddle.optimizer.AdamW(1e-3, weight_decay=0.05).minimize(loss)
    return _image_feed(32, 10), [loss, logits]


def _image_feed(size, classes, channels=3):
    def feed(rng, b):
        return {"image": rng.standard_normal((b, channels, size, size)).astype("float32"),
                "label": rng.integers(0, classes, (b, 1)).astype("int64")}
    return feed


def _mixer():
    """MLP-Mixer: 4x4 patches of 32x32 images (64 tokens, 128 channels),
    4 blocks of token mixing (on the transposed tokens) and channel mixing,
    each a LayerNorm, a GELU MLP and a residual; Adam."""
    import paddle

    nn = paddle.nn
    F = nn.functional
    d, tokens = 128, 64
    x = paddle.static.data("image", [-1, 3, 32, 32], "float32")
    h = paddle.transpose(paddle.flatten(nn.Conv2D(3, d, 4, stride=4)(x), 2), [0, 2, 1])
    for _ in range(4):
        t = paddle.transpose(nn.LayerNorm(d)(h), [0, 2, 1])   # [B, d, tokens]
        t = nn.Linear(2 * tokens, tokens)(F.gelu(nn.Linear(tokens, 2 * tokens)(t)))
        h = h + paddle.transpose(t, [0, 2, 1])
        c = nn.Linear(4 * d, d)(F.gelu(nn.Linear(d, 4 * d)(nn.LayerNorm(d)(h))))
        h = h + c
    logits = nn.Linear(d, 10)(paddle.mean(nn.LayerNorm(d)(h), axis=1))
    loss, _ = _classify(logits, 10)
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return _image_feed(32, 10), [loss, logits]


def _audio():
    """A Conv1D audio classifier on 1 s of 8 kHz waveform: a strided stem,
    8 residual blocks (Conv1D, BatchNorm1D, ReLU, twice), a stride-2 step
    every two blocks, global average pooling; Momentum."""
    import paddle

    nn = paddle.nn
    F = nn.functional
    x = paddle.static.data("wave", [-1, 1, 8000], "float32")
    h = F.relu(nn.BatchNorm1D(32)(nn.Conv1D(1, 32, 16, stride=4, padding=6)(x)))
    c = 32
    for i in range(8):
        stride = 2 if i % 2 == 1 else 1
        out = 2 * c if stride == 2 and c < 128 else c
        r = F.relu(nn.BatchNorm1D(out)(nn.Conv1D(c, out, 9, stride=stride, padding=4)(h)))
        r = nn.BatchNorm1D(out)(nn.Conv1D(out, out, 9, padding=4)(r))
        skip = h if (stride == 1 and out == c) else nn.Conv1D(c, out, 1, stride=stride)(h)
        h = F.relu(r + skip)
        c = out
    logits = nn.Linear(c, 12)(paddle.mean(h, axis=2))
    loss, _ = _classify(logits, 12)
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)

    def feed(rng, b):
        return {"wave": rng.standard_normal((b, 1, 8000)).astype("float32"),
                "label": rng.integers(0, 12, (b, 1)).astype("int64")}
    return feed, [loss, logits]


def _seq2seq():
    """A GRU encoder-decoder: source and target embeddings, a 1-layer GRU
    encoder whose final state starts a 1-layer GRU decoder (teacher
    forcing), a vocabulary projection and token cross entropy; Adam."""
    import paddle

    nn = paddle.nn
    vocab, d, src_len, tgt_len = 1000, 128, 24, 20
    src = paddle.static.data("src", [-1, src_len], "int64")
    tgt = paddle.static.data("tgt", [-1, tgt_len], "int64")
    nxt = paddle.static.data("next", [-1, tgt_len], "int64")
    _, state = nn.GRU(d, d)(nn.Embedding(vocab, d)(src))
    out, _ = nn.GRU(d, d)(nn.Embedding(vocab, d)(tgt), state)
    logits = nn.Linear(d, vocab)(out)
    loss = paddle.mean(nn.functional.cross_entropy(logits, paddle.unsqueeze(nxt, -1)))
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng, b):
        return {"src": rng.integers(0, vocab, (b, src_len)).astype("int64"),
                "tgt": rng.integers(0, vocab, (b, tgt_len)).astype("int64"),
                "next": rng.integers(0, vocab, (b, tgt_len)).astype("int64")}
    return feed, [loss, logits]


def _lstm_lm():
    """A 2-layer LSTM language model whose output projection is the input
    embedding's weight (tied), next-token cross entropy; SGD."""
    import paddle

    nn = paddle.nn
    vocab, d, seq = 2000, 128, 32
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    nxt = paddle.static.data("next", [-1, seq], "int64")
    emb = nn.Embedding(vocab, d)
    out, _ = nn.LSTM(d, d, num_layers=2)(emb(tokens))
    logits = paddle.matmul(out, emb.weight, transpose_y=True)
    loss = paddle.mean(nn.functional.cross_entropy(logits, paddle.unsqueeze(nxt, -1)))
    paddle.optimizer.SGD(0.1).minimize(loss)

    def feed(rng, b):
        return {"tokens": rng.integers(0, vocab, (b, seq)).astype("int64"),
                "next": rng.integers(0, vocab, (b, seq)).astype("int64")}
    return feed, [loss, logits]


def _efficientnet():
    """An EfficientNet-like net on 64x64 images: a stride-2 stem, 6 MBConv
    blocks (1x1 expansion, depthwise 3x3, squeeze-excitation, 1x1
    projection, batch norm, swish, residual where shapes allow); RMSProp."""
    import paddle

    nn = paddle.nn
    F = nn.functional
    x = paddle.static.data("image", [-1, 3, 64, 64], "float32")
    h = F.swish(nn.BatchNorm2D(16)(nn.Conv2D(3, 16, 3, stride=2, padding=1)(x)))
    c = 16
    for out, stride in ((16, 1), (24, 2), (24, 1), (40, 2), (40, 1), (80, 2)):
        e = 4 * c
        r = F.swish(nn.BatchNorm2D(e)(nn.Conv2D(c, e, 1)(h)))
        r = F.swish(nn.BatchNorm2D(e)(nn.Conv2D(e, e, 3, stride=stride, padding=1,
                                                 groups=e)(r)))
        s = F.adaptive_avg_pool2d(r, 1)
        s = F.sigmoid(nn.Conv2D(max(1, c // 4), e, 1)(F.swish(
            nn.Conv2D(e, max(1, c // 4), 1)(s))))
        r = nn.BatchNorm2D(out)(nn.Conv2D(e, out, 1)(r * s))
        h = h + r if (stride == 1 and out == c) else r
        c = out
    logits = nn.Linear(c, 10)(paddle.flatten(F.adaptive_avg_pool2d(h, 1), 1))
    loss, _ = _classify(logits, 10)
    paddle.optimizer.RMSProp(1e-3).minimize(loss)
    return _image_feed(64, 10), [loss, logits]


def _wide_deep():
    """Wide & Deep: 8 categorical fields, each a sparse embedding
    (``sparse=True``: SelectedRows gradients) of width 16 for the deep MLP
    (3 layers) and of width 1 for the wide part, plus 13 dense features;
    a sigmoid click loss; Adam (lazy mode)."""
    import paddle

    nn = paddle.nn
    F = nn.functional
    fields, vocab, dense_n = 8, 10000, 13
    ids = paddle.static.data("ids", [-1, fields], "int64")
    dense = paddle.static.data("dense", [-1, dense_n], "float32")
    click = paddle.static.data("click", [-1, 1], "float32")
    deep = paddle.flatten(nn.Embedding(vocab, 16, sparse=True)(ids), 1)
    deep = paddle.concat([deep, dense], axis=1)
    for width in (512, 256, 128):
        deep = F.relu(nn.Linear(deep.shape[-1], width)(deep))
    wide = paddle.sum(nn.Embedding(vocab, 1, sparse=True)(ids), axis=1)
    logit = nn.Linear(128, 1)(deep) + wide + nn.Linear(dense_n, 1)(dense)
    loss = paddle.mean(F.binary_cross_entropy_with_logits(logit, click))
    paddle.optimizer.Adam(1e-3, lazy_mode=True).minimize(loss)

    def feed(rng, b):
        return {"ids": rng.integers(0, vocab, (b, fields)).astype("int64"),
                "dense": rng.standard_normal((b, dense_n)).astype("float32"),
                "click": rng.integers(0, 2, (b, 1)).astype("float32")}
    return feed, [loss, logit]


def _gpt6():
    """A 6-layer GPT written out (width 128, 4 heads, causal mask added to
    the scores, dropout 0.1 on attention and residuals, pre-norm, GELU MLP,
    tied output embedding); AdamW with weight decay and
    ClipGradByGlobalNorm."""
    import numpy as np
    import paddle

    nn = paddle.nn
    F = nn.functional
    vocab, d, heads, seq = 1000, 128, 4, 64
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    nxt = paddle.static.data("next", [-1, seq], "int64")
    emb = nn.Embedding(vocab, d)
    h = emb(tokens) + paddle.create_parameter([1, seq, d], "float32")
    h = F.dropout(h, 0.1)
    causal = paddle.to_tensor(np.triu(np.full((seq, seq), -1e4, "float32"), 1))
    for _ in range(6):
        a = nn.LayerNorm(d)(h)
        qkv = paddle.reshape(nn.Linear(d, 3 * d)(a), [-1, seq, 3, heads, d // heads])
        q, k, v = [paddle.transpose(t, [0, 2, 1, 3]) for t in paddle.unbind(qkv, axis=2)]
        s = paddle.matmul(q, k, transpose_y=True) * (d // heads) ** -0.5 + causal
        p = F.dropout(F.softmax(s, axis=-1), 0.1)
        o = paddle.reshape(paddle.transpose(paddle.matmul(p, v), [0, 2, 1, 3]), [-1, seq, d])
        h = h + F.dropout(nn.Linear(d, d)(o), 0.1)
        m = nn.Linear(4 * d, d)(F.gelu(nn.Linear(d, 4 * d)(nn.LayerNorm(d)(h))))
        h = h + F.dropout(m, 0.1)
    logits = paddle.matmul(nn.LayerNorm(d)(h), emb.weight, transpose_y=True)
    loss = paddle.mean(F.cross_entropy(logits, paddle.unsqueeze(nxt, -1)))
    paddle.optimizer.AdamW(1e-3, weight_decay=0.01,
                           grad_clip=nn.ClipGradByGlobalNorm(1.0)).minimize(loss)

    def feed(rng, b):
        return {"tokens": rng.integers(0, vocab, (b, seq)).astype("int64"),
                "next": rng.integers(0, vocab, (b, seq)).astype("int64")}
    return feed, [loss, logits]


#: name -> (batch, builder() -> (feed(rng, batch), fetch list, the loss first))
MODELS = {
    "vit_tiny": (32, _vit_tiny),
    "mixer": (32, _mixer),
    "audio_conv1d": (4, _audio),
    "seq2seq_gru": (32, _seq2seq),
    "lstm_lm": (32, _lstm_lm),
    "efficientnet": (16, _efficientnet),
    "wide_deep": (512, _wide_deep),
    "gpt6": (8, _gpt6),
}


def worker(name: str, config: str, batch: int, budget: float, steps: int) -> dict:
    """One configuration in this process: ``default`` (also the predicted
    peak), ``level2`` or ``budget``; the step peaks, the digest of every
    fetch and of the parameters after the steps, the planning seconds."""
    import numpy as np
    import paddle

    paddle.enable_static()
    from paddle.base import core

    import memopt

    main, startup, feed, fetch = _bench.build_pir_model(MODELS, name)
    out: dict = {"model": name, "config": config, "batch": batch, "budget": budget}
    before = str(main)
    log = io.StringIO()
    clock = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            if config == "default":
                out["predicted"] = memopt.analyze(main, batch, fetch_list=fetch).total_peak()
                report = None
            elif config == "level2":
                report = memopt.memory_optimize(main, level=2, batch_size=batch,
                                                fetch_list=fetch, print_log=True)
            else:
                report = memopt.memory_optimize(main, budget=budget, batch_size=batch,
                                                fetch_list=fetch, print_log=True)
    except memopt.BudgetError as exc:
        out.update(error="BudgetError", smallest=exc.smallest_budget,
                   largest=exc.largest_batch, unchanged=str(main) == before,
                   seconds=time.perf_counter() - clock)
        return out
    except Exception as exc:
        out.update(error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                   unchanged=str(main) == before)
        return out
    out["seconds"] = time.perf_counter() - clock
    if report is not None:
        out.update(added=report.added_compute_percent, recomputed=len(report.recomputed),
                   predicted=report.peak_after, changed=str(main) != before,
                   log_says_recompute=("recompute" in log.getvalue().lower())
                   if report.recomputed else None)
    rng = np.random.default_rng(3)
    digest = hashlib.sha256()
    scope = paddle.static.Scope()
    peaks, times = [], []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(11)
        exe.run(startup)
        for _ in range(steps):
            data = feed(rng, batch)
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            start = time.perf_counter()
            values = exe.run(main, feed=data, fetch_list=fetch)
            times.append(time.perf_counter() - start)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0))
            for value in values:
                digest.update(np.asarray(value).tobytes())
        for pname in _bench.pir_parameter_names(main):
            digest.update(np.array(scope.find_var(pname).get_tensor()).tobytes())
    out.update(peaks=peaks, step_seconds=times, digest=digest.hexdigest())
    return out


def run(name, config, batch, budget, steps) -> dict:
    return _bench.run_worker(__file__, [name, config, batch, repr(float(budget)), steps])


def _steady(r):
    """The step peaks after the first (steps 2..n)."""
    return r["peaks"][1:] if len(r["peaks"]) > 1 else r["peaks"]


def sweep(name, steps, fractions, batch=None) -> dict:
    batch = batch or MODELS[name][0]
    base = run(name, "default", batch, 0, steps)
    row = {"model": name, "batch": batch, "base": base, "budgets": []}
    if "peaks" not in base:
        return row
    row["level2"] = run(name, "level2", batch, 0, steps)
    refs = {"pred": base["predicted"], "meas": min(_steady(base))}
    for ref, whole in refs.items():
        for f in fractions:
            r = run(name, "budget", batch, f * whole, steps)
            if r.get("error") == "BudgetError":
                r["at_smallest"] = run(name, "budget", batch, r["smallest"], steps)
                if r["largest"]:
                    r["at_largest"] = run(name, "budget", r["largest"], f * whole, steps)
            row["budgets"].append((ref, f, r))
    return row


def _mb(n) -> str:
    return f"{n / 2 ** 20:.2f}"


def _fit(r, base_digest=None) -> str:
    """``lowest-largest`` step peak over the budget (and NOT-IDENTICAL)."""
    if "peaks" not in r:
        return r.get("error", "?")[:60].replace("|", "/")
    s = _steady(r)
    same = "" if base_digest is None or r["digest"] == base_digest else " NOT-IDENTICAL"
    return f"{min(s) / r['budget']:.2f}-{max(s) / r['budget']:.2f}{same}"


def table(rows, out=print) -> None:
    t = _bench.Table(["model", "B", "step s", "default MiB pred / steps", "L2 steps / default",
                      "L2 s", "budget", "peak/budget low-high", "added %", "plan s",
                      "identical", "BudgetError follow-ups"], "llrlllllrrll", out=out)
    for row in rows:
        base = row["base"]
        if "peaks" not in base:
            t.row(row["model"], row["batch"], "-", base.get("error", "?")[:80].replace("|", "/"),
                  *["-"] * 8)
            continue
        s0 = _steady(base)
        head = [row["model"], row["batch"], f"{min(base['step_seconds'][1:] or [0]):.2f}",
                f"{_mb(base['predicted'])} / {_mb(min(s0))}-{_mb(max(s0))}"]
        l2 = row["level2"]
        if "peaks" in l2:
            s2 = _steady(l2)
            same = "" if l2["digest"] == base["digest"] else " NOT-IDENTICAL"
            head += [f"{min(s2) / min(s0):.3f}-{max(s2) / min(s0):.3f}"
                     f"{'' if l2['changed'] else ' (unchanged)'}{same}", f"{l2['seconds']:.1f}"]
        else:
            head += [l2.get("error", "?")[:60].replace("|", "/"), "-"]
        lows = {}
        for ref, f, r in row["budgets"]:
            cells = [f"{round(f * 100)}% {ref} ({_mb(r['budget'])})"]
            if "peaks" in r:
                lows.setdefault(ref, []).append(min(_steady(r)))
                cells += [_fit(r), f"{r.get('added') or 0:.1f}", f"{r['seconds']:.1f}",
                          "yes" if r["digest"] == base["digest"] else "NO", "-"]
            elif r.get("error") == "BudgetError":
                follow = (f"smallest {_mb(r['smallest'])} -> "
                          f"{_fit(r['at_smallest'], base['digest'])}; largest batch "
                          f"{r['largest']} -> "
                          + (_fit(r["at_largest"]) if "at_largest" in r else "-"))
                cells += ["BudgetError" + ("" if r["unchanged"] else " CHANGED-PROGRAM"),
                          "-", f"{r['seconds']:.1f}", "-", follow]
            else:
                cells += [r.get("error", "?")[:80].replace("|", "/")
                          + ("" if r.get("unchanged", True) else " CHANGED-PROGRAM"),
                          "-", "-", "-", "-"]
            t.row(*head, *cells)
            head = ["", "", "", "", "", ""]
        mono = {ref: all(b <= a for a, b in zip(v, v[1:])) for ref, v in lows.items()}
        t.row("", "", "", "", "", "", "monotone (lowest step)",
              ", ".join(f"{ref}: {'yes' if ok else 'NO'}" for ref, ok in mono.items())
              or "- (no plan)",
              "", "", "", "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="override every model's batch")
    parser.add_argument("--rows", nargs="+", metavar="FILE",
                        help="print the table of the JSON lines earlier runs wrote on stderr")
    parser.add_argument("--worker", nargs=5)
    args = parser.parse_args(argv)
    if args.rows:
        rows = [json.loads(line) for path in args.rows for line in open(path)
                if line.startswith('{"model"')]
        table([dict(r, budgets=[tuple(b) for b in r["budgets"]]) for r in rows])
        return 0
    if args.worker:
        name, config, batch, budget, steps = args.worker
        print(json.dumps(worker(name, config, int(batch), float(budget), int(steps))))
        return 0
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for name in args.models.split(","):
        rows.append(sweep(name, args.steps, fractions, args.batch))
        print(json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
    table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
