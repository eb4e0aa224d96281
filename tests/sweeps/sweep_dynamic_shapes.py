"""Sweep memory_optimize over ops whose output shapes depend on data or whose
memory is unusual in ways the other sweeps do not build.

Programs (small; trained 3 steps where they have parameters, inference
otherwise; data fed with an unknown batch dim ``-1`` as a new user writes
it): data-dependent shapes (masked_select, nonzero, unique with counts,
one-argument where, ``x[x > 0]``, topk with k from a tensor,
repeat_interleave with tensor repeats, gather of argsort indices, embedding
of argmax ids, index_select, slice with tensor starts/ends, reshape with a
shape tensor, expand_as of a data-dependent tensor); sparse embeddings
(``nn.Embedding(sparse=True)``: SelectedRows gradients, padding_idx) under
SGD / Adam / Momentum; sequences (2-layer bidirectional LSTM, GRU with
sequence_length, SimpleRNN, a while loop growing a tensor by concat, a
while_loop whose carried tensor changes shape); detection ops (roi_align,
roi_pool, nms, yolo_box, prior_box, box_coder, deform_conv2d); creation ops
on feed shapes (arange, linspace, full_like, zeros_like) and random ops
(randint, randperm, bernoulli, multinomial); int64 / bool outputs; a value
made at batch B read at another leading dim (reshape to [-1, k],
flatten(0, 1), a transposed batch dim).

Each program is built in both IRs (PIR, the default; legacy with
``FLAGS_enable_pir_api=0`` set before Paddle is imported), GC on (the
default) and off (``FLAGS_eager_delete_tensor_gb=-1``), a fresh process per
(IR, GC) group.  Configs: level 0, 1, 2 and ``budget=`` 0.9 x
``memopt.analyze(program, fetch_list=...).total_peak(batch)``: every fetch
of every step and every persistable afterwards must equal the unchanged
program's (same dtype, shape, bytes); and ``budget=`` the smallest budget
a BudgetError at 1 byte names (where memopt recomputes the most).  A refusal must be a memopt error with
the program unchanged.  The harness is sweep_memory_semantics.py's.

The cells are tests of ``test_sweep_dynamic_shapes.py``: program x IR x GC
x config -> ok / refused (message) / paddle fails unchanged / DIFFERS /
BUG; each program runs in a fresh process per IR and GC (``--worker NAME``
prints one JSON object).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_memory_semantics as harness  # noqa: E402

BATCH = 64


def _pir(paddle):
    return paddle.framework.in_pir_mode()


def _data(paddle, name, shape, dtype="float32"):
    """A feed with an unknown batch dim, as users declare it."""
    return paddle.static.data(name, [-1] + list(shape), dtype)


def _normal(**named):
    def feed(rng):
        return {n: rng.standard_normal((BATCH,) + tuple(s)).astype("float32")
                for n, s in named.items()}
    return feed


def _sum(paddle, x, axis=None):
    """paddle.sum (PIR); legacy static mode refuses sum of a Variable in
    Paddle 3.3.1 ("must be Value"), so there a mean times the count."""
    if _pir(paddle):
        return paddle.sum(x, axis=axis)
    n = x.shape[axis] if axis is not None else 1
    return paddle.mean(paddle.cast(x, "float32"), axis=axis) * float(n if n > 0 else 1)


def _argmax(paddle, x, axis, keepdim=False):
    """paddle.argmax (PIR); topk's indices in legacy (argmax refuses a Variable)."""
    if _pir(paddle):
        return paddle.argmax(x, axis=axis, keepdim=keepdim)
    idx = paddle.topk(x if axis in (-1, len(x.shape) - 1) else paddle.transpose(x, [1, 0]), 1)[1]
    return idx if keepdim else paddle.squeeze(idx, -1)


def _adam(paddle, loss):
    paddle.optimizer.Adam(1e-2).minimize(loss)


# -- data-dependent shapes --------------------------------------------------------

