"""Sweep memory_optimize over programs whose ops have unusual memory semantics.

Programs sweep_programs.py, sweep_user_programs.py, sweep_legacy_user.py
and sweep_region_programs.py do not build: static-mode slice assignment
(``x[1:3] = y``, ``x[:, 0] = 0.0``, mask / index-tensor setitem,
``paddle.static.setitem``, inside ``cond``, into a feed: set_value ops
writing a value other ops read before and after), scatter-style and
in-place writes (put_along_axis, index_put, index_add, scatter,
scatter_nd_add, masked_fill and the in-place forms put_along_axis_,
index_add_, index_put_, scatter_, masked_fill_, clip_, relu_, the in-place
views unsqueeze_/squeeze_/flatten_/reshape_, ``paddle.assign(x, output=y)``
onto a value read earlier, a running buffer and a feed, paddle.increment of
a scalar read before and after), aliases (``detach()`` then ``scale_``,
``h[1:3] = h[0:2]``, ``h.add_(h)``, views read after their base's last
reader; transpose/reshape chains, split/unbind/chunk into branches,
expand/broadcast_to, contiguous), dtypes (complex64 through paddle.fft,
float64/float32 cast chains, int8/uint8/bool masks), linalg with
gradients, einsum, unfold/fold, grid_sample, bicubic interpolate, ctc_loss,
scaled_dot_product_attention, roll, gather_nd; memory_optimize applied
twice (level 0 then 1, 1 then 2, 2 then ``budget=``, ``budget=`` then 1)
and on odd targets (the startup program, an empty program, a program that
only feeds and fetches).

Paddle 3.3.1 static mode has no fill_diagonal_ / zero_ on a Value or
Variable, and view / view_as / as_strided / uniform_ assert dynamic mode:
not swept.

Each program is built in both IRs (PIR, the default; legacy
``ProgramDesc`` with ``FLAGS_enable_pir_api=0`` set before Paddle is
imported) and run with the garbage collector on (the default) and off
(``FLAGS_eager_delete_tensor_gb=-1``), each IR x GC in a fresh process per
program.  Configs: level 0, 1, 2, ``budget=`` 0.9 x
``memopt.analyze(program).total_peak(batch)`` and ``budget=`` the
smallest budget a BudgetError at 1 byte names (where memopt recomputes
the most); ``budget=1`` accepted on a program whose step holds memory is a
bug.  A fresh build is rewritten
and run 3 steps in a fresh scope: every fetch of every step and every
persistable afterwards must equal the unchanged program's (same dtype,
shape, bytes).  A refusal must be a memopt error (BudgetError,
UnsupportedProgramError, ...) and leave the program as it was; a PlanError
(memopt.verify's independent checks of the plan failed) or GraphError is a
bug.

The cells are tests of ``test_sweep_memory_semantics.py``: program x IR x
GC x config -> ok / refused (message) / paddle fails unchanged / DIFFERS /
BUG (``--worker NAME`` prints one JSON object).
"""
import argparse
import contextlib
import io
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_programs import _one_line, same  # noqa: E402
from sweep_user_programs import _memopt_error  # noqa: E402

BATCH = 256
STEPS = 3


# -- programs ----------------------------------------------------------------------
# each builder returns (feed(rng) -> dict, fetch list); training builders call minimize

def _data(paddle, name, shape, dtype="float32"):
    return paddle.static.data(name, [BATCH] + list(shape), dtype)


def _normal(*shapes, **named):
    """feed(rng): a float32 normal array per name (shape without the batch)."""
    def feed(rng):
        return {n: rng.standard_normal((BATCH,) + tuple(s)).astype("float32")
                for n, s in named.items()}
    return feed


def _train(paddle, loss, kind="adam"):
    opt = paddle.optimizer.Adam(1e-2) if kind == "adam" else paddle.optimizer.SGD(0.05)
    opt.minimize(loss)


def _pir(paddle):
    return paddle.framework.in_pir_mode()


def _set(paddle, x, index, value):
    """``x[index] = value`` as a user writes it: the operator in PIR, and
    ``paddle.static.setitem`` in legacy programs (whose ``__setitem__``
    refuses static mode)."""
    if _pir(paddle):
        x[index] = value
        return x
    return paddle.static.setitem(x, index, value)


