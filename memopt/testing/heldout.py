"""Held-out PIR training programs: written as a user would, kept out of the unit tests.

``budget=`` and the step-peak model are calibrated on :mod:`memopt.testing.models`;
these programs check the promise on code the model was not tuned on
(``scripts/bench_recompute.py --heldout``).  Each builds with ``paddle.nn``
layers and a stock optimizer the way its kind of model is usually written:

- ``"bert"``: token, position and segment embeddings, a padding mask built
  from the ids (``ids != 0``), ``paddle.nn.TransformerEncoder`` layers, a
  masked-LM head that gathers the masked positions out of the flattened
  hidden states and decodes them with the tied word embedding, and a
  next-sentence head on the pooled first token; AdamW with weight decay.
- ``"gpt"``: a pre-norm causal decoder (``TransformerEncoderLayer`` with
  ``normalize_before=True`` and a causal mask), tied input/output
  embeddings, next-token loss on the shifted sequence; AdamW.
- ``"unet"``: two down blocks (conv-BN-ReLU x2, max pool), a bottleneck, two
  up blocks (``Conv2DTranspose``, skip concat, conv-BN-ReLU x2) and a
  per-pixel softmax cross entropy over ``classes``; Adam.
- ``"vgg"``: VGG-style 3x3 conv stacks with max pooling, two dropout FC
  layers and a classifier; Momentum.
- ``"cnn"``: a small CNN of the first hour (two conv-BN-ReLU-pool blocks on
  1x28x28 images, a linear classifier); Adam.

:func:`build` returns a :class:`memopt.testing.models.BuiltModel` (seeded feed, loss
first in the fetch list); :data:`HELDOUT` lists the configurations the bench
runs (small and large batches).  Paddle is imported when a program is built.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

__all__ = ["HELDOUT", "build"]

#: Bench configuration -> (program kind, batch size, size options).
HELDOUT: Dict[str, Tuple[str, int, Dict[str, Any]]] = {
    "bert-b8": ("bert", 8, {}),
    "bert-b32": ("bert", 32, {}),
    "gpt-b8": ("gpt", 8, {}),
    "gpt-b32": ("gpt", 32, {}),
    "unet-b4": ("unet", 4, {}),
    "unet-b16": ("unet", 16, {}),
    "vgg-b8": ("vgg", 8, {}),
    "vgg-b64": ("vgg", 64, {}),
    "cnn-b64": ("cnn", 64, {}),
}


def _bert(batch: int, opts: dict):
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    vocab, seq, d, heads, layers, masked = (
        opts.setdefault("vocab", 512), opts.setdefault("seq_len", 48),
        opts.setdefault("d_model", 64), opts.setdefault("heads", 4),
        opts.setdefault("layers", 2), opts.setdefault("masked", 6))
    ids = paddle.static.data("input_ids", [-1, seq], "int64")
    segments = paddle.static.data("segment_ids", [-1, seq], "int64")
    positions = paddle.static.data("masked_positions", [-1], "int64")  # into [B*seq]
    mlm_labels = paddle.static.data("masked_labels", [-1, 1], "int64")
    nsp_labels = paddle.static.data("nsp_labels", [-1, 1], "int64")
    word = nn.Embedding(vocab, d, padding_idx=0)
    pos_emb = nn.Embedding(seq, d)
    seg_emb = nn.Embedding(2, d)
    pos_ids = paddle.arange(seq, dtype="int64").unsqueeze(0)
    h = nn.LayerNorm(d)(word(ids) + pos_emb(pos_ids) + seg_emb(segments))
    h = F.dropout(h, 0.1)
    keep = paddle.cast(ids != 0, "float32")  # [B, seq]
    mask = ((1.0 - keep) * -1e4).unsqueeze([1, 2])  # [B, 1, 1, seq]
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu")
    h = nn.TransformerEncoder(layer, layers)(h, mask)
    # masked LM: the masked positions of the flattened batch, tied decoder
    flat = paddle.reshape(h, [-1, d])
    picked = paddle.gather(flat, positions)
    t = nn.LayerNorm(d)(F.gelu(nn.Linear(d, d)(picked)))
    mlm_logits = paddle.matmul(t, word.weight, transpose_y=True)
    mlm_loss = paddle.mean(F.cross_entropy(mlm_logits, mlm_labels))
    pooled = paddle.tanh(nn.Linear(d, d)(h[:, 0]))
    nsp_loss = paddle.mean(F.cross_entropy(nn.Linear(d, 2)(pooled), nsp_labels))
    loss = mlm_loss + nsp_loss

    def feed(rng):
        lengths = rng.integers(seq // 2, seq + 1, size=batch)
        tok = rng.integers(1, vocab, size=(batch, seq)).astype("int64")
        for row, n in enumerate(lengths):
            tok[row, n:] = 0
        pos = np.concatenate([row * seq + rng.choice(int(n), masked, replace=False)
                              for row, n in enumerate(lengths)]).astype("int64")
        seg = (np.arange(seq)[None, :] >= (lengths[:, None] // 2)).astype("int64")
        return {"input_ids": tok, "segment_ids": seg, "masked_positions": pos,
                "masked_labels": rng.integers(1, vocab, size=(batch * masked, 1)).astype("int64"),
                "nsp_labels": rng.integers(0, 2, size=(batch, 1)).astype("int64")}

    opt = paddle.optimizer.AdamW(learning_rate=1e-4, weight_decay=0.01)
    return feed, [loss], opt


def _gpt(batch: int, opts: dict):
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    vocab, seq, d, heads, layers = (
        opts.setdefault("vocab", 512), opts.setdefault("seq_len", 64),
        opts.setdefault("d_model", 64), opts.setdefault("heads", 4),
        opts.setdefault("layers", 2))
    tokens = paddle.static.data("tokens", [-1, seq + 1], "int64")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    word = nn.Embedding(vocab, d)
    pos = paddle.create_parameter([seq, d], "float32")
    h = word(inputs) + pos
    causal = paddle.assign(np.triu(np.full((seq, seq), -1e4, dtype="float32"), k=1))
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                       normalize_before=True)
    h = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d))(h, causal)
    logits = paddle.matmul(h, word.weight, transpose_y=True)
    loss = paddle.mean(F.cross_entropy(logits, targets.unsqueeze(-1)))

    def feed(rng):
        return {"tokens": rng.integers(0, vocab, size=(batch, seq + 1)).astype("int64")}

    opt = paddle.optimizer.AdamW(learning_rate=3e-4, weight_decay=0.1)
    return feed, [loss], opt


def _conv_block(nn, cin: int, cout: int):
    return nn.Sequential(nn.Conv2D(cin, cout, 3, padding=1), nn.BatchNorm2D(cout), nn.ReLU(),
                         nn.Conv2D(cout, cout, 3, padding=1), nn.BatchNorm2D(cout), nn.ReLU())


def _unet(batch: int, opts: dict):
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    size, classes, c = (opts.setdefault("image_size", 64), opts.setdefault("classes", 4),
                        opts.setdefault("channels", 8))
    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    y = paddle.static.data("mask", [-1, size, size, 1], "int64")
    e1 = _conv_block(nn, 3, c)(x)
    e2 = _conv_block(nn, c, 2 * c)(F.max_pool2d(e1, 2))
    mid = _conv_block(nn, 2 * c, 4 * c)(F.max_pool2d(e2, 2))
    u2 = nn.Conv2DTranspose(4 * c, 2 * c, 2, stride=2)(mid)
    d2 = _conv_block(nn, 4 * c, 2 * c)(paddle.concat([u2, e2], axis=1))
    u1 = nn.Conv2DTranspose(2 * c, c, 2, stride=2)(d2)
    d1 = _conv_block(nn, 2 * c, c)(paddle.concat([u1, e1], axis=1))
    logits = paddle.transpose(nn.Conv2D(c, classes, 1)(d1), [0, 2, 3, 1])
    loss = paddle.mean(F.cross_entropy(logits, y))

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "mask": rng.integers(0, classes, size=(batch, size, size, 1)).astype("int64")}

    return feed, [loss], paddle.optimizer.Adam(learning_rate=1e-3)


def _vgg(batch: int, opts: dict):
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    size, classes = opts.setdefault("image_size", 32), opts.setdefault("classes", 10)
    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h, cin = x, 3
    for cout, convs in ((16, 2), (32, 2), (64, 3)):
        for _ in range(convs):
            h = F.relu(nn.Conv2D(cin, cout, 3, padding=1)(h))
            cin = cout
        h = F.max_pool2d(h, 2)
    h = paddle.flatten(h, 1)
    h = F.dropout(F.relu(nn.Linear(64 * (size // 8) ** 2, 256)(h)), 0.5)
    h = F.dropout(F.relu(nn.Linear(256, 256)(h)), 0.5)
    loss = paddle.mean(F.cross_entropy(nn.Linear(256, classes)(h), y))

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "label": rng.integers(0, classes, size=(batch, 1)).astype("int64")}

    return feed, [loss], paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9)


def _cnn(batch: int, opts: dict):
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    classes = opts.setdefault("classes", 10)
    x = paddle.static.data("image", [-1, 1, 28, 28], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = F.max_pool2d(F.relu(nn.BatchNorm2D(16)(nn.Conv2D(1, 16, 3, padding=1)(x))), 2)
    h = F.max_pool2d(F.relu(nn.BatchNorm2D(32)(nn.Conv2D(16, 32, 3, padding=1)(h))), 2)
    loss = paddle.mean(F.cross_entropy(nn.Linear(32 * 7 * 7, classes)(paddle.flatten(h, 1)), y))

    def feed(rng):
        return {"image": rng.standard_normal((batch, 1, 28, 28)).astype("float32"),
                "label": rng.integers(0, classes, size=(batch, 1)).astype("int64")}

    return feed, [loss], paddle.optimizer.Adam(learning_rate=1e-3)


_BUILDERS = {"bert": _bert, "gpt": _gpt, "unet": _unet, "vgg": _vgg, "cnn": _cnn}


def build(kind: str, batch_size: int, *, seed: int = 1, **options: Any):
    """A held-out PIR training program of ``kind`` (``"bert"``, ``"gpt"``,
    ``"unet"``, ``"vgg"``, ``"cnn"``) whose feed gives ``batch_size`` rows
    (the program keeps the batch dimension ``-1``); ``options`` override its
    sizes.  ValueError for an unknown kind."""
    if kind not in _BUILDERS:
        raise ValueError(f"unknown held-out program {kind!r}: expected one of "
                         f"{sorted(_BUILDERS)}")
    import paddle

    from .models import BuiltModel, ir_guard

    paddle.enable_static()
    opts = dict(options)
    with ir_guard("pir"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            feed, fetch_list, opt = _BUILDERS[kind](int(batch_size), opts)
            opt.minimize(fetch_list[0])
    return BuiltModel(name=kind, ir="pir", main=main, startup=startup, feed=feed,
                      fetch_list=list(fetch_list), batch_size=int(batch_size), options=opts,
                      seed=seed)
