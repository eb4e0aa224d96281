"""Small dygraph training steps of the kinds Paddle users train, for tests and benchmarks.

Each ``build_<kind>(batch=..., **size)`` returns ``(step, inputs, optimizer)``:
``step`` is an ``nn.Layer`` whose forward takes the inputs and returns the
scalar loss, ``inputs`` seeded tensors of batch ``batch``, ``optimizer`` an
Adam over the step's parameters.  ``spec(kind, **size)`` gives the matching
``InputSpec`` list (batch dimension ``None``).  :data:`KINDS` lists them; the
default sizes are small enough for unit tests on a CPU; the benchmarks pass
larger ones (``build_resnet(depth=50, image=224)`` is paddle.vision's
ResNet-50).

Kinds: ``mlp``, ``resnet`` (paddle.vision ResNet), ``mobilenet``
(paddle.vision MobileNetV2), ``bert`` (``nn.TransformerEncoder`` over token
embeddings, classification), ``gpt`` (causal decoder, next-token loss),
``lstm`` / ``gru`` (``nn.LSTM`` / ``nn.GRU`` classifiers), ``unet`` (conv
encoder-decoder with skips, per-pixel loss), ``vit`` (patch embedding and
``nn.TransformerEncoder``).
"""
from __future__ import annotations

import paddle
from paddle import nn
from paddle.nn import functional as F
from paddle.static import InputSpec

__all__ = ["KINDS", "build", "spec", "Classify"]


class Classify(nn.Layer):
    """``loss = cross_entropy(model(x), label)``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, label):
        return F.cross_entropy(self.model(x), label)


class MLP(nn.Layer):
    def __init__(self, width=256, depth=4, inputs=64, classes=10, dropout=0.0):
        super().__init__()
        self.layers = nn.LayerList(
            [nn.Linear(inputs if i == 0 else width, width) for i in range(depth)])
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
            if self.dropout is not None:
                x = self.dropout(x)
        return self.head(x)


class Bert(nn.Layer):
    def __init__(self, vocab=1000, seq=32, width=64, heads=4, ffn=128, layers=2, classes=2,
                 dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq, width)
        block = nn.TransformerEncoderLayer(width, heads, ffn, dropout=dropout)
        self.encoder = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)
        self.seq = seq

    def forward(self, ids):
        pos = paddle.arange(self.seq, dtype="int64").unsqueeze(0)
        h = self.embed(ids) + self.position(pos)
        h = self.encoder(h)
        return self.head(self.norm(h[:, 0]))


class GPTBlock(nn.Layer):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiHeadAttention(width, heads, dropout=dropout)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask)
        h = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + self.drop(h)


class GPT(nn.Layer):
    """A causal decoder; ``forward(ids, targets)`` returns the next-token loss."""

    def __init__(self, vocab=1000, seq=32, width=64, heads=4, layers=2, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq, width)
        self.blocks = nn.LayerList([GPTBlock(width, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.seq = seq
        self.vocab = vocab

    def forward(self, ids, targets):
        pos = paddle.arange(self.seq, dtype="int64").unsqueeze(0)
        x = self.embed(ids) + self.position(pos)
        mask = paddle.triu(paddle.full([self.seq, self.seq], -1e4, "float32"), 1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape([-1, self.vocab]), targets.reshape([-1, 1]))


class RNNClassifier(nn.Layer):
    def __init__(self, cell="lstm", inputs=32, hidden=64, layers=2, classes=10):
        super().__init__()
        kind = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = kind(inputs, hidden, num_layers=layers)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class ConvBlock(nn.Layer):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2D(cin, cout, 3, padding=1)
        self.bn1 = nn.BatchNorm2D(cout)
        self.conv2 = nn.Conv2D(cout, cout, 3, padding=1)
        self.bn2 = nn.BatchNorm2D(cout)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)))


class UNet(nn.Layer):
    """Two levels down, two up, skips concatenated; per-pixel class logits."""

    def __init__(self, channels=3, width=8, classes=4):
        super().__init__()
        self.down1 = ConvBlock(channels, width)
        self.down2 = ConvBlock(width, 2 * width)
        self.bottom = ConvBlock(2 * width, 4 * width)
        self.up2 = nn.Conv2DTranspose(4 * width, 2 * width, 2, stride=2)
        self.dec2 = ConvBlock(4 * width, 2 * width)
        self.up1 = nn.Conv2DTranspose(2 * width, width, 2, stride=2)
        self.dec1 = ConvBlock(2 * width, width)
        self.out = nn.Conv2D(width, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(paddle.concat([self.up2(b), d2], axis=1))
        u1 = self.dec1(paddle.concat([self.up1(u2), d1], axis=1))
        return self.out(u1)


class Segment(nn.Layer):
    """``loss = cross_entropy`` per pixel of a segmentation model's logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, label):
        logits = self.model(x)
        return F.cross_entropy(logits, label, axis=1)