# Paddle 3.3.1's legacy static mode refuses PIR-only APIs on a Variable
# (tanh, sigmoid, gelu, exp, sin, cos, abs, sum, matmul, bmm, roll,
# index_put, grid_sample, fft: "must be Value, but got Variable"), so the
# programs below use silu / elu / softmax / square / mean / einsum where
# both IRs take them, and the PIR-only ops only where the op is the point.

def _setitem(paddle):
    """x[1:3] = y, x[:, 0] = 0.0, paddle.static.setitem on an intermediate
    read before and after (set_value / set_value_with_tensor), trained
    through."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    before = F.silu(h)                           # reads h before the writes
    y = paddle.nn.Linear(8, 8)(x)
    h = _set(paddle, h, slice(1, 3), y[0:2] * 2.0)
    h = _set(paddle, h, (slice(None), 0), 0.0)
    h = paddle.static.setitem(h, (slice(None), slice(4, 6)), paddle.square(before[:, 0:2]))
    after = F.relu(h)                            # reads h after the writes
    out = paddle.nn.Linear(8, 2)(after + before)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out, before]


def _setitem_grad_flow(paddle):
    """setitem of a trained value into a buffer the loss reads at several
    points: gradients through set_value_with_tensor to both operands."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [16])
    h = F.elu(paddle.nn.Linear(16, 16)(x))
    g = paddle.nn.Linear(16, 4)(x)
    first = paddle.mean(h * h)
    h = _set(paddle, h, (slice(None), slice(0, 4)), g)
    mid = paddle.nn.Linear(16, 16)(h)
    h = _set(paddle, h, (slice(None), slice(8, 12)), F.silu(g) * 0.5)
    out = paddle.nn.Linear(16, 2)(h + mid)
    loss = paddle.mean(out * out) + first
    _train(paddle, loss, "sgd")
    return _normal(x=(16,)), [loss, mid, g]


def _setitem_fetched(paddle):
    """Writes into a feed (x[:, 0] = 0) and into a value that is fetched
    and read by the backward (h[2:4] = ...), an in-place relu_ on a value
    read earlier: the fetches see what Paddle's program order leaves."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    x.stop_gradient = False
    x = _set(paddle, x, (slice(None), 0), 0.0)
    h = paddle.nn.Linear(8, 8)(x)
    early = paddle.square(h)
    h = _set(paddle, h, slice(2, 4), F.elu(h[0:2]))
    g = paddle.nn.Linear(8, 8)(h)
    g2 = F.relu_(g)
    out = paddle.nn.Linear(8, 2)(g2 + early)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, h, x, g]


def _assign_to_buffer(paddle):
    """A running buffer (a non-trainable persistable parameter) updated in
    the forward pass with paddle.assign(..., output=buf), read before and
    after the update."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    buf = paddle.create_parameter([8], "float32", name="running_buf",
                                  default_initializer=paddle.nn.initializer.Constant(0.5))
    buf.stop_gradient = True
    h = paddle.nn.Linear(8, 8)(x)
    centred = h - buf                                   # reads the old buffer
    paddle.assign(buf * 0.9 + paddle.mean(h, axis=0) * 0.1, output=buf)
    scaled = F.silu(centred) * buf                      # reads the new one
    out = paddle.nn.Linear(8, 2)(scaled)
    loss = paddle.mean(out * out)
    _train(paddle, loss, "sgd")
    return _normal(x=(8,)), [loss, out, buf]


