"""Real Paddle static training programs, for tests, benchmarks and the demo.

:func:`build` returns a :class:`BuiltModel`: a main and a startup program
built in either of Paddle 3's IRs, a deterministic feed and a fetch list whose
first entry is the loss.

- ``ir="legacy"`` builds a ``paddle.base.framework.Program`` (inside
  ``paddle.pir_utils.OldIrGuard``); ``ir="pir"`` builds a ``paddle.pir.Program``
  (Paddle 3's default static IR).
- Building twice with the same arguments gives the same variable names
  (legacy; under ``paddle.utils.unique_name.guard``) and, through
  :meth:`BuiltModel.initialize`, the same initial parameter values, so two
  builds can be compared run for run.  PIR parameter names are not stable
  across builds: compare PIR parameters by position.
- Models: ``"mlp"``, ``"cnn"``, ``"resnet50"``, ``"mobilenet_v2"``
  (``paddle.vision.models``, no pretrained weights), ``"transformer"`` (an
  encoder built from ops the legacy IR still accepts: ``einsum`` attention,
  ``softmax``, ``layer_norm``, ``Linear``), ``"while_loop"``
  (``paddle.static.nn.while_loop``) and ``"nested_cond"`` (conditionals two
  deep); PIR only (``paddle.matmul``, ``gelu``, ``interpolate``): ``"unet"`` (a small
  U-Net: encoder, bottleneck, decoder with upsampling and skip concats, a
  per-pixel loss), ``"densenet"`` (dense blocks: every layer reads the concat
  of all earlier ones), ``"bert"`` (a BERT-like encoder: matmul attention,
  GELU feed-forward, dropout when ``dropout > 0``) and ``"gpt"`` (a GPT-like
  decoder: causal attention, next-token loss); in both IRs ``"lstm"``, ``"gru"``,
  ``"ctr"``, ``"vgg"``, ``"gpt_einsum"``, ``"ffn_dropout"``, ``"branches"`` and, legacy
  only, ``"amp_bf16"`` (see :data:`EXTRA_MODEL_NAMES`); PIR only, with a ``cond``
  or ``while_loop`` between plain layers: ``"cond_mlp"``, ``"while_mlp"``,
  ``"dense_cond"`` (:data:`REGION_MODEL_NAMES`).
  Every model has a backward pass and an optimizer when
  ``train=True``.

Legacy-IR caveats measured on Paddle 3.3.1: ``paddle.static.nn.cond`` fails
there (it calls ``paddle.logical_not``, which only accepts PIR values), as do
``paddle.matmul``, ``tanh``, ``exp``, ``sigmoid`` and ``gelu``; the legacy
conditional here is built from ``ConditionalBlock`` and ``select_input``
directly, with the negated predicate computed by a comparison.

Paddle is imported when a model is built, never at import time.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

#: Model name -> default batch size (small: the test suite runs them on CPU).
DEFAULT_BATCH = {
    "mlp": 16,
    "cnn": 8,
    "resnet50": 4,
    "mobilenet_v2": 4,
    "transformer": 4,
    "while_loop": 8,
    "nested_cond": 8,
    "unet": 4,
    "densenet": 4,
    "bert": 4,
    "gpt": 4,
    "lstm": 8,
    "gru": 8,
    "ctr": 16,
    "vgg": 8,
    "gpt_einsum": 4,
    "amp_bf16": 4,
    "cond_mlp": 512,
    "while_mlp": 512,
    "dense_cond": 512,
    "ffn_dropout": 256,
    "branches": 64,
}

#: Models built in both IRs.
MODEL_NAMES = ("mlp", "cnn", "resnet50", "mobilenet_v2", "transformer", "while_loop",
               "nested_cond")
#: Models built only in PIR (they use ops Paddle 3.3.1's legacy IR refuses).
PIR_ONLY = ("unet", "densenet", "bert", "gpt")
#: Further real-world shapes, for the tests and benchmarks that name them:
#: recurrent (``"lstm"``, ``"gru"`` with per-row ``sequence_length``), a
#: sparse-embedding CTR model with ``paddle.static.auc``, a VGG-style CNN, a
#: GPT-style decoder built from ops the legacy IR accepts (``"gpt_einsum"``),
#: the Transformer under bf16 AMP (``"amp_bf16"``, legacy only), a
#: Transformer-style feed-forward stack with dropout (``"ffn_dropout"``) and
#: parallel linear branches written layer by layer (``"branches"``).
EXTRA_MODEL_NAMES = ("lstm", "gru", "ctr", "vgg", "gpt_einsum", "amp_bf16", "ffn_dropout",
                     "branches")
#: PIR training programs whose top-level block runs a region op between
#: plain layers, sized so that the saved activations matter next to the
#: parameters (``budget=``, ``level=2`` on regions): ``"cond_mlp"`` (a
#: ``static.nn.cond`` on a fed flag between ReLU layers) and ``"while_mlp"``
#: (a ``static.nn.while_loop`` of a shared tanh layer between them);
#: ``"dense_cond"``: dense-block features (each ReLU layer reads the concat
#: of all earlier ones, as in DenseNet) then a cond head on a fed flag.
REGION_MODEL_NAMES = ("cond_mlp", "while_mlp", "dense_cond")
IRS = ("legacy", "pir")


@dataclass
class BuiltModel:
    """A built program pair with what it takes to run it.

    Attributes
    ----------
    name, ir : the model name and ``"legacy"`` or ``"pir"``.
    main, startup : the training (or inference) program and its startup
        program (parameter initialisation).
    feed : ``feed(rng) -> dict`` of numpy arrays of ``batch_size`` rows, drawn
        from ``rng`` (a ``numpy.random.Generator``): same rng state, same feed.
    fetch_list : what a step fetches, the loss first (Variables for legacy,
        Values for PIR).
    batch_size : rows per step.
    options : the model's size options (hidden width, image size, ...).
    """

    name: str
    ir: str
    main: Any
    startup: Any
    feed: Callable[[np.random.Generator], Dict[str, np.ndarray]]
    fetch_list: List[Any]
    batch_size: int
    options: Dict[str, Any] = field(default_factory=dict)
    seed: int = 1

    def initialize(self, executor) -> None:
        """Run the startup program with Paddle's generator seeded by
        ``seed``, in the executor's current scope: deterministic parameters."""
        import paddle

        paddle.seed(self.seed)
        with self.guard():
            executor.run(self.startup)

    def guard(self):
        """The IR guard to build *and run* this model's programs under: an
        Executor outside ``OldIrGuard`` takes a legacy program for PIR."""
        return ir_guard(self.ir)

    @property
    def loss(self):
        return self.fetch_list[0]

    def fetch_names(self) -> List[str]:
        """Names of the fetched variables (legacy) or values (PIR, where set)."""
        out = []
        for item in self.fetch_list:
            try:
                name = item.name
            except Exception:  # a PIR Value without a name
                name = None
            out.append(name if isinstance(name, str) else str(item))
        return out