class ViT(nn.Layer):
    def __init__(self, image=32, patch=4, width=64, heads=4, layers=2, classes=10,
                 dropout=0.1):
        super().__init__()
        self.patch = nn.Conv2D(3, width, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = self.create_parameter([1, 1, width])
        self.position = self.create_parameter([1, n + 1, width])
        block = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=dropout,
                                           activation="gelu", normalize_before=True)
        self.encoder = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose([0, 2, 1])
        cls = self.cls.expand([h.shape[0], 1, h.shape[2]])
        h = paddle.concat([cls, h], axis=1) + self.position
        h = self.encoder(h)
        return self.head(self.norm(h[:, 0]))


class LMStep(nn.Layer):
    """A language model whose forward already returns the loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, targets):
        return self.model(ids, targets)


def _model(kind: str, **size):
    import paddle.vision.models as vm

    if kind == "mlp":
        return MLP(**size)
    if kind == "resnet":
        depth = size.get("depth", 18)
        return vm.ResNet(vm.resnet.BasicBlock if depth < 50 else vm.resnet.BottleneckBlock,
                         depth=depth, num_classes=size.get("classes", 10))
    if kind == "mobilenet":
        return vm.MobileNetV2(scale=size.get("scale", 0.35), num_classes=size.get("classes", 10))
    if kind == "bert":
        return Bert(**size)
    if kind == "gpt":
        return GPT(**size)
    if kind in ("lstm", "gru"):
        return RNNClassifier(cell=kind, **size)
    if kind == "unet":
        return UNet(**size)
    if kind == "vit":
        return ViT(**size)
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


KINDS = ("mlp", "resnet", "mobilenet", "bert", "gpt", "lstm", "gru", "unet", "vit")

#: Shapes per kind (batch dimension first, None), from the size keywords.
_IMAGE = {"resnet": 32, "mobilenet": 32, "unet": 32, "vit": 32}


def spec(kind: str, **size) -> list:
    """The step's ``InputSpec`` list (data: no gradient)."""
    seq = size.get("seq", 32)
    if kind == "mlp":
        return [InputSpec([None, size.get("inputs", 64)], "float32", "x"),
                InputSpec([None, 1], "int64", "label")]
    if kind in ("resnet", "mobilenet", "vit"):
        image = size.get("image", _IMAGE[kind])
        return [InputSpec([None, 3, image, image], "float32", "image"),
                InputSpec([None, 1], "int64", "label")]
    if kind == "unet":
        image = size.get("image", _IMAGE[kind])
        return [InputSpec([None, size.get("channels", 3), image, image], "float32", "image"),
                InputSpec([None, 1, image, image], "int64", "label")]
    if kind == "bert":
        return [InputSpec([None, seq], "int64", "ids"), InputSpec([None, 1], "int64", "label")]
    if kind == "gpt":
        return [InputSpec([None, seq], "int64", "ids"), InputSpec([None, seq], "int64", "targets")]
    if kind in ("lstm", "gru"):
        return [InputSpec([None, seq, size.get("inputs", 32)], "float32", "x"),
                InputSpec([None, 1], "int64", "label")]
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


def _model_size(kind: str, size: dict) -> dict:
    """The size keywords the model class takes (``image`` is the input's)."""
    drop = {"image"} if kind in ("resnet", "mobilenet", "unet") else set()
    if kind in ("lstm", "gru"):
        drop |= {"seq"}
    return {k: v for k, v in size.items() if k not in drop}


def inputs(kind: str, batch: int, seed: int = 0, **size) -> list:
    """Seeded tensors matching :func:`spec` at ``batch``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for s in spec(kind, **size):
        shape = [batch] + [int(d) for d in s.shape[1:]]
        if "int" in str(s.dtype):
            high = {"bert": size.get("vocab", 1000), "gpt": size.get("vocab", 1000)}.get(kind)
            if s.name == "label":
                high = size.get("classes", 4 if kind == "unet" else 2 if kind == "bert" else 10)
            out.append(paddle.to_tensor(rng.integers(0, high, shape).astype("int64")))
        else:
            out.append(paddle.to_tensor(rng.standard_normal(shape).astype("float32")))
    return out


def step_layer(kind: str, seed: int = 0, **size):
    """The kind's step Layer (loss from the inputs), parameters seeded."""
    paddle.seed(seed)
    model = _model(kind, **_model_size(kind, size))
    if kind == "gpt":
        return LMStep(model)
    if kind == "unet":
        return Segment(model)
    return Classify(model)


def build(kind: str, batch: int = 4, seed: int = 0, lr: float = 1e-3, **size):
    """``(step, inputs, optimizer)`` of ``kind`` at ``batch`` (Adam)."""
    step = step_layer(kind, seed, **size)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=step.parameters())
    return step, inputs(kind, batch, seed, **size), opt