def _setitem_in_cond(paddle):
    """setitem inside both branches of static.nn.cond, trained through."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)

    def yes():
        return paddle.static.setitem(h * 1.0, (slice(None), slice(0, 2)), F.silu(h[:, 2:4]))

    def no():
        return paddle.static.setitem(h * 2.0, (slice(None), 3), 1.0)

    g = paddle.static.nn.cond(paddle.mean(h) > -100.0, yes, no)
    out = paddle.nn.Linear(8, 2)(F.relu(g) + h)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _setitem_advanced(paddle):
    """x[mask] = 0 and x[index_tensor] = v (index_put in PIR), trained."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    read = F.silu(h)
    h = _set(paddle, h, h > 1.0, 0.0)
    rows = paddle.full([4], 3, "int64")
    h = _set(paddle, h, rows, F.elu(read[0:4]))
    out = paddle.nn.Linear(8, 2)(h + read)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _alias_writes(paddle):
    """In-place writes through an alias of a value the backward reads:
    ``h.detach()`` then ``scale_``, ``reshape(h)`` then ``add_``, a
    dropout output written over by ``relu_``."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    before = F.silu(h)                           # silu_grad reads h
    d = h.detach()
    d.scale_(2.0)
    g = paddle.nn.Linear(8, 8)(x)
    before_g = F.elu(g)
    r = paddle.reshape(g, [BATCH, 2, 4])
    r.add_(paddle.ones([BATCH, 2, 4], "float32"))
    k = F.dropout(paddle.nn.Linear(8, 8)(x), 0.3)
    k2 = F.relu_(k)
    out = paddle.nn.Linear(8, 2)(before + before_g + k2 + paddle.reshape(r, [BATCH, 8]) + d)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _self_alias(paddle):
    """A value written with itself: h[1:3] = h[0:2] (set_value reading a
    slice of its own target), h.add_(h), concat([h, h]), a feed written by
    paddle.assign(..., output=x) after a read."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    first = F.silu(h)
    h = _set(paddle, h, slice(1, 3), h[0:2])
    h2 = F.elu(h * 1.0)
    h2 = h2.add_(h2)
    both = paddle.concat([h2, h2], axis=1)
    fed = paddle.nn.Linear(8, 8)(x)
    paddle.assign(x * 0.5, output=x)
    out = paddle.nn.Linear(16, 2)(both) + paddle.mean(first + fed + x)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _view_outlives_base(paddle):
    """Views (reshape, squeeze/unsqueeze, flatten, transpose, slice) read
    after their base's last reader, while values of the base's shape are
    made: the base's memory must stay the view's."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = F.relu(paddle.nn.Linear(8, 8)(x))
    v = paddle.reshape(h, [BATCH, 2, 4])
    u = paddle.unsqueeze(F.silu(paddle.nn.Linear(8, 8)(x)), 1)
    f = paddle.flatten(paddle.unsqueeze(F.elu(paddle.nn.Linear(8, 8)(x)), 2), 1)
    sl = F.relu(paddle.nn.Linear(8, 8)(x))[:, 2:6]
    g = F.silu(paddle.nn.Linear(8, 8)(x))            # the bases' shape, made after them
    k = F.elu(paddle.nn.Linear(8, 8)(x))
    out = paddle.nn.Linear(8, 2)(paddle.reshape(v, [BATCH, 8]) + paddle.squeeze(u, 1) + f + g + k)
    out = out + paddle.mean(sl)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _counter_inplace(paddle):
    """A non-persistable scalar read, incremented in place
    (paddle.increment), read again; an activation scaled by each reading."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = F.silu(paddle.nn.Linear(8, 8)(x))
    c = paddle.full([1], 1.0, "float32")
    a = h * c
    paddle.increment(c, 1.0)
    b = F.elu(paddle.nn.Linear(8, 8)(a)) * c
    out = paddle.nn.Linear(8, 2)(a + b)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out, c]


def _scatter_writes(paddle):
    """put_along_axis, index_add, scatter (overwrite True/False),
    scatter_nd_add, masked_fill, index_put (PIR): outputs that alias their
    input in Paddle's kernels, trained."""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    idx = paddle.full([BATCH, 2], 3, "int64")
    a = paddle.put_along_axis(h, idx, F.silu(h[:, 0:2]), 1, reduce="add")
    b = paddle.index_add(a, paddle.full([2], 1, "int64"), 1, a[:, 5:7] * 0.5)
    pos = paddle.full([2], 4, "int64")
    c = paddle.scatter(b, pos, F.elu(b[0:2]), overwrite=True)
    d = paddle.scatter(c, pos, c[2:4], overwrite=False)
    e = paddle.scatter_nd_add(d, paddle.full([3, 1], 1, "int64"), d[0:3] * 0.1)
    g = paddle.masked_fill(e, e > 0.5, 0.25)
    if _pir(paddle):
        g = paddle.index_put(g, (paddle.full([2], 0, "int64"), paddle.full([2], 1, "int64")),
                             paddle.full([2], 3.0, "float32"))
    out = paddle.nn.Linear(8, 2)(g + h)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out, a]