def ir_guard(ir: str):
    """Context manager under which Paddle builds (and runs) programs of ``ir``."""
    if ir == "legacy":
        from paddle.pir_utils import OldIrGuard

        return OldIrGuard()
    if ir == "pir":
        from paddle.pir_utils import IrGuard

        return IrGuard()
    raise ValueError(f"ir must be one of {IRS}, got {ir!r}")


# -- building blocks ----------------------------------------------------------

def _cross_entropy(logits, label):
    import paddle

    return paddle.mean(paddle.nn.functional.cross_entropy(logits, label))


def _labels(rng: np.random.Generator, batch: int, classes: int) -> np.ndarray:
    return rng.integers(0, classes, size=(batch, 1)).astype("int64")


def _vector_feed(batch: int, width: int, classes: int):
    """``feed(rng)`` of standard-normal ``x`` rows and class labels."""
    def feed(rng):
        return {"x": rng.standard_normal((batch, width)).astype("float32"),
                "label": _labels(rng, batch, classes)}

    return feed


def _legacy_cond(pred, not_pred, true_fn, false_fn):
    """``cond`` for the legacy IR: two ``conditional_block`` ops and a
    ``select_input``; ``not_pred`` must be the negation of ``pred``."""
    import paddle
    from paddle.base.layer_helper import LayerHelper
    from paddle.static.nn.control_flow import (
        ConditionalBlock,
        copy_var_to_parent_block,
        select_input,
    )

    helper = LayerHelper("cond")
    outs = []
    for branch_pred, fn in ((pred, true_fn), (not_pred, false_fn)):
        block = ConditionalBlock([branch_pred], is_scalar_condition=True)
        with block.block():
            outs.append(copy_var_to_parent_block(fn(), helper))
    mask = paddle.cast(pred, "int32")
    return select_input([outs[1], outs[0]], mask)


def _cond(ir: str, scalar, threshold: float, true_fn, false_fn):
    """``true_fn()`` if ``scalar > threshold`` else ``false_fn()``, in ``ir``."""
    import paddle

    pred = scalar > threshold
    if ir == "pir":
        return paddle.static.nn.cond(pred, true_fn, false_fn)
    return _legacy_cond(pred, scalar <= threshold, true_fn, false_fn)


# -- the models ---------------------------------------------------------------