def _masked_select(paddle):
    """masked_select, nonzero, one-argument where and ``h[h > 0]`` of a
    trained value: outputs whose length the data decides."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    sel = paddle.masked_select(h, h > 0)
    idx = paddle.nonzero(h > 0.5)
    rows, _ = paddle.where(h > 1.0)
    pos = h[h > 0.2]
    out = paddle.nn.Linear(16, 4)(paddle.nn.functional.relu(h))
    loss = paddle.mean(out * out) + _sum(paddle, sel) * 1e-3 + _sum(paddle, pos * pos) * 1e-3
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, sel, idx, rows]


def _unique_counts(paddle):
    """paddle.unique with inverse and counts; the inverse indexes an
    embedding, the counts weigh the loss."""
    ids = _data(paddle, "ids", [6], "int64")
    uniq, inverse, counts = paddle.unique(paddle.reshape(ids, [-1]), return_inverse=True,
                                          return_counts=True)
    emb = paddle.nn.Embedding(50, 8)
    e = emb(uniq)                                    # [n_unique, 8]
    w = paddle.cast(counts, "float32")
    per = paddle.gather(e, inverse)                  # [B*6, 8]
    loss = paddle.mean(per * per) + _sum(paddle, paddle.mean(e, axis=1) * w) * 1e-3
    _adam(paddle, loss)

    def feed(rng):
        return {"ids": rng.integers(0, 50, (BATCH, 6)).astype("int64")}
    return feed, [loss, uniq, inverse, counts]


def _topk_tensor_k(paddle):
    """topk with k a tensor computed from the data, gather of argsort
    indices, index_select of argmax rows."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    k = paddle.clip(paddle.cast(_sum(paddle, paddle.cast(x[0] > 0, "float32")), "int32"), 1, 16)
    vals, _ = paddle.topk(h, k=paddle.reshape(k, [1]))
    order = paddle.argsort(paddle.mean(h, axis=1))
    ranked = paddle.gather(h, order)
    best = paddle.index_select(h, _argmax(paddle, h, axis=0), axis=0)
    loss = paddle.mean(vals) + paddle.mean(ranked[:8] * ranked[:8]) + paddle.mean(best)
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, vals, order]


def _repeat_interleave(paddle):
    """repeat_interleave with repeats read from the data (a [sum(repeats), 8]
    output), trained through."""
    x = _data(paddle, "x", [8])
    reps = _data(paddle, "reps", [], "int64")
    h = paddle.nn.Linear(8, 8)(x)
    r = paddle.repeat_interleave(h, reps, axis=0)
    out = paddle.nn.Linear(8, 2)(paddle.nn.functional.silu(r))
    loss = paddle.mean(out * out)
    _adam(paddle, loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, 8)).astype("float32"),
                "reps": rng.integers(0, 4, (BATCH,)).astype("int64")}
    return feed, [loss, r]