def _inplace_writes(paddle):
    """The in-place forms: put_along_axis_, index_add_, index_put_ (PIR),
    scatter_, masked_fill_, clip_, unsqueeze_/squeeze_/reshape_/flatten_
    (in-place views), paddle.assign(x, output=y) onto a value read earlier.
    (Paddle 3.3.1's static Values have no fill_diagonal_ or zero_.)"""
    F = paddle.nn.functional
    x = _data(paddle, "x", [8])
    h = paddle.nn.Linear(8, 8)(x)
    read_early = h * 3.0
    p = F.elu(read_early * 0.1)
    p.put_along_axis_(paddle.full([BATCH, 1], 2, "int64"), h[:, 0:1], 1)
    p.index_add_(paddle.full([2], 5, "int64"), 1, h[:, 1:3])
    if _pir(paddle):
        p.index_put_((paddle.full([3], 1, "int64"), paddle.full([3], 6, "int64")),
                     paddle.full([3], 2.0, "float32"))
    p.scatter_(paddle.full([2], 3, "int64"), p[0:2] * 0.5)
    p.masked_fill_(h < -1.0, 0.0)
    c = F.silu(h * 4.0)
    c.clip_(-0.5, 0.5)
    v = paddle.square(h)
    v = v.unsqueeze_(1)
    v = v.squeeze_(1)
    v = v.reshape_([BATCH, 2, 4])
    v = v.flatten_(1, 2)
    buf = F.leaky_relu(h)
    early = buf + 1.0
    paddle.assign(c * 2.0, output=buf)
    out = paddle.nn.Linear(8, 2)(buf + v + p + early)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out, read_early, p]


def _views(paddle):
    """transpose + reshape chains, split / unbind / chunk outputs into
    different branches, expand / broadcast_to, contiguous.  (Paddle 3.3.1
    runs view, view_as and as_strided in dynamic graph mode only.)"""
    F = paddle.nn.functional
    x = _data(paddle, "x", [4, 6])
    h = paddle.nn.Linear(6, 6)(x)                          # [B, 4, 6]
    t = paddle.reshape(paddle.transpose(h, [0, 2, 1]), [-1, 24])
    t = paddle.reshape(paddle.transpose(paddle.reshape(t, [-1, 6, 4]), [0, 2, 1]), [-1, 4, 6])
    w = paddle.reshape(F.silu(t), [-1, 24])
    s1, s2, s3 = paddle.split(h, 3, axis=2)
    u = paddle.unbind(h, axis=1)
    c1, c2 = paddle.chunk(w, 2, axis=1)
    e = paddle.expand(paddle.mean(h, axis=1, keepdim=True), [-1, 4, 6])
    bc = paddle.broadcast_to(paddle.mean(s1, axis=2, keepdim=True), [BATCH, 4, 2])
    con = paddle.transpose(h, [0, 2, 1]).contiguous()
    branch1 = F.relu(s2) * bc + s3
    branch2 = paddle.concat([u[0] * u[3], F.elu(u[1])], 1)
    loss = paddle.mean(branch1) + paddle.mean(branch2 * branch2) + paddle.mean(c1 * c2) + \
        paddle.mean(e * t) + paddle.mean(con * con)
    _train(paddle, loss)
    return _normal(x=(4, 6)), [loss, branch2, w]


def _fft_complex(paddle):
    """rfft -> multiply by a learned complex filter -> irfft, trained."""
    x = _data(paddle, "x", [16])
    h = paddle.nn.Linear(16, 16)(x)
    spec = paddle.fft.rfft(h)                              # complex64 [B, 9]
    re = paddle.create_parameter([9], "float32", name="filter_re")
    im = paddle.create_parameter([9], "float32", name="filter_im")
    filt = paddle.complex(re, im)
    y = paddle.fft.irfft(spec * filt, n=16)
    mag = paddle.abs(spec)
    out = paddle.nn.Linear(16, 2)(y) + paddle.mean(mag)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(16,)), [loss, out, mag]


