"""``level=2`` and ``budget=`` on PIR training programs no other sweep
builds, as a user would run them (CPU, Paddle's defaults: GC
on, the in-place pass, the multi-thread executor).

For each model, each configuration in a fresh process: the unchanged
program (its predicted peak ``memopt.analyze(main, B).total_peak()`` and its
measured step peaks), ``memory_optimize(main, level=2, batch_size=B)`` and
``memory_optimize(main, budget=X, batch_size=B)`` for ``X`` at 100/80/60/40%
of the predicted peak (``pred``) and of the measured one (``meas``: the
unchanged program's lowest step).  A step's peak is
``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)`` reset
before the step (parameters and optimizer state included, they are
allocated by then).  A worker records the step peaks, the added compute,
the planning seconds and a digest of the losses, fetches and parameters
over the steps; the test asserts the digest equals the unchanged run's (the
peaks are reported, not judged).  A BudgetError must leave the program as
it was (``str(program)``); planning again at ``err.smallest_budget`` (batch
B) and at ``err.largest_batch`` (the same budget) must succeed.

The cells are tests of ``test_sweep_budget_unknown.py`` (``--worker MODEL CONFIG BATCH BUDGET
STEPS`` prints one JSON object).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import time

import builds
import cells

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

    main, startup, feed, fetch = builds.build_pir_model(MODELS, name)
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
        for pname in builds.pir_parameter_names(main):
            digest.update(np.array(scope.find_var(pname).get_tensor()).tobytes())
    out.update(peaks=peaks, step_seconds=times, digest=digest.hexdigest())
    return out


def run(name, config, batch, budget, steps) -> dict:
    """The worker's result, in a fresh process."""
    return cells.fresh_process(__file__, [name, config, batch, repr(float(budget)), steps])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=5, required=True,
                        metavar=("MODEL", "CONFIG", "BATCH", "BUDGET", "STEPS"))
    args = parser.parse_args(argv)
    name, config, batch, budget, steps = args.worker
    print(json.dumps(worker(name, config, int(batch), float(budget), int(steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