def _mlp(ir, batch, opts):
    import paddle

    d_in, hidden, layers, classes = (opts.setdefault("in_features", 64),
                                     opts.setdefault("hidden", 128),
                                     opts.setdefault("layers", 3),
                                     opts.setdefault("classes", 10))
    x = paddle.static.data("x", [-1, d_in], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = x
    width = d_in
    for _ in range(layers):
        h = paddle.nn.functional.relu(paddle.nn.Linear(width, hidden)(h))
        width = hidden
    logits = paddle.nn.Linear(width, classes)(h)
    return _vector_feed(batch, d_in, classes), [_cross_entropy(logits, y), logits]


def _image_model(net_fn, default_size):
    def make(ir, batch, opts):
        import paddle

        size, classes = opts.setdefault("image_size", default_size), opts.setdefault("classes", 10)
        x = paddle.static.data("image", [-1, 3, size, size], "float32")
        y = paddle.static.data("label", [-1, 1], "int64")
        logits = net_fn(classes)(x)
        loss = _cross_entropy(logits, y)

        def feed(rng):
            return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                    "label": _labels(rng, batch, classes)}

        return feed, [loss, logits]

    return make


def _cnn(ir, batch, opts):
    import paddle

    nn = paddle.nn
    size, classes = opts.setdefault("image_size", 16), opts.setdefault("classes", 10)
    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    body = nn.Sequential(
        nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(), nn.MaxPool2D(2),
        nn.Conv2D(8, 16, 3, padding=1), nn.BatchNorm2D(16), nn.ReLU(), nn.MaxPool2D(2),
        nn.Flatten(),
    )
    feat = body(x)
    logits = nn.Linear(16 * (size // 4) ** 2, classes)(feat)
    loss = _cross_entropy(logits, y)

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "label": _labels(rng, batch, classes)}

    return feed, [loss, logits]


def _resnet50(classes):
    import paddle

    return paddle.vision.models.resnet50(num_classes=classes)


def _mobilenet_v2(classes):
    import paddle

    return paddle.vision.models.mobilenet_v2(num_classes=classes)


def _transformer(ir, batch, opts):
    """A Transformer encoder classifier: token + position embeddings, encoder
    layers (multi-head self-attention by ``einsum``, softmax, residual,
    layer norm, a ReLU feed-forward), mean pooling, a linear head."""
    import paddle

    nn = paddle.nn
    vocab, seq, d, heads, ff, layers, classes = (
        opts.setdefault("vocab", 100), opts.setdefault("seq_len", 16),
        opts.setdefault("d_model", 32), opts.setdefault("heads", 4),
        opts.setdefault("d_ff", 64), opts.setdefault("layers", 2),
        opts.setdefault("classes", 10))
    dh = d // heads
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    y = paddle.static.data("label", [-1, 1], "int64")
    pos = paddle.create_parameter([seq, d], "float32")
    h = nn.Embedding(vocab, d)(tokens) + pos
    for _ in range(layers):
        q, k, v = (nn.Linear(d, d)(h).reshape([-1, seq, heads, dh]) for _ in range(3))
        scores = paddle.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / dh ** 0.5)
        attn = paddle.nn.functional.softmax(scores, axis=-1)
        ctx = paddle.einsum("bhqk,bkhd->bqhd", attn, v).reshape([-1, seq, d])
        h = nn.LayerNorm(d)(h + nn.Linear(d, d)(ctx))
        inner = paddle.nn.functional.relu(nn.Linear(d, ff)(h))
        h = nn.LayerNorm(d)(h + nn.Linear(ff, d)(inner))
    logits = nn.Linear(d, classes)(paddle.mean(h, axis=1))
    loss = _cross_entropy(logits, y)

    def feed(rng):
        return {"tokens": rng.integers(0, vocab, size=(batch, seq)).astype("int64"),
                "label": _labels(rng, batch, classes)}

    return feed, [loss, logits]