def _dtypes(paddle):
    """float64 mixed with float32 (cast chains), int8 (legacy: int16) / uint8 /
    bool masks."""
    x = _data(paddle, "x", [8])
    qtype = "int8" if _pir(paddle) else "int16"  # legacy cast refuses int8 in 3.3.1
    q = _data(paddle, "q", [8], qtype)
    u = _data(paddle, "u", [8], "uint8")
    h = paddle.nn.Linear(8, 8)(x)
    h64 = paddle.cast(h, "float64")
    g = paddle.cast(paddle.nn.functional.silu(h64 * 1.5), "float32")
    g = paddle.cast(paddle.cast(g, "float64") + paddle.cast(q, "float64"), "float32")
    mask = paddle.cast(u, "bool") & (h > 0)
    f = paddle.where(mask, g, paddle.zeros_like(g))
    scaled = f * paddle.cast(paddle.cast(q, "int32") % 3, "float32")
    out = paddle.nn.Linear(8, 2)(scaled + h)
    loss = paddle.mean(out * out)
    _train(paddle, loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, 8)).astype("float32"),
                "q": rng.integers(-5, 6, (BATCH, 8)).astype(qtype),
                "u": rng.integers(0, 2, (BATCH, 8)).astype("uint8")}
    return feed, [loss, out, mask, h64]


def _linalg(paddle):
    """inv, cholesky, qr, svd, eigh with gradients."""
    x = _data(paddle, "x", [4, 4])
    a = paddle.nn.Linear(4, 4)(x)
    spd = paddle.einsum("bij,bkj->bik", a, a) + paddle.eye(4) * 4.0
    inv = paddle.linalg.inv(spd)
    ch = paddle.linalg.cholesky(spd)
    q, r = paddle.linalg.qr(a)
    _u, s, _vh = paddle.linalg.svd(a)
    w, _v = paddle.linalg.eigh(spd)
    loss = paddle.mean(inv) + paddle.mean(ch) + paddle.mean(q * r) + paddle.mean(s) + \
        paddle.mean(w) * 0.01
    _train(paddle, loss)
    return _normal(x=(4, 4)), [loss, inv, s]


def _einsum_unfold(paddle):
    """einsum, unfold/fold, bicubic interpolate (align_corners), gather_nd;
    grid_sample and roll (PIR only: Paddle 3.3.1 legacy refuses both)."""
    F = paddle.nn.functional
    img = _data(paddle, "img", [2, 8, 8])
    h = paddle.nn.Conv2D(2, 4, 3, padding=1)(img)
    cols = F.unfold(h, 2, strides=2)                        # [B, 16, 16]
    mix = paddle.create_parameter([16, 16], "float32", name="mix_w")
    mixed = paddle.einsum("bij,jk->bik", cols, mix)
    back = F.fold(mixed, [8, 8], 2, strides=2)             # [B, 4, 8, 8]
    theta = paddle.reshape(paddle.nn.Linear(4, 6)(paddle.mean(back, axis=[2, 3])), [-1, 2, 3])
    if _pir(paddle):
        grid = F.affine_grid(theta * 0.1 + paddle.to_tensor([[1.0, 0, 0], [0, 1.0, 0]]),
                             [BATCH, 4, 8, 8], align_corners=False)
        back = F.grid_sample(back, grid, align_corners=False)
    up = F.interpolate(back, scale_factor=2, mode="bicubic", align_corners=True)
    rolled = paddle.roll(up, shifts=3, axis=3) if _pir(paddle) else up
    picked = paddle.gather_nd(rolled, paddle.full([BATCH, 1, 2], 1, "int64"))
    loss = paddle.mean(rolled * rolled) + paddle.mean(picked)
    _train(paddle, loss)
    return _normal(img=(2, 8, 8)), [loss, picked]


def _ctc(paddle):
    """F.ctc_loss (warpctc: its own gradient buffer) over per-frame log-probs
    (a Linear per frame: a GRU's rnn_grad keeps legacy programs from budget=)."""
    t, classes, lab = 10, 5, 3
    x = _data(paddle, "x", [t, 6])
    labels = _data(paddle, "labels", [lab], "int32")
    h = paddle.nn.functional.silu(paddle.nn.Linear(6, 8)(x))
    logits = paddle.transpose(paddle.nn.Linear(8, classes)(h), [1, 0, 2])  # [T, B, C]
    loss = paddle.nn.functional.ctc_loss(
        paddle.nn.functional.log_softmax(logits), labels,
        paddle.full([BATCH], t, "int64"), paddle.full([BATCH], lab, "int64"))
    _train(paddle, loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, t, 6)).astype("float32"),
                "labels": rng.integers(1, classes, (BATCH, lab)).astype("int32")}
    return feed, [loss, logits]