def _embedding_argmax(paddle):
    """F.embedding of ids from argmax of a trained value (no gradient
    through the ids), added back to the value."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 10)(x)
    ids = _argmax(paddle, h, axis=1)
    table = paddle.create_parameter([10, 10], "float32", name="argmax_table")
    e = paddle.nn.functional.embedding(ids, table)
    loss = paddle.mean((h + e) ** 2)
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, ids]


def _tensor_shapes(paddle):
    """paddle.slice with tensor starts/ends, reshape with a shape tensor,
    expand_as of a data-dependent tensor."""
    x = _data(paddle, "x", [16])
    n = _data(paddle, "n", [], "int32")
    h = paddle.nn.Linear(16, 16)(x)
    stop = paddle.reshape(n[0:1], [1])
    part = paddle.slice(h, axes=[1], starts=[paddle.full([1], 2, "int32")], ends=[stop])
    flat = paddle.reshape(h, paddle.concat([paddle.full([1], -1, "int32"),
                                            paddle.full([1], 4, "int32")]))
    sel = paddle.masked_select(h[:, 0:1], h[:, 0:1] > 0)        # [n_pos]
    m = paddle.mean(h).reshape([1])
    big = paddle.expand_as(m, sel) if _pir(paddle) else paddle.expand(m, paddle.shape(sel))
    loss = paddle.mean(part * part) + paddle.mean(flat) + _sum(paddle, big * sel) * 1e-3
    _adam(paddle, loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, 16)).astype("float32"),
                "n": np.full((BATCH,), 9, "int32")}
    return feed, [loss, part, flat]


# -- sparse ------------------------------------------------------------------------

def _sparse(kind):
    def build(paddle):
        ids = _data(paddle, "ids", [5], "int64")
        emb = paddle.nn.Embedding(100, 16, sparse=True, padding_idx=0)
        h = paddle.nn.functional.relu(paddle.nn.Linear(16, 16)(emb(ids)))
        loss = paddle.mean(h * h)
        opt = {"sgd": lambda: paddle.optimizer.SGD(0.1),
               "adam": lambda: paddle.optimizer.Adam(0.01),
               "momentum": lambda: paddle.optimizer.Momentum(0.05, momentum=0.9)}[kind]()
        opt.minimize(loss)

        def feed(rng):
            return {"ids": rng.integers(0, 100, (BATCH, 5)).astype("int64")}
        return feed, [loss, h]
    return build


# -- sequences ---------------------------------------------------------------------

def _lstm(paddle):
    x = _data(paddle, "x", [7, 8])
    out, (hs, cs) = paddle.nn.LSTM(8, 12, num_layers=2, direction="bidirect")(x)
    loss = paddle.mean(paddle.nn.Linear(24, 1)(out) ** 2)
    _adam(paddle, loss)
    return _normal(x=(7, 8)), [loss, out, hs]


def _gru_seqlen(paddle):
    x = _data(paddle, "x", [7, 8])
    lens = _data(paddle, "lens", [], "int64")
    out, h = paddle.nn.GRU(8, 12)(x, sequence_length=lens)
    loss = paddle.mean(paddle.nn.Linear(12, 1)(out) ** 2) + paddle.mean(h)
    _adam(paddle, loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, 7, 8)).astype("float32"),
                "lens": rng.integers(1, 8, (BATCH,)).astype("int64")}
    return feed, [loss, out]


def _simple_rnn(paddle):
    x = _data(paddle, "x", [7, 8])
    out, h = paddle.nn.SimpleRNN(8, 12)(x)
    loss = paddle.mean(paddle.nn.Linear(12, 1)(out) ** 2)
    _adam(paddle, loss)
    return _normal(x=(7, 8)), [loss, out, h]


def _concat_loop(paddle):
    """A beam-search-style decode: a while loop appends each step's argmax
    column to a growing [B, t] tensor by concat (inference)."""
    x = _data(paddle, "x", [8])
    lin = paddle.nn.Linear(8, 8)
    seq = _argmax(paddle, x, axis=1, keepdim=True)
    i = paddle.full([1], 0, "int64")
    n = paddle.full([1], 5, "int64")

    def body(i, h, seq):
        h = paddle.nn.functional.relu(lin(h))
        tok = _argmax(paddle, h, axis=1, keepdim=True)
        return i + 1, h, paddle.concat([seq, tok], axis=1)

    _, h, seq = paddle.static.nn.while_loop(lambda i, h, s: i < n, body, [i, x, seq])
    return _normal(x=(8,)), [seq, h]


def _loop_shape_change(paddle):
    """while_loop whose carried tensor doubles its second dim each trip."""
    x = _data(paddle, "x", [4])
    i = paddle.full([1], 0, "int64")
    n = paddle.full([1], 3, "int64")

    def body(i, v):
        return i + 1, paddle.concat([v, v * 0.5], axis=1)

    _, v = paddle.static.nn.while_loop(lambda i, v: i < n, body, [i, x])
    return _normal(x=(4,)), [v, paddle.mean(v, axis=1)]


# -- detection / vision ------------------------------------------------------------

def _rois(paddle):
    """roi_align and roi_pool over a trained feature map (boxes fed)."""
    img = _data(paddle, "img", [3, 16, 16])
    feat = paddle.nn.Conv2D(3, 4, 3, padding=1)(img)
    boxes = paddle.static.data("boxes", [-1, 4], "float32")
    num = paddle.static.data("num", [-1], "int32")
    a = paddle.vision.ops.roi_align(feat, boxes, num, 4)
    p = paddle.vision.ops.roi_pool(feat, boxes, num, 4)
    out = paddle.nn.Linear(64, 2)(paddle.flatten(a + p, 1))
    loss = paddle.mean(out * out)
    _adam(paddle, loss)

    def feed(rng):
        lo = rng.uniform(0, 8, (BATCH * 2, 2))
        return {"img": rng.standard_normal((BATCH, 3, 16, 16)).astype("float32"),
                "boxes": np.concatenate([lo, lo + rng.uniform(2, 8, lo.shape)], 1).astype("float32"),
                "num": np.full((BATCH,), 2, "int32")}
    return feed, [loss, a]


def _nms(paddle):
    """nms and batched_nms of scored boxes (inference: kept indices)."""
    boxes = paddle.static.data("boxes", [-1, 4], "float32")
    scores = paddle.static.data("scores", [-1], "float32")
    cats = paddle.static.data("cats", [-1], "int64")
    keep = paddle.vision.ops.nms(boxes, 0.5, scores)
    keep2 = paddle.vision.ops.nms(boxes, 0.5, scores, category_idxs=cats, categories=[0, 1, 2])
    kept = paddle.gather(boxes, keep)

    def feed(rng):
        lo = rng.uniform(0, 20, (BATCH, 2))
        return {"boxes": np.concatenate([lo, lo + rng.uniform(2, 8, lo.shape)], 1).astype("float32"),
                "scores": rng.uniform(0, 1, BATCH).astype("float32"),
                "cats": rng.integers(0, 3, BATCH).astype("int64")}
    return feed, [keep, keep2, kept]


def _yolo_prior_boxcoder(paddle):
    """yolo_box, prior_box and box_coder on a conv head (inference)."""
    img = _data(paddle, "img", [3, 8, 8])
    size = paddle.static.data("size", [-1, 2], "int32")
    head = paddle.nn.Conv2D(3, 2 * 7, 1)(img)                 # 2 anchors x (5 + 2 classes)
    boxes, scores = paddle.vision.ops.yolo_box(head, size, [10, 13, 16, 30], 2, 0.01, 8)
    priors, var = paddle.vision.ops.prior_box(head, img, min_sizes=[4.0], aspect_ratios=[1.0])
    pri = paddle.reshape(priors, [-1, 4])
    dec = paddle.vision.ops.box_coder(pri, paddle.reshape(var, [-1, 4]),
                                      paddle.unsqueeze(pri * 1.1, 0),
                                      code_type="decode_center_size", box_normalized=True)
    return (lambda rng: {"img": rng.standard_normal((BATCH, 3, 8, 8)).astype("float32"),
                         "size": np.full((BATCH, 2), 64, "int32")}), [boxes, scores, dec]


def _deform_conv(paddle):
    """deform_conv2d with learned offsets and mask, trained."""
    img = _data(paddle, "img", [3, 8, 8])
    off = paddle.nn.Conv2D(3, 18, 3, padding=1)(img)
    mask = paddle.nn.functional.softmax(paddle.nn.Conv2D(3, 9, 3, padding=1)(img), axis=1)
    out = paddle.vision.ops.DeformConv2D(3, 4, 3, padding=1)(img, off, mask)
    loss = paddle.mean(out * out)
    _adam(paddle, loss)
    return _normal(img=(3, 8, 8)), [loss, out]


# -- creation, random, ints ---------------------------------------------------------

def _creation(paddle):
    """arange / linspace / full_like / zeros_like of feed shapes, trained
    through the float ones."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    rows = paddle.shape(x)[0]
    pos = paddle.cast(paddle.arange(0, rows, dtype="int64"), "float32")     # [B]
    lin = paddle.linspace(0.0, 1.0, 16, "float32")
    base = paddle.full_like(h, 0.5) + paddle.zeros_like(h)
    out = h * lin + base + paddle.unsqueeze(pos, 1) * 1e-3
    loss = paddle.mean(out * out)
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, pos, out]