def _while_loop(ir, batch, opts):
    """A shared-weight ReLU layer applied ``steps`` times in a ``while`` loop,
    with a residual connection each step."""
    import paddle

    d, steps, classes = (opts.setdefault("hidden", 32), opts.setdefault("steps", 3),
                         opts.setdefault("classes", 10))
    x = paddle.static.data("x", [-1, d], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    cell = paddle.nn.Linear(d, d)
    # (a relu right before the loop breaks PIR's executor in Paddle 3.3.1:
    # relu_grad_ reads a tensor that holds no memory)
    h0 = paddle.nn.Linear(d, d)(x)
    i0 = paddle.full([1], 0, "int64")
    n = paddle.full([1], steps, "int64")

    def body(i, h):
        return [i + 1, paddle.nn.functional.relu(cell(h)) + h * 0.5]

    _, h = paddle.static.nn.while_loop(lambda i, h: i < n, body, [i0, h0])
    logits = paddle.nn.Linear(d, classes)(h)
    return _vector_feed(batch, d, classes), [_cross_entropy(logits, y), logits]


def _nested_cond(ir, batch, opts):
    """Conditionals two deep: the outer branch on the sign of the batch's mean
    input (the feed alternates it, so both branches run over a few steps),
    the true branch holding another conditional on its own activation."""
    import paddle

    d, classes = opts.setdefault("hidden", 32), opts.setdefault("classes", 10)
    x = paddle.static.data("x", [-1, d], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = paddle.nn.Linear(d, d)(x)
    inner_fc = paddle.nn.Linear(d, d)
    false_fc = paddle.nn.Linear(d, d)

    def outer_true():
        q = paddle.nn.functional.relu(inner_fc(h))
        return _cond(ir, paddle.mean(q), 0.05,
                     lambda: paddle.nn.functional.relu(q * 2.0) * 0.5 + 1.0,
                     lambda: q + h)

    def outer_false():
        return paddle.nn.functional.relu(false_fc(h)) + 1.0

    out = _cond(ir, paddle.mean(x), 0.0, outer_true, outer_false)
    logits = paddle.nn.Linear(d, classes)(out)
    loss = _cross_entropy(logits, y)

    def feed(rng):
        offset = rng.choice([-1.0, 1.0])
        return {"x": (rng.standard_normal((batch, d)) + offset).astype("float32"),
                "label": _labels(rng, batch, classes)}

    return feed, [loss, logits]


def _region_mlp(kind):
    """``"cond_mlp"`` / ``"while_mlp"`` (see :data:`REGION_MODEL_NAMES`):
    ``layers // 2`` ReLU layers, the region, ``layers // 2`` ReLU layers,
    a classifier; ``"dense_cond"``: ``layers`` dense-block layers of
    ``hidden // 4`` features each, a cond head; PIR only."""
    def build(ir, batch, opts):
        import paddle

        if ir != "pir":
            raise ValueError(f"model {kind!r} is built in PIR only (ir='pir')")
        width, layers, classes = (opts.setdefault("hidden", 256), opts.setdefault("layers", 4),
                                  opts.setdefault("classes", 10))
        relu, linear = paddle.nn.functional.relu, paddle.nn.Linear
        x = paddle.static.data("x", [-1, width], "float32")
        y = paddle.static.data("label", [-1, 1], "int64")
        h = x
        if kind == "dense_cond":
            grow = width // 4
            for _ in range(layers):
                h = paddle.concat([h, relu(linear(h.shape[1], grow)(h))], axis=1)
            h = relu(linear(h.shape[1], width)(h))
        for _ in range(layers // 2 if kind != "dense_cond" else 0):
            h = relu(linear(width, width)(h))
        if kind in ("cond_mlp", "dense_cond"):
            flag = paddle.static.data("flag", [1], "float32")
            fa, fb = linear(width, width), linear(width, width)
            h = paddle.static.nn.cond(paddle.mean(flag) > 0, lambda: relu(fa(h)) * 2.0,
                                      lambda: paddle.tanh(fb(h)) + h)
        else:
            # (a relu right before the loop breaks PIR's executor in Paddle 3.3.1)
            h = linear(width, width)(h)
            cell = linear(width, width)
            n = paddle.full([1], opts.setdefault("steps", 3), "int64")
            _, h = paddle.static.nn.while_loop(
                lambda i, v: i < n, lambda i, v: [i + 1, paddle.tanh(cell(v)) + v * 0.5],
                [paddle.full([1], 0, "int64"), h])
        for _ in range(layers // 2 if kind != "dense_cond" else 0):
            h = relu(linear(width, width)(h))
        logits = linear(width, classes)(h)
        vector = _vector_feed(batch, width, classes)

        def feed(rng):
            out = vector(rng)
            if kind != "while_mlp":
                out["flag"] = np.array([rng.choice([-1.0, 1.0])], "float32")
            return out

        return feed, [_cross_entropy(logits, y), logits]
    return build


def _unet(ir, batch, opts):
    """A small U-Net: two conv-BN-ReLU per level, max-pool down, nearest
    upsampling up, the encoder's feature map concatenated at each level of
    the decoder, a 1x1 head and a mean squared error per pixel."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    size, base, depth = (opts.setdefault("image_size", 32), opts.setdefault("width", 8),
                         opts.setdefault("depth", 3))

    def double(c_in, c_out):
        return nn.Sequential(nn.Conv2D(c_in, c_out, 3, padding=1), nn.BatchNorm2D(c_out),
                             nn.ReLU(), nn.Conv2D(c_out, c_out, 3, padding=1),
                             nn.BatchNorm2D(c_out), nn.ReLU())

    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    target = paddle.static.data("target", [-1, 1, size, size], "float32")
    skips, h, c = [], x, 3
    for level in range(depth):
        h = double(c, base * 2 ** level)(h)
        c = base * 2 ** level
        skips.append((h, c))
        h = F.max_pool2d(h, 2)
    h = double(c, c * 2)(h)
    c *= 2
    for skip, c_skip in reversed(skips):
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = double(c + c_skip, c_skip)(paddle.concat([h, skip], axis=1))
        c = c_skip
    out = nn.Conv2D(c, 1, 1)(h)
    loss = paddle.mean((out - target) ** 2)

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "target": rng.standard_normal((batch, 1, size, size)).astype("float32")}

    return feed, [loss, out]


def _densenet(ir, batch, opts):
    """A DenseNet-like classifier: dense blocks of BN-ReLU-conv layers, each
    reading the concat of the block's input and every earlier layer's
    output (growth ``growth`` channels), 1x1-conv + pooling transitions."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    size, growth, blocks, layers, classes = (
        opts.setdefault("image_size", 32), opts.setdefault("growth", 8),
        opts.setdefault("blocks", 3), opts.setdefault("layers", 4),
        opts.setdefault("classes", 10))
    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    c = 2 * growth
    h = nn.Conv2D(3, c, 3, padding=1)(x)
    for b in range(blocks):
        feats = [h]
        for _ in range(layers):
            inp = paddle.concat(feats, axis=1) if len(feats) > 1 else feats[0]
            new = nn.Conv2D(c, growth, 3, padding=1)(F.relu(nn.BatchNorm2D(c)(inp)))
            feats.append(new)
            c += growth
        h = paddle.concat(feats, axis=1)
        if b < blocks - 1:
            h = F.avg_pool2d(nn.Conv2D(c, c // 2, 1)(F.relu(nn.BatchNorm2D(c)(h))), 2)
            c //= 2
    h = paddle.mean(F.relu(nn.BatchNorm2D(c)(h)), axis=[2, 3])
    logits = nn.Linear(c, classes)(h)
    loss = _cross_entropy(logits, y)

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "label": _labels(rng, batch, classes)}

    return feed, [loss, logits]


def _attention_stack(opts, causal: bool):
    """Token ids -> hidden states through pre-norm Transformer layers with
    ``paddle.matmul`` attention (a causal mask when ``causal``), a GELU
    feed-forward and dropout ``opts["dropout"]`` (0: none)."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    vocab, seq, d, heads, ff, layers, p = (
        opts.setdefault("vocab", 128), opts.setdefault("seq_len", 32),
        opts.setdefault("d_model", 64), opts.setdefault("heads", 4),
        opts.setdefault("d_ff", 256), opts.setdefault("layers", 2),
        opts.setdefault("dropout", 0.0))
    dh = d // heads
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    pos = paddle.create_parameter([seq, d], "float32")
    h = nn.Embedding(vocab, d)(tokens) + pos
    mask = None
    if causal:
        upper = np.triu(np.full((seq, seq), -1e4, dtype="float32"), k=1)
        mask = paddle.assign(upper)

    def drop(t):
        return F.dropout(t, p) if p > 0 else t

    for _ in range(layers):
        a = nn.LayerNorm(d)(h)
        q, k, v = (nn.Linear(d, d)(a).reshape([-1, seq, heads, dh]).transpose([0, 2, 1, 3])
                   for _ in range(3))
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / dh ** 0.5)
        if mask is not None:
            scores = scores + mask
        attn = drop(F.softmax(scores, axis=-1))
        ctx = paddle.matmul(attn, v).transpose([0, 2, 1, 3]).reshape([-1, seq, d])
        h = h + drop(nn.Linear(d, d)(ctx))
        inner = F.gelu(nn.Linear(d, ff)(nn.LayerNorm(d)(h)))
        h = h + drop(nn.Linear(ff, d)(inner))
    return tokens, nn.LayerNorm(d)(h), vocab, seq


def _bert(ir, batch, opts):
    """A BERT-like encoder classifier (see :func:`_attention_stack`): the
    first token's hidden state through a linear head."""
    import paddle

    classes = opts.setdefault("classes", 10)
    tokens, h, vocab, seq = _attention_stack(opts, causal=False)
    y = paddle.static.data("label", [-1, 1], "int64")
    logits = paddle.nn.Linear(h.shape[-1], classes)(h[:, 0])
    loss = _cross_entropy(logits, y)

    def feed(rng):
        return {"tokens": rng.integers(0, vocab, size=(batch, seq)).astype("int64"),
                "label": _labels(rng, batch, classes)}

    return feed, [loss, logits]


def _gpt(ir, batch, opts):
    """A GPT-like decoder (see :func:`_attention_stack`, causal): next-token
    cross entropy over the vocabulary at every position."""
    import paddle

    tokens, h, vocab, seq = _attention_stack(opts, causal=True)
    targets = paddle.static.data("targets", [-1, seq, 1], "int64")
    logits = paddle.nn.Linear(h.shape[-1], vocab)(h)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, targets))

    def feed(rng):
        return {"tokens": rng.integers(0, vocab, size=(batch, seq)).astype("int64"),
                "targets": rng.integers(0, vocab, size=(batch, seq, 1)).astype("int64")}

    return feed, [loss, logits]


def _recurrent(cell_name):
    """A one-layer ``paddle.nn.LSTM`` / ``GRU`` over ``[B, seq_len, features]``,
    its last step through a linear head.  The GRU also reads each row's
    ``sequence_length`` (fed, 1..seq_len), so its padded steps are masked."""
    def make(ir, batch, opts):
        import paddle

        seq, feat, hidden, classes = (opts.setdefault("seq_len", 12),
                                      opts.setdefault("features", 16),
                                      opts.setdefault("hidden", 32),
                                      opts.setdefault("classes", 4))
        x = paddle.static.data("x", [-1, seq, feat], "float32")
        y = paddle.static.data("label", [-1, 1], "int64")
        if cell_name == "gru":
            lens = paddle.static.data("lens", [-1], "int64")
            out, _ = paddle.nn.GRU(feat, hidden)(x, sequence_length=lens)
        else:
            out, _ = paddle.nn.LSTM(feat, hidden)(x)
        logits = paddle.nn.Linear(hidden, classes)(out[:, -1, :])

        def feed(rng):
            data = {"x": rng.standard_normal((batch, seq, feat)).astype("float32"),
                    "label": _labels(rng, batch, classes)}
            if cell_name == "gru":
                data["lens"] = rng.integers(1, seq + 1, size=(batch,)).astype("int64")
            return data

        return feed, [_cross_entropy(logits, y), logits]

    return make


def _ctr(ir, batch, opts):
    """A click-through-rate model: sparse embeddings of ``fields`` ids per row
    (``Embedding(sparse=True)``), a ReLU MLP, two classes, and the running
    AUC (``paddle.static.auc``, fetched third)."""
    import paddle

    vocab, fields, d, hidden = (opts.setdefault("vocab", 1000), opts.setdefault("fields", 8),
                                opts.setdefault("embed", 16), opts.setdefault("hidden", 64))
    ids = paddle.static.data("ids", [-1, fields], "int64")
    y = paddle.static.data("label", [-1, 1], "int64")
    emb = paddle.nn.Embedding(vocab, d, sparse=True)(ids)
    h = paddle.reshape(emb, [-1, fields * d])
    for width in (fields * d, hidden):
        h = paddle.nn.functional.relu(paddle.nn.Linear(width, hidden)(h))
    logits = paddle.nn.Linear(hidden, 2)(h)
    auc = paddle.static.auc(paddle.nn.functional.softmax(logits), y)[0]

    def feed(rng):
        return {"ids": rng.integers(0, vocab, size=(batch, fields)).astype("int64"),
                "label": _labels(rng, batch, 2)}

    return feed, [_cross_entropy(logits, y), logits, auc]


def _vgg(ir, batch, opts):
    """A VGG-style CNN: blocks of two 3x3 convolutions with ReLU and a 2x2
    max-pool (channels doubling), no batch norm, a two-layer ReLU head."""
    import paddle

    nn = paddle.nn
    size, classes, width = (opts.setdefault("image_size", 32), opts.setdefault("classes", 10),
                            opts.setdefault("width", 16))
    x = paddle.static.data("image", [-1, 3, size, size], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    layers, c_in = [], 3
    for c in (width, 2 * width, 4 * width):
        layers += [nn.Conv2D(c_in, c, 3, padding=1), nn.ReLU(),
                   nn.Conv2D(c, c, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2)]
        c_in = c
    feat = nn.Sequential(*layers, nn.Flatten())(x)
    h = paddle.nn.functional.relu(nn.Linear(c_in * (size // 8) ** 2, 128)(feat))
    logits = nn.Linear(128, classes)(h)

    def feed(rng):
        return {"image": rng.standard_normal((batch, 3, size, size)).astype("float32"),
                "label": _labels(rng, batch, classes)}

    return feed, [_cross_entropy(logits, y), logits]


def _gpt_einsum(ir, batch, opts):
    """A GPT-style decoder the legacy IR can build too: token + position
    embeddings, pre-norm blocks of causal multi-head attention (``einsum``, a constant upper-triangular
    -1e4 mask, softmax) and a ReLU feed-forward, a final layer norm and a
    language-model head; the loss is next-token cross entropy at every
    position."""
    import paddle

    nn = paddle.nn
    vocab, seq, d, heads, ff, layers = (
        opts.setdefault("vocab", 200), opts.setdefault("seq_len", 16),
        opts.setdefault("d_model", 32), opts.setdefault("heads", 4),
        opts.setdefault("d_ff", 128), opts.setdefault("layers", 2))
    dh = d // heads
    tokens = paddle.static.data("tokens", [-1, seq], "int64")
    target = paddle.static.data("target", [-1, seq, 1], "int64")
    mask = paddle.assign(np.triu(np.full((seq, seq), -1e4, "float32"), 1))
    pos = paddle.create_parameter([seq, d], "float32")
    h = nn.Embedding(vocab, d)(tokens) + pos
    for _ in range(layers):
        a = nn.LayerNorm(d)(h)
        q, k, v = (nn.Linear(d, d)(a).reshape([-1, seq, heads, dh]) for _ in range(3))
        scores = paddle.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / dh ** 0.5) + mask
        attn = paddle.nn.functional.softmax(scores, axis=-1)
        ctx = paddle.einsum("bhqk,bkhd->bqhd", attn, v).reshape([-1, seq, d])
        h = h + nn.Linear(d, d)(ctx)
        inner = paddle.nn.functional.relu(nn.Linear(d, ff)(nn.LayerNorm(d)(h)))
        h = h + nn.Linear(ff, d)(inner)
    logits = nn.Linear(d, vocab)(nn.LayerNorm(d)(h))
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, target))

    def feed(rng):
        toks = rng.integers(0, vocab, size=(batch, seq + 1)).astype("int64")
        return {"tokens": toks[:, :-1], "target": toks[:, 1:, None]}

    return feed, [loss, logits]


def _ffn_dropout(ir, batch, opts):
    """A Transformer-style feed-forward stack with dropout, per layer
    ``layer_norm(h + dropout(fc2(relu(fc1(h)))))``, then a classifier: a
    model whose activations outweigh its parameters at its default batch."""
    import paddle

    nn = paddle.nn
    width, layers, p, classes = (opts.setdefault("width", 64), opts.setdefault("layers", 3),
                                 opts.setdefault("dropout", 0.1), opts.setdefault("classes", 10))
    x = paddle.static.data("x", [-1, width], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = x
    for _ in range(layers):
        inner = nn.functional.relu(nn.Linear(width, 4 * width)(h))
        h = nn.LayerNorm(width)(h + nn.functional.dropout(nn.Linear(4 * width, width)(inner), p))
    logits = nn.Linear(width, classes)(h)
    return _vector_feed(batch, width, classes), [_cross_entropy(logits, y), logits]


def _branches(ir, batch, opts):
    """Parallel linear branches written layer by layer, as a model built one
    stage at a time for all its heads is: every branch's wide ``Linear``
    output is made before any is reduced (``mean`` over its features), then
    the reductions are summed into a regression loss.  The program's order
    holds every wide output at once (and, in the backward part, every wide
    gradient); one branch at a time holds one.  ``dropout > 0`` drops out
    each wide output."""
    import paddle

    F = paddle.nn.functional
    width, wide, branches, dropout = (
        opts.setdefault("width", 32), opts.setdefault("wide", 2048),
        opts.setdefault("branches", 4), opts.setdefault("dropout", 0.0))
    x = paddle.static.data("x", [-1, width], "float32")
    y = paddle.static.data("y", [-1, 1], "float32")
    outs = [paddle.nn.Linear(width, wide)(x) for _ in range(branches)]
    if dropout:
        outs = [F.dropout(h, dropout) for h in outs]
    means = [paddle.mean(h, axis=1, keepdim=True) for h in outs]
    pred = means[0]
    for m in means[1:]:
        pred = pred + m
    loss = paddle.mean((pred - y) * (pred - y))

    def feed(rng):
        return {"x": rng.standard_normal((batch, width)).astype("float32"),
                "y": rng.standard_normal((batch, 1)).astype("float32")}

    return feed, [loss, pred]


_BUILDERS = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet50": _image_model(_resnet50, 32),
    "mobilenet_v2": _image_model(_mobilenet_v2, 32),
    "transformer": _transformer,
    "while_loop": _while_loop,
    "nested_cond": _nested_cond,
    "unet": _unet,
    "densenet": _densenet,
    "bert": _bert,
    "gpt": _gpt,
    "lstm": _recurrent("lstm"),
    "gru": _recurrent("gru"),
    "ctr": _ctr,
    "vgg": _vgg,
    "gpt_einsum": _gpt_einsum,
    "amp_bf16": _transformer,
    "cond_mlp": _region_mlp("cond_mlp"),
    "while_mlp": _region_mlp("while_mlp"),
    "dense_cond": _region_mlp("dense_cond"),
    "ffn_dropout": _ffn_dropout,
    "branches": _branches,
}
#: Models trained under AMP: name -> the dtype of ``paddle.static.amp.decorate``
#: (level O1, no loss scaling); legacy IR only (see :func:`build`).
_AMP = {"amp_bf16": "bfloat16"}


def build(name: str, ir: str = "legacy", batch_size: Optional[int] = None,
          train: bool = True, *, seed: int = 1, optimizer: str = "momentum",
          **options: Any) -> BuiltModel:
    """Build model ``name`` as a static program of ``ir``.

    Parameters
    ----------
    name : one of :data:`MODEL_NAMES`, :data:`PIR_ONLY` or :data:`EXTRA_MODEL_NAMES`.
    ir : ``"legacy"`` or ``"pir"``.
    batch_size : rows the feed gives per step (the program itself keeps the
        batch dimension symbolic, ``-1``); default :data:`DEFAULT_BATCH`.
    train : append the backward pass and an optimizer step.
    seed : seeds Paddle's global generator right before the startup program
        runs (:meth:`BuiltModel.initialize`): same seed, same initial
        parameters.  (Setting ``Program.random_seed`` instead would give every
        initializer op the same seed and so correlated parameters.)
    optimizer : ``"sgd"``, ``"momentum"`` or ``"adam"``.
    options : model sizes, e.g. ``hidden=1024`` (MLP), ``image_size=64``.

    Raises
    ------
    ValueError : an unknown name, IR or optimizer.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}: expected one of "
                         f"{MODEL_NAMES + PIR_ONLY + EXTRA_MODEL_NAMES + REGION_MODEL_NAMES}")
    if ir not in IRS:
        raise ValueError(f"ir must be one of {IRS}, got {ir!r}")
    if ir == "legacy" and name in PIR_ONLY:
        raise ValueError(f"model {name!r} is built in PIR only (ir='pir')")
    if name in _AMP and ir != "legacy" and train:
        raise ValueError(f"model {name!r} trains in the legacy IR only: Paddle 3.3.1's AMP "
                         "decorator fails in PIR (check_finite_and_unscale_ gets no scale)")
    import paddle

    paddle.enable_static()
    batch = DEFAULT_BATCH[name] if batch_size is None else int(batch_size)
    opts = dict(options)
    with ir_guard(ir):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            feed, fetch_list = _BUILDERS[name](ir, batch, opts)
            if train:
                opt = _optimizer(optimizer)
                if name in _AMP:
                    opt = paddle.static.amp.decorate(opt, level="O1", dtype=_AMP[name],
                                                     use_dynamic_loss_scaling=False)
                opt.minimize(fetch_list[0])
    return BuiltModel(name=name, ir=ir, main=main, startup=startup, feed=feed,
                      fetch_list=list(fetch_list), batch_size=batch, options=opts,
                      seed=seed)


def _optimizer(kind: str):
    import paddle

    if kind == "sgd":
        return paddle.optimizer.SGD(learning_rate=0.01)
    if kind == "momentum":
        return paddle.optimizer.Momentum(learning_rate=0.001, momentum=0.9)
    if kind == "adam":
        return paddle.optimizer.Adam(learning_rate=0.001)
    raise ValueError(f"optimizer must be 'sgd', 'momentum' or 'adam', got {kind!r}")


def parameter_names(program) -> List[str]:
    """Names of the parameters of ``program`` in a stable order: legacy by
    name; PIR in program order (PIR names are not stable across builds)."""
    if hasattr(program, "all_parameters"):
        return sorted(p.name for p in program.all_parameters())
    return [op.attrs()["parameter_name"] for op in program.global_block().ops
            if op.name() == "builtin.parameter"]


@dataclass
class RunResult:
    """What :func:`run_steps` observed: per-step fetched arrays and the final
    parameter values (in :func:`parameter_names` order)."""

    fetches: List[List[np.ndarray]]
    params: List[np.ndarray]


def run_steps(model: BuiltModel, steps: int = 3, *, data_seed: int = 1,
              fetch_list: Optional[List[Any]] = None, scope=None) -> RunResult:
    """Run the startup program, then ``steps`` training steps in a fresh scope.

    Feeds come from ``numpy.random.default_rng(data_seed)``, so two models
    built alike see the same data.  Returns the fetched arrays of each step
    and every parameter after the last step.
    """
    import paddle

    scope = paddle.static.Scope() if scope is None else scope
    rng = np.random.default_rng(data_seed)
    fetch = model.fetch_list if fetch_list is None else fetch_list
    with paddle.static.scope_guard(scope), ir_guard(model.ir):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        fetched = []
        for _ in range(steps):
            out = exe.run(model.main, feed=model.feed(rng), fetch_list=fetch)
            fetched.append([np.array(a) for a in out])
        params = [np.array(scope.find_var(name).get_tensor())
                  for name in parameter_names(model.main)]
    return RunResult(fetches=fetched, params=params)


def step_peaks(model: BuiltModel, steps: int, *, data_seed: int = 0) -> tuple:
    """Run the startup program, then ``steps`` training steps in a fresh scope,
    reading Paddle's allocator (``host_memory_stat_*('Allocated', 0)``).

    Returns ``(peaks, base)``: each step's allocator peak in bytes above
    ``base``, the memory allocated after the startup program (parameters and
    optimizer state).  Feeds come from ``numpy.random.default_rng(data_seed)``.
    """
    import paddle
    from paddle.base import core

    rng = np.random.default_rng(data_seed)
    peaks = []
    with paddle.static.scope_guard(paddle.static.Scope()), ir_guard(model.ir):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        base = core.host_memory_stat_current_value("Allocated", 0)
        for _ in range(steps):
            feed = model.feed(rng)
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            exe.run(model.main, feed=feed, fetch_list=model.fetch_list)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0) - base)
    return peaks, base


@contextlib.contextmanager
def flags(**values):
    """Set Paddle flags (``FLAGS_`` names without the prefix) for a block and
    restore them afterwards."""
    import paddle

    names = [f"FLAGS_{k}" for k in values]
    old = paddle.get_flags(names)
    paddle.set_flags({f"FLAGS_{k}": v for k, v in values.items()})
    try:
        yield
    finally:
        paddle.set_flags(old)