def _sdpa(paddle):
    """F.scaled_dot_product_attention (causal) between two projections."""
    s, d = 6, 8
    x = _data(paddle, "x", [s, d])
    q = paddle.reshape(paddle.nn.Linear(d, d)(x), [-1, s, 2, 4])
    k = paddle.reshape(paddle.nn.Linear(d, d)(x), [-1, s, 2, 4])
    v = paddle.reshape(paddle.nn.Linear(d, d)(x), [-1, s, 2, 4])
    att = paddle.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = paddle.nn.Linear(d, 2)(paddle.reshape(att, [-1, s, d]))
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(s, d)), [loss, out]


def _mlp(paddle):
    """A small MLP (the target of the twice / startup configs)."""
    x = _data(paddle, "x", [8])
    h = paddle.nn.functional.silu(paddle.nn.Linear(8, 16)(x))
    h2 = paddle.nn.functional.elu(paddle.nn.Linear(16, 16)(h))
    out = paddle.nn.Linear(16, 2)(h2 + h)
    loss = paddle.mean(out * out)
    _train(paddle, loss)
    return _normal(x=(8,)), [loss, out]


def _empty(paddle):
    """An empty program (nothing fetched)."""
    return (lambda rng: {}), []


def _feed_fetch_only(paddle):
    """A program whose only op feeds the value it fetches."""
    x = _data(paddle, "x", [8])
    return _normal(x=(8,)), [x]


PROGRAMS = {
    "setitem": _setitem,
    "setitem_grad_flow": _setitem_grad_flow,
    "setitem_fetched": _setitem_fetched,
    "assign_to_buffer": _assign_to_buffer,
    "setitem_in_cond": _setitem_in_cond,
    "setitem_advanced": _setitem_advanced,
    "alias_writes": _alias_writes,
    "self_alias": _self_alias,
    "view_outlives_base": _view_outlives_base,
    "counter_inplace": _counter_inplace,
    "scatter_writes": _scatter_writes,
    "inplace_writes": _inplace_writes,
    "views": _views,
    "fft_complex": _fft_complex,
    "dtypes": _dtypes,
    "linalg": _linalg,
    "einsum_unfold_grid": _einsum_unfold,
    "ctc_loss": _ctc,
    "sdpa": _sdpa,
    "mlp_twice": _mlp,
    "mlp_startup": _mlp,
    "empty": _empty,
    "feed_fetch_only": _feed_fetch_only,
}
#: memory_optimize applied twice to one program: the first call's kwargs, the second's
TWICE = [("L0>L1", dict(level=0), dict(level=1)), ("L1>L2", dict(level=1), dict(level=2)),
         ("L2>budget", dict(level=2), "smallest"), ("budget>L1", "smallest", dict(level=1))]


# -- running -----------------------------------------------------------------------

def build(paddle, name):
    """(main, startup, feed, fetch): a fresh build, names reset."""
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        feed, fetch = PROGRAMS[name](paddle)
    return main, startup, feed, fetch


def snapshot(paddle, program):
    """What must not change when memopt refuses: the program's text (PIR) or
    its serialized desc (legacy)."""
    return str(program) if _pir(paddle) else program.desc.serialize_to_string()


def persistable_names(paddle, main, startup):
    """Every persistable tensor one step keeps (parameters, optimizer state,
    learning rates)."""
    if _pir(paddle):
        from sweep_user_programs import persistable_names as pir_names
        return pir_names(main, startup)
    skip = (paddle.base.core.VarDesc.VarType.FEED_MINIBATCH,
            paddle.base.core.VarDesc.VarType.FETCH_LIST)
    return sorted({v.name for p in (main, startup) for v in p.list_vars()
                   if v.persistable and v.type not in skip})


def run(paddle, main, startup, feed, fetch, steps=STEPS):
    """3 steps in a fresh scope: ([fetches per step], {persistable: array})."""
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    outs = []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        for _ in range(steps):
            outs.append([np.array(a) for a in exe.run(main, feed=feed(rng), fetch_list=fetch)])
        params = {}
        for n in persistable_names(paddle, main, startup):
            var = scope.find_var(n)
            if var is not None and var.get_tensor()._is_initialized():
                params[n] = np.array(var.get_tensor())
    return outs, params