def _random_ops(paddle):
    """randint / randperm / bernoulli / multinomial inside a trained step:
    never recomputed, values identical."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    p = paddle.nn.functional.softmax(h)
    drop = paddle.bernoulli(paddle.full_like(h, 0.7))
    picks = paddle.multinomial(p, 2)
    ri = paddle.randint(0, 16, [BATCH])
    perm = paddle.randperm(16)
    g = paddle.gather(h, perm, axis=1) * drop
    g = g + paddle.cast(paddle.unsqueeze(ri, 1), "float32") * 1e-3
    out = paddle.nn.Linear(16, 2)(paddle.nn.functional.silu(g))
    loss = paddle.mean(out * out)
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, picks, perm, drop]


def _int_bool(paddle):
    """int64 and bool outputs of several shapes alive at once and dead
    early: what levels 0-2 may reuse."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    a = _argmax(paddle, h, axis=1)                     # int64 [B]
    m = h > 0                                          # bool [B, 16]
    c = paddle.cast(_sum(paddle, paddle.cast(m, "float32"), axis=1), "int64")  # int64 [B]
    m2 = paddle.cast(paddle.cast(m, "int32") * paddle.cast(h < 1.0, "int32"), "bool")
    c.stop_gradient = True                             # no gradient through int casts
    i2 = paddle.cast(m2, "int64") * paddle.unsqueeze(a, 1)
    f = paddle.cast(i2 + paddle.unsqueeze(c, 1), "float32")
    f.stop_gradient = True                             # legacy: no int grad kernels
    out = paddle.nn.Linear(16, 2)(h * paddle.cast(m2, "float32") + f * 1e-2)
    loss = paddle.mean(out * out)
    _adam(paddle, loss)
    return _normal(x=(16,)), [loss, a, c]


