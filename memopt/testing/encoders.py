"""A Transformer encoder classifier built from ``paddle.nn`` layers, for the
sweeps and benchmarks that train or save one as a Paddle user writes it:
:func:`encoder_layer` makes the ``nn.Layer`` (dygraph, ``paddle.jit.save``),
:func:`encoder_classifier` builds it into a static program with its inputs
and loss.

``memopt.testing.models``' ``"transformer"`` writes its attention out of ops
the legacy IR still accepts (``einsum``); this one uses
``nn.TransformerEncoder`` (``nn.TransformerEncoderLayer``: multi-head
attention, dropout, layer norm, a ReLU feed-forward) the way users call it,
with an optional key-padding mask fed per batch.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np

#: added to the attention scores of padded positions (the mask's value there)
MASKED = -1e9


def encoder_layer(*, d_model: int, vocab: Optional[int] = None, heads: int = 4, d_ff: int = 64,
                  layers: int = 2, classes: int = 5, dropout: float = 0.1):
    """An ``nn.Layer`` whose ``forward(x, mask=None)`` gives ``[batch,
    classes]`` logits: ``x`` int64 ids ``[batch, seq]`` through an
    ``nn.Embedding(vocab, d_model)`` (``vocab`` None: ``x`` is already
    ``[batch, seq, d_model]`` float32 features), ``layers`` copies of
    ``nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout)`` (``mask``:
    added to the attention scores), the mean over the sequence, a Linear
    layer."""
    import paddle

    nn = paddle.nn

    class EncoderClassifier(nn.Layer):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model) if vocab is not None else None
            self.encoder = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=dropout), layers)
            self.head = nn.Linear(d_model, classes)

        def forward(self, x, mask=None):
            h = self.embed(x) if self.embed is not None else x
            return self.head(paddle.mean(self.encoder(h, src_mask=mask), axis=1))

    return EncoderClassifier()


def encoder_classifier(*, seq: int, d_model: int, vocab: Optional[int] = None, heads: int = 4,
                       d_ff: int = 64, layers: int = 2, classes: int = 5,
                       dropout: float = 0.1,
                       key_padding_mask: bool = False) -> Tuple[Callable, object, object]:
    """Build the classifier in the current ``program_guard``.

    Inputs: ``tokens`` ``[-1, seq]`` int64 ids below ``vocab`` (``vocab``
    None: ``src`` ``[-1, seq, d_model]`` float32 features instead of an
    embedding), ``label`` ``[-1, 1]`` int64 below ``classes``, and with
    ``key_padding_mask`` a ``mask`` ``[-1, 1, 1, seq]`` float32: 0 where a
    position is read, :data:`MASKED` after each row's length (between
    ``seq // 2`` and ``seq``).  The encoder's output is averaged over the
    sequence and a Linear layer gives the logits (:func:`encoder_layer`);
    the loss is the mean cross entropy.  No optimizer: the caller minimizes
    the loss.

    Returns
    -------
    ``(feed, loss, logits)``: ``feed(rng, batch)`` gives a feed dict of
    ``batch`` rows drawn from ``rng`` (a ``numpy.random.Generator``).
    """
    import paddle

    if vocab is None:
        x = paddle.static.data("src", [-1, seq, d_model], "float32")
    else:
        x = paddle.static.data("tokens", [-1, seq], "int64")
    label = paddle.static.data("label", [-1, 1], "int64")
    mask = paddle.static.data("mask", [-1, 1, 1, seq], "float32") if key_padding_mask else None
    model = encoder_layer(d_model=d_model, vocab=vocab, heads=heads, d_ff=d_ff, layers=layers,
                          classes=classes, dropout=dropout)
    logits = model(x, mask)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))

    def feed(rng: np.random.Generator, batch: int) -> dict:
        if vocab is None:
            data = {"src": rng.standard_normal((batch, seq, d_model)).astype("float32")}
        else:
            data = {"tokens": rng.integers(0, vocab, (batch, seq)).astype("int64")}
        data["label"] = rng.integers(0, classes, (batch, 1)).astype("int64")
        if key_padding_mask:
            lengths = rng.integers(seq // 2, seq + 1, batch)
            read = np.arange(seq)[None, :] < lengths[:, None]
            data["mask"] = np.where(read, 0.0, MASKED).astype("float32").reshape(
                batch, 1, 1, seq)
        return data

    return feed, loss, logits