def _kwargs(memopt, config, main, fetch):
    """memory_optimize's kwargs for one config on ``main`` as it is now."""
    if config == "budget":
        peak = memopt.analyze(main, BATCH, fetch_list=fetch).total_peak(BATCH)
        return dict(budget=max(1, int(0.9 * peak)), batch_size=BATCH, fetch_list=fetch)
    if config == "smallest":  # what BudgetError names: the plan that recomputes the most
        try:
            memopt.memory_optimize(main, budget=1, batch_size=BATCH, fetch_list=fetch)
        except memopt.errors.BudgetError as e:
            return dict(budget=e.smallest_budget, batch_size=BATCH, fetch_list=fetch)
        return None  # budget=1 planned (the program is rewritten already)
    return dict(config, fetch_list=fetch)


def _holds_nothing(paddle, program):
    """Whether a step of ``program`` allocates nothing (no op, no variable)."""
    if _pir(paddle):
        return not list(program.global_block().ops)
    return not program.global_block().vars and not program.global_block().ops


CONFIGS = [("L0", [dict(level=0)]), ("L1", [dict(level=1)]), ("L2", [dict(level=2)]),
           ("budget0.9", ["budget"]), ("budget@smallest", ["smallest"])]


def configs_of(name):
    if name == "mlp_twice":
        return [(label, [a, b]) for label, a, b in TWICE]
    return CONFIGS


#: raised by memopt's own checks of its plan (memopt.verify) or its reading
#: of the program: a bug, not a refusal
CHECKER_ERRORS = ()


def check_config(paddle, memopt, name, calls, ref):
    """One cell: 'ok', 'refused: <message>', 'DIFFERS ...' or 'BUG ...'."""
    main, startup, feed, fetch = build(paddle, name)
    target = startup if name == "mlp_startup" else main
    fetch_arg = None if target is startup else fetch
    note = ""
    for k, kw in enumerate(calls):
        before = snapshot(paddle, target)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                kwargs = _kwargs(memopt, kw, target, fetch_arg)
                if kwargs is None:
                    if not _holds_nothing(paddle, target):
                        return "BUG budget=1 byte accepted: the step holds more"
                    note = "budget=1 plans: nothing to hold"
                    continue
                report = memopt.memory_optimize(target, **kwargs)
        except Exception as e:
            if _memopt_error(memopt, e) and not isinstance(e, CHECKER_ERRORS) and \
                    snapshot(paddle, target) == before:
                note = "refused: " + _one_line(e)
                if k == 0:
                    return note
                continue  # a second call refused cleanly: the first's program runs
            traceback.print_exc()
            changed = "program changed; " if snapshot(paddle, target) != before else ""
            return "BUG " + changed + _one_line(e)
        if getattr(report, "recomputed", None):
            note = f"{len(report.recomputed)} recomputed"
    try:
        got = run(paddle, main, startup, feed, fetch)
    except Exception as e:
        traceback.print_exc()
        return "BUG rewritten program fails: " + _one_line(e)
    if not same(ref, got):
        return "DIFFERS " + _difference(ref, got)
    return "ok" + (f" ({note})" if note else "")


def _difference(a, b):
    (oa, pa), (ob, pb) = a, b
    for step, (xs, ys) in enumerate(zip(oa, ob)):
        for i, (x, y) in enumerate(zip(xs, ys)):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return f"step {step} fetch {i}"
    bad = sorted(n for n in pa if n not in pb or pa[n].tobytes() != pb[n].tobytes())
    return "persistables " + ",".join(bad[:3]) if bad else "persistable names"


def check_one(name):
    import paddle
    import memopt
    import memopt.errors

    paddle.enable_static()
    global CHECKER_ERRORS
    CHECKER_ERRORS = (memopt.errors.PlanError, memopt.errors.GraphError)
    result = {"program": name, "cells": {}, "error": ""}
    try:
        ref = run(paddle, *build(paddle, name))
        if not same(ref, run(paddle, *build(paddle, name))):
            paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
            ref = run(paddle, *build(paddle, name))
            assert same(ref, run(paddle, *build(paddle, name))), "not deterministic"
    except Exception as e:
        traceback.print_exc()
        result["error"] = _one_line(e)
        return result
    for label, calls in configs_of(name):
        try:
            result["cells"][label] = check_config(paddle, memopt, name, calls, ref)
        except Exception as e:
            traceback.print_exc()
            result["cells"][label] = "BUG harness: " + _one_line(e)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, metavar="NAME")
    args = parser.parse_args()
    print(json.dumps(check_one(args.worker)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