def _leading_dim(paddle):
    """A value made at batch B read at leading dims B*4 (reshape to [-1, 8]),
    B*6 (flatten(0, 1)) and with the batch dim moved (transpose)."""
    x = _data(paddle, "x", [6, 32])
    h = paddle.nn.Linear(32, 32)(x)                           # [B, 6, 32]
    r = paddle.reshape(h, [-1, 8])                            # [B*24, 8]
    r = paddle.nn.Linear(8, 8)(r)
    f = paddle.nn.Linear(32, 32)(paddle.flatten(h, 0, 1))     # [B*6, 32]
    t = paddle.transpose(h, [1, 2, 0])                         # [6, 32, B]
    t = paddle.nn.functional.silu(t)
    back = paddle.transpose(t, [2, 0, 1])
    loss = paddle.mean(r * r) + paddle.mean(f * f) + paddle.mean(back * h)
    _adam(paddle, loss)
    return _normal(x=(6, 32)), [loss]


PROGRAMS = {
    "masked_select": _masked_select,
    "unique_counts": _unique_counts,
    "topk_tensor_k": _topk_tensor_k,
    "repeat_interleave": _repeat_interleave,
    "embedding_argmax": _embedding_argmax,
    "tensor_shapes": _tensor_shapes,
    "sparse_sgd": _sparse("sgd"),
    "sparse_adam": _sparse("adam"),
    "sparse_momentum": _sparse("momentum"),
    "lstm_bidir": _lstm,
    "gru_seqlen": _gru_seqlen,
    "simple_rnn": _simple_rnn,
    "concat_loop": _concat_loop,
    "loop_shape_change": _loop_shape_change,
    "rois": _rois,
    "nms": _nms,
    "yolo_prior_boxcoder": _yolo_prior_boxcoder,
    "deform_conv": _deform_conv,
    "creation": _creation,
    "random_ops": _random_ops,
    "int_bool": _int_bool,
    "leading_dim": _leading_dim,
}
CONFIGS = [("L0", [dict(level=0)]), ("L1", [dict(level=1)]), ("L2", [dict(level=2)]),
           ("budget0.9", ["budget"]), ("budget@smallest", ["smallest"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, metavar="NAME")
    args = parser.parse_args()
    harness.BATCH = BATCH
    harness.PROGRAMS = PROGRAMS
    harness.configs_of = lambda name: CONFIGS
    print(json.dumps(harness.check_one(args.worker)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
