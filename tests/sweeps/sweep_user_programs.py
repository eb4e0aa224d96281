"""Sweep memory_optimize over PIR programs as a new user writes them.

Program kinds sweep_programs.py and the region/budget sweeps do not
build: gradients fetched without an optimizer, two losses with two
optimizers, Lamb/Adagrad/RMSProp/Adadelta/nesterov Momentum with LR
schedulers, clipping and L2 decay, Conv1D/Conv3D/Conv2DTranspose with
GroupNorm/InstanceNorm/PixelShuffle/interpolate, MaxPool masks + MaxUnPool,
MultiHeadAttention with weights and tied embeddings, dynamic shapes
(masked_select, nonzero, unique), float64 and int programs, stop_gradient /
detach / assign, a tensor array in a while loop, case/switch_case, and an
inference program from ``paddle.jit.save`` loaded back.

For each program and config (level 0, 1, 2; ``budget=`` 0.9 of
``memopt.analyze``'s predicted total peak at ``batch_size``; no
``fetch_list``; ``skip_opt_set`` of one activation; ``print_log=True``) a
fresh build is rewritten and run 3 steps in a fresh scope: fetches and
every persistable (all the startup program writes) must equal the
unchanged program's bit for bit, and (levels 0-2) every feed / parameter /
shadow-output name read from the scope after a step gives the same bytes
(Paddle 3.3.1's PIR executor fetches no name: a str in fetch_list needs a
``pd_op.fetch`` of that name in the program).  A budget of 1 byte must raise BudgetError
and leave ``str(program)`` as it was.  Workflows on the level-2 program:
``clone()``, ``static.save``/``load`` then 2 more steps,
``save_inference_model`` loaded in a new process.  A raise that is not a
memopt error (KeyError, AttributeError, ... from inside memopt) is a bug.

The cells are tests of ``test_sweep_user_programs.py`` (GC on and off);
each program runs in its own process (``--worker NAME`` prints one JSON
object).
"""
import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

from sweep_programs import _data_values, _load_and_run, _one_line, outcome_of, same

BATCH = 256
STEPS = 3


# -- programs ----------------------------------------------------------------------
# each builder returns (feed(rng) -> dict, fetch values, one activation for skip_opt_set)

def _x(paddle, n=16, name="x"):
    return paddle.static.data(name, [-1, n], "float32")


def _feed_x(n=16, name="x", extra=None):
    def feed(rng):
        out = {name: rng.standard_normal((BATCH, n)).astype("float32")}
        if extra:
            out.update(extra(rng))
        return out
    return feed


def _grads_only(paddle):
    """paddle.static.gradients without an optimizer; the grads fetched."""
    x = _x(paddle)
    x.stop_gradient = False
    l1, l2 = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 4)
    h = paddle.nn.functional.silu(l1(x))
    loss = paddle.mean(l2(h) ** 2)
    grads = paddle.static.gradients([loss], [x, l1.weight, l2.weight])
    return _feed_x(), [loss] + grads, h


def _two_optimizers(paddle):
    """Two losses on disjoint parameters, Adam and SGD."""
    x = _x(paddle)
    a, b = paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4)
    c = paddle.nn.Linear(16, 4)
    ha = paddle.tanh(a(x))
    loss1 = paddle.mean(b(ha) ** 2)
    hc = paddle.nn.functional.relu(c(x))
    loss2 = paddle.mean(hc)
    paddle.optimizer.Adam(1e-3, parameters=a.parameters() + b.parameters()).minimize(loss1)
    paddle.optimizer.SGD(0.1, parameters=c.parameters()).minimize(loss2)
    return _feed_x(), [loss1, loss2], ha


def _mlp_with(optimizer):
    def build(paddle):
        x = _x(paddle)
        h = paddle.nn.functional.gelu(paddle.nn.Linear(16, 32)(x))
        h2 = paddle.nn.functional.relu(paddle.nn.Linear(32, 32)(h))
        out = paddle.nn.Linear(32, 4)(h2)
        loss = paddle.mean(out * out)
        optimizer(paddle).minimize(loss)
        return _feed_x(), [loss, out], h
    return build


def _lamb(paddle):
    sched = paddle.optimizer.lr.LinearWarmup(1e-2, warmup_steps=2, start_lr=1e-3, end_lr=1e-2)
    return paddle.optimizer.Lamb(sched, grad_clip=paddle.nn.ClipGradByNorm(1.0))


def _adagrad(paddle):
    sched = paddle.optimizer.lr.PiecewiseDecay([1, 2], [0.1, 0.05, 0.01])
    # ClipGradByValue: Paddle 3.3.1's PIR _pir_clip raises NotImplementedError
    return paddle.optimizer.Adagrad(sched, weight_decay=paddle.regularizer.L2Decay(1e-3))


def _rmsprop(paddle):
    return paddle.optimizer.RMSProp(0.01, centered=True, momentum=0.5,
                                    weight_decay=paddle.regularizer.L2Decay(1e-3))


def _adadelta(paddle):
    sched = paddle.optimizer.lr.ExponentialDecay(1.0, gamma=0.9)
    return paddle.optimizer.Adadelta(sched, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))


def _nesterov(paddle):
    sched = paddle.optimizer.lr.NoamDecay(32, warmup_steps=2, learning_rate=1.0)
    return paddle.optimizer.Momentum(sched, momentum=0.9, use_nesterov=True,
                                     weight_decay=paddle.regularizer.L1Decay(1e-4))


def _ema(paddle):
    """Momentum + paddle.static.ExponentialMovingAverage.update()."""
    x = _x(paddle)
    h = paddle.tanh(paddle.nn.Linear(16, 16)(x))
    out = paddle.nn.Linear(16, 2)(h)
    loss = paddle.mean(out * out)
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)
    ema = paddle.static.ExponentialMovingAverage(0.9)
    ema.update()
    return _feed_x(), [loss, out], h


def _conv_mix(paddle):
    """Conv1D, Conv3D, Conv2DTranspose, GroupNorm, InstanceNorm, PixelShuffle,
    bilinear / nearest interpolate."""
    F = paddle.nn.functional
    x = paddle.static.data("img", [-1, 4, 8, 8], "float32")
    seq = paddle.static.data("seq", [-1, 3, 12], "float32")
    vol = paddle.static.data("vol", [-1, 2, 4, 6, 6], "float32")
    h = paddle.nn.GroupNorm(2, 8)(paddle.nn.Conv2D(4, 8, 3, padding=1)(x))
    h = F.relu(paddle.nn.InstanceNorm2D(8)(h))
    up = paddle.nn.PixelShuffle(2)(h)  # [B, 2, 16, 16]
    down = F.interpolate(up, size=[8, 8], mode="bilinear", align_corners=False)
    near = F.interpolate(down, scale_factor=2, mode="nearest")
    t = paddle.nn.Conv2DTranspose(2, 3, 3, stride=2, padding=1)(near)
    s = F.relu(paddle.nn.Conv1D(3, 5, 3)(seq))
    v = F.relu(paddle.nn.Conv3D(2, 3, 3)(vol))
    loss = paddle.mean(t * t) + paddle.mean(s) + paddle.mean(v * v)
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng):
        return {"img": rng.standard_normal((BATCH, 4, 8, 8)).astype("float32"),
                "seq": rng.standard_normal((BATCH, 3, 12)).astype("float32"),
                "vol": rng.standard_normal((BATCH, 2, 4, 6, 6)).astype("float32")}
    return feed, [loss, t], up


def _pool_unpool(paddle):
    """MaxPool2D(return_mask=True) then MaxUnPool2D with its indices."""
    x = paddle.static.data("img", [-1, 3, 8, 8], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 4, 3, padding=1)(x))
    pooled, mask = paddle.nn.functional.max_pool2d(h, 2, 2, return_mask=True)
    un = paddle.nn.functional.max_unpool2d(pooled * 2, mask, 2, 2)
    out = paddle.nn.Conv2D(4, 2, 1)(un)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.05).minimize(loss)

    def feed(rng):
        return {"img": rng.standard_normal((BATCH, 3, 8, 8)).astype("float32")}
    return feed, [loss, mask, out], h


def _mha_tied(paddle):
    """Embedding with padding_idx, MultiHeadAttention(need_weights=True), the
    output projection tied to the embedding table."""
    vocab, d, s = 30, 16, 5
    ids = paddle.static.data("ids", [-1, s], "int64")
    emb = paddle.nn.Embedding(vocab, d, padding_idx=0)
    e = emb(ids)
    attn, weights = paddle.nn.MultiHeadAttention(d, 2, need_weights=True)(e, e, e)
    h = paddle.nn.LayerNorm(d)(e + attn)
    logits = paddle.matmul(h, emb.weight, transpose_y=True)
    loss = paddle.nn.functional.cross_entropy(logits, ids.unsqueeze(-1))
    paddle.optimizer.AdamW(1e-3).minimize(loss)

    def feed(rng):
        v = rng.integers(0, vocab, (BATCH, s)).astype("int64")
        v[:, -1] = 0
        return {"ids": v}
    return feed, [loss, weights, logits], attn


def _dynamic_shapes(paddle):
    """masked_select, nonzero, unique, argsort, topk: shapes known only at run time."""
    x = _x(paddle)
    h = paddle.nn.Linear(16, 16)(x)
    sel = paddle.masked_select(h, h > 0)
    nz = paddle.nonzero(h > 0.5)
    uniq = paddle.unique(paddle.floor(h * 2))
    order = paddle.argsort(h, axis=1)
    top, _ = paddle.topk(h, 3)
    loss = paddle.mean(sel) + paddle.mean(top) + paddle.sum(uniq) * 0
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return _feed_x(), [loss, sel, nz, uniq, order], h


def _float64(paddle):
    """float64 parameters and activations (the default dtype float64)."""
    x = paddle.static.data("x", [-1, 16], "float64")
    paddle.set_default_dtype("float64")
    try:
        lin, lin2 = paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4)
    finally:
        paddle.set_default_dtype("float32")
    h = paddle.tanh(lin(x))
    out = lin2(h)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, 16)).astype("float64")}
    return feed, [loss, out], h


def _int_program(paddle):
    """Integer arithmetic only (no training): cumsum, mod, bitwise, compare."""
    a = paddle.static.data("a", [-1, 8], "int64")
    b = paddle.static.data("b", [-1, 8], "int32")
    c = paddle.cumsum(a, axis=1) % 7
    d = paddle.bitwise_and(c, paddle.full([1], 5, "int64"))
    e = paddle.cast(b, "int64") * d + c
    f = paddle.max(e, axis=1)
    g = (e > 3).astype("int32") + b
    return (lambda rng: {"a": rng.integers(-5, 9, (BATCH, 8)).astype("int64"),
                         "b": rng.integers(0, 4, (BATCH, 8)).astype("int32")}), [e, f, g], d


def _detach_assign(paddle):
    """stop_gradient parts, detach, paddle.assign into an existing Value."""
    x = _x(paddle)
    frozen = paddle.nn.Linear(16, 16)
    for p in frozen.parameters():
        p.stop_gradient = True
    h = paddle.nn.functional.relu(frozen(x))
    d = h.detach()
    g = paddle.nn.Linear(16, 16)(d)
    buf = paddle.zeros([1, 16], "float32")
    paddle.assign(g * 0.5, output=buf)
    h2 = paddle.tanh(buf + g)
    out = paddle.nn.Linear(16, 3)(h2)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return _feed_x(), [loss, buf, out], h


def _global_counter(paddle):
    """A persistable counter incremented every step (PIR's way: Paddle 3.3.1's
    paddle.static.create_global_var fails in PIR, "full: argument (position 3)
    must be one of paddle::DataType")."""
    x = _x(paddle)
    counter = paddle.pir.core.create_persistable_value(
        "int64", [1], "step_counter", initializer=paddle.nn.initializer.Constant(0))
    paddle.increment(counter, 1)
    h = paddle.tanh(paddle.nn.Linear(16, 16)(x))
    out = paddle.nn.Linear(16, 2)(h)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.05).minimize(loss)
    return _feed_x(), [loss, counter], h


def _tensor_array(paddle):
    """array_write / array_read inside a while_loop (forward only)."""
    x = _x(paddle)
    h = paddle.tanh(paddle.nn.Linear(16, 16)(x))
    arr = paddle.tensor.create_array("float32")
    i = paddle.full([1], 0, "int64")
    arr = paddle.tensor.array_write(h, i, array=arr)
    n = paddle.full([1], 3, "int64")

    def body(i, arr):
        prev = paddle.tensor.array_read(arr, i)
        arr = paddle.tensor.array_write(paddle.sin(prev) * 2, i + 1, array=arr)
        return i + 1, arr

    i, arr = paddle.static.nn.while_loop(lambda i, arr: i < n, body, [i, arr])
    last = paddle.tensor.array_read(arr, n)
    out = paddle.concat([last, paddle.tensor.array_read(arr, paddle.full([1], 1, "int64"))], 1)
    return _feed_x(), [out, paddle.tensor.array_length(arr)], h


def _case_switch(paddle):
    """static.nn.case and switch_case on computed predicates, trained."""
    x = _x(paddle)
    h = paddle.nn.Linear(16, 16)(x)
    m = paddle.mean(h)
    h2 = paddle.static.nn.case([(m > 10, lambda: h * 2), (m > -10, lambda: paddle.tanh(h))],
                               default=lambda: h - 1)
    idx = paddle.full([1], 2, "int32")
    h3 = paddle.static.nn.switch_case(idx, {1: lambda: paddle.sin(h2), 2: lambda: h2 * h2},
                                      default=lambda: h2)
    out = paddle.nn.Linear(16, 2)(h3)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return _feed_x(), [loss, out], h


def _auc_metric(paddle):
    """paddle.static.auc: persistable statistics updated in place each step."""
    x = _x(paddle)
    label = paddle.static.data("label", [-1, 1], "int64")
    h = paddle.nn.functional.relu(paddle.nn.Linear(16, 16)(x))
    prob = paddle.nn.functional.softmax(paddle.nn.Linear(16, 2)(h))
    auc, batch_auc, _states = paddle.static.auc(prob, label)
    loss = paddle.nn.functional.cross_entropy(prob, label, use_softmax=False)
    paddle.optimizer.SGD(0.1).minimize(loss)
    return _feed_x(extra=lambda rng: {"label": rng.integers(0, 2, (BATCH, 1)).astype("int64")}), \
        [loss, auc, batch_auc], h


def _inplace_user_ops(paddle):
    """The user's own in-place ops (relu_, Tensor.scale_, tanh_, add_) in a trained net."""
    x = _x(paddle)
    h = paddle.nn.Linear(16, 32)(x)
    h = paddle.nn.functional.relu_(h)
    h2 = paddle.nn.Linear(32, 32)(h)
    h2 = h2.scale_(0.5)
    h2 = paddle.tanh_(h2)
    h3 = paddle.nn.Linear(32, 32)(h2)
    h3 = h3.add_(h2)
    out = paddle.nn.Linear(32, 4)(h3)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return _feed_x(), [loss, out, h3], h


def _static_nn(paddle):
    """paddle.static.nn.fc, BatchNorm2D, F.embedding of a create_parameter
    table, a value fetched twice (paddle.static.nn.embedding and batch_norm
    fail in PIR: "The type of '%Ids' in operator lookup_table_v2 should be
    one of [str, bytes, Variable]")."""
    x = _x(paddle)
    ids = paddle.static.data("ids", [-1, 3], "int64")
    table = paddle.static.create_parameter([20, 8], "float32", name="emb_table")
    e = paddle.nn.functional.embedding(ids, table)
    # named: static.nn.fc's default names do not restart under unique_name.guard
    attr = paddle.ParamAttr
    h = paddle.static.nn.fc(x, 32, activation="relu", weight_attr=attr(name="fc1_w"),
                            bias_attr=attr(name="fc1_b"))
    h = paddle.nn.functional.relu(paddle.nn.BatchNorm2D(32)(paddle.reshape(h, [-1, 32, 1, 1])))
    h = paddle.concat([paddle.reshape(h, [-1, 32]), paddle.reshape(e, [-1, 24])], 1)
    out = paddle.static.nn.fc(h, 4, weight_attr=attr(name="fc2_w"), bias_attr=attr(name="fc2_b"))
    loss = paddle.mean(out * out)
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)
    return _feed_x(extra=lambda rng: {"ids": rng.integers(0, 20, (BATCH, 3)).astype("int64")}), \
        [loss, out, loss], h


def _rnn_cell(paddle):
    """paddle.nn.RNN over a GRUCell: in static mode a while loop, trained
    through (its trip count the sequence length, read at run time)."""
    s, d = 6, 16
    x = paddle.static.data("x", [-1, s, d], "float32")
    out, last = paddle.nn.RNN(paddle.nn.GRUCell(d, 24))(x)
    pred = paddle.nn.Linear(24, 1)(last)
    loss = paddle.mean(pred * pred) + paddle.mean(out)
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def feed(rng):
        return {"x": rng.standard_normal((BATCH, s, d)).astype("float32")}
    return feed, [loss, out], last


_JIT_DIR = tempfile.mkdtemp(prefix="memopt_jit_")


def _jit_inference(paddle):
    """paddle.jit.to_static + jit.save in dygraph, then
    paddle.static.load_inference_model: an inference program from .json."""
    prefix = os.path.join(_JIT_DIR, "net")
    if not os.path.exists(prefix + ".pdiparams"):
        paddle.disable_static()
        paddle.seed(7)
        net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.BatchNorm2D(8),
                                   paddle.nn.ReLU(), paddle.nn.Flatten(),
                                   paddle.nn.Linear(8 * 6 * 6, 5), paddle.nn.Softmax())
        net.eval()
        spec = [paddle.static.InputSpec([None, 3, 8, 8], "float32", "img")]
        paddle.jit.save(paddle.jit.to_static(net, input_spec=spec), prefix)
        paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)

    def feed(rng):
        return {feeds[0]: rng.standard_normal((BATCH, 3, 8, 8)).astype("float32")}
    return feed, list(fetches), None, prog


PROGRAMS = {
    "grads_only": _grads_only,
    "two_optimizers": _two_optimizers,
    "lamb_warmup_clipnorm": _mlp_with(_lamb),
    "adagrad_piecewise_clipvalue_l2": _mlp_with(_adagrad),
    "rmsprop_centered_l2": _mlp_with(_rmsprop),
    "adadelta_expdecay_globalnorm": _mlp_with(_adadelta),
    "momentum_nesterov_noam_l1": _mlp_with(_nesterov),
    "ema": _ema,
    "conv_mix": _conv_mix,
    "pool_unpool": _pool_unpool,
    "mha_tied_padding_idx": _mha_tied,
    "dynamic_shapes": _dynamic_shapes,
    "float64": _float64,
    "int_program": _int_program,
    "detach_assign": _detach_assign,
    "global_counter": _global_counter,
    "tensor_array_while": _tensor_array,
    "case_switch": _case_switch,
    "jit_inference": _jit_inference,
    "auc_metric": _auc_metric,
    "inplace_user_ops": _inplace_user_ops,
    "static_nn_fc_bn_embedding": _static_nn,
    "rnn_gru_cell_while": _rnn_cell,
}
FORWARD_ONLY = {"int_program", "tensor_array_while", "jit_inference"}
# paddle.static.save aborts on these unchanged (pir::WriteModule: "Destroyed a
# op_result that is still in use by ... cf.tuple_pop")
PADDLE_CANNOT_SAVE = {"case_switch", "rnn_gru_cell_while"}
# the fetch save_inference_model takes (default: the last)
INFERENCE_OUT = {"conv_mix": 0, "global_counter": 0}


# -- running -----------------------------------------------------------------------

def build(paddle, name):
    """(main, startup, feed, fetch, activation): a fresh build, names reset."""
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        got = PROGRAMS[name](paddle)
    if len(got) == 4:  # a loaded program: no startup
        feed, fetch, act, main = got
        return main, None, feed, fetch, act
    feed, fetch, act = got
    return main, startup, feed, fetch, act


def persistable_names(main, startup):
    """Every persistable the step keeps: what the startup program writes, or
    for a loaded program its parameters."""
    names = set()
    if startup is not None:
        for op in startup.global_block().ops:
            if op.name() == "builtin.set_parameter":
                names.add(op.attrs()["parameter_name"])
            elif op.name() == "builtin.shadow_output":
                names.add(op.attrs()["output_name"])
    for op in main.global_block().ops:
        if op.name() == "builtin.parameter":
            names.add(op.attrs()["parameter_name"])
    return sorted(names)


def visible_names(main):
    """The names a user can fetch by name: feeds, parameters, shadow outputs."""
    names = []
    for op in main.global_block().ops:
        if op.name() == "pd_op.data":
            names.append(op.attrs()["name"])
        elif op.name() == "builtin.parameter":
            names.append(op.attrs()["parameter_name"])
        elif op.name() == "builtin.shadow_output":
            names.append(op.attrs()["output_name"])
    return names


def run(paddle, main, startup, feed, fetch, steps=STEPS, scope=None, init=True, rng_seed=0,
        loaded_scope=None):
    scope = scope or loaded_scope or paddle.static.Scope()
    rng = np.random.default_rng(rng_seed)
    outs = []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1 + rng_seed)
        if init and startup is not None:
            exe.run(startup)
        for _ in range(steps):
            outs.append([np.array(a) for a in exe.run(main, feed=feed(rng), fetch_list=fetch)])
        params = {}
        for n in persistable_names(main, startup):
            var = scope.find_var(n)
            if var is not None and var.get_tensor()._is_initialized():
                params[n] = np.array(var.get_tensor())
    return outs, params, scope


def _jit_scope(paddle, name):
    """A loaded program's parameters live in the scope load_inference_model
    filled (the global scope): build it in a fresh scope and return both."""
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        got = build(paddle, name)
    return got, scope


def _fresh(paddle, name):
    if name == "jit_inference":
        got, scope = _jit_scope(paddle, name)
        return got + (scope,)
    return build(paddle, name) + (None,)


def _run_built(paddle, built, **kw):
    main, startup, feed, fetch, _act, scope = built
    return run(paddle, main, startup, feed, fetch, loaded_scope=scope, **kw)


def _by_name(paddle, built, names):
    """Each name's tensor in the scope after one step of ``built``: {name:
    bytes, or None where the scope holds none}.  (PIR fetches no name: a
    str in fetch_list needs a pd_op.fetch of that name in the program.)"""
    main, startup, feed, fetch, _act, scope = built
    scope = scope or paddle.static.Scope()
    got = {}
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        if startup is not None:
            exe.run(startup)
        exe.run(main, feed=feed(np.random.default_rng(0)), fetch_list=fetch)
        for n in names:
            var = scope.find_var(n)
            ok = var is not None and var.get_tensor()._is_initialized()
            got[n] = np.array(var.get_tensor()).tobytes() if ok else None
    return got


CONFIGS = [("L0", dict(level=0)), ("L1", dict(level=1)), ("L2", dict(level=2)),
           ("budget0.9", None), ("budget@smallest", None), ("L1 nofetch", dict(level=1)),
           ("L1 skip", dict(level=1)), ("L2 log", dict(level=2, print_log=True))]


def _config_kwargs(paddle, memopt, label, kw, main, fetch, act):
    if label == "budget0.9":
        peak = memopt.analyze(main, BATCH, fetch_list=fetch).total_peak(BATCH)
        return dict(budget=int(0.9 * peak), batch_size=BATCH, fetch_list=fetch)
    if label == "budget@smallest":  # what BudgetError says fits: recomputes the most
        try:
            memopt.memory_optimize(main, budget=1, batch_size=BATCH, fetch_list=fetch)
        except memopt.errors.BudgetError as e:
            return dict(budget=e.smallest_budget, batch_size=BATCH, fetch_list=fetch)
        raise AssertionError("budget=1 planned")
    kw = dict(kw)
    if label == "L1 nofetch":
        return kw
    if label == "L1 skip":
        if act is None:
            return None
        kw["skip_opt_set"] = {act}
    kw["fetch_list"] = fetch
    return kw


def _memopt_error(memopt, e):
    """A clean refusal: one of memopt's errors, or a TypeError / ValueError
    memopt itself raised (its innermost frame in memopt/) -- not a KeyError
    or AttributeError from deep inside, nor Paddle's error passed through."""
    if isinstance(e, (KeyError, IndexError, AttributeError, AssertionError)) and \
            not isinstance(e, memopt.errors.MemoptError):
        return False
    if isinstance(e, memopt.errors.MemoptError):
        return True
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    return isinstance(e, (TypeError, ValueError)) and \
        os.sep + "memopt" + os.sep in where


def check_one(name):
    import paddle
    import memopt

    paddle.enable_static()
    result = {"model": name, "rows": {}, "workflows": "", "error": "", "note": ""}
    try:
        ref = _run_built(paddle, _fresh(paddle, name))
        again = _run_built(paddle, _fresh(paddle, name))
        if not same(ref[:2], again[:2]):
            paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
            result["note"] = "sequential executor"
            ref = _run_built(paddle, _fresh(paddle, name))
    except Exception as e:
        traceback.print_exc()
        result["error"] = "paddle: " + _one_line(e)
        return result
    ref_built = _fresh(paddle, name)
    ref_names = _by_name(paddle, ref_built, visible_names(ref_built[0]))
    for label, kw in CONFIGS:
        t = time.perf_counter()
        row = {"time": 0.0}
        try:
            built = _fresh(paddle, name)
            main, startup, feed, fetch, act, _scope = built
            before = str(main)
            log = io.StringIO()
            try:
                kwargs = _config_kwargs(paddle, memopt, label, kw, main, fetch, act)
                if kwargs is None:
                    continue
                with contextlib.redirect_stdout(log):
                    report = memopt.memory_optimize(main, **kwargs)
            except Exception as e:
                if _memopt_error(memopt, e) and str(main) == before:
                    row.update(ok=True, refusal=_one_line(e))
                else:
                    traceback.print_exc()
                    row.update(ok=False, error=("program changed: " if str(main) != before
                                                else "") + _one_line(e))
                result["rows"][label] = row
                continue
            if kwargs.get("print_log") and not log.getvalue().strip():
                raise AssertionError("print_log=True printed nothing")
            if label == "L1 nofetch":
                try:
                    got = _run_built(paddle, built)
                except memopt.errors.MergedVariableError as e:  # a fetch refused by name
                    row.update(ok=True, refusal=_one_line(e), merged=report.merged_count)
                    result["rows"][label] = row
                    continue
            else:
                got = _run_built(paddle, built)
            ok = same(ref[:2], got[:2])
            why = "" if ok else "differs from the unchanged program"
            if ok and label in ("L0", "L1", "L2"):
                names = _by_name(paddle, _rewritten(paddle, memopt, name, level=kw["level"]),
                                 visible_names(ref_built[0]))
                bad = [n for n in ref_names if names.get(n) != ref_names[n]]
                if bad:
                    ok, why = False, "scope tensor by name differs: " + ",".join(bad[:4])
            row.update(ok=ok, merged=report.merged_count, error=why)
            if label.startswith("budget"):
                row["recomputed"] = len(report.recomputed or [])
        except Exception as e:
            traceback.print_exc()
            row.update(ok=False, error=_one_line(e))
        row["time"] = time.perf_counter() - t
        result["rows"][label] = row
    result["budget_error"] = outcome_of(lambda: _budget_error(paddle, memopt, name))
    result["workflows"] = outcome_of(lambda: workflows(paddle, memopt, name, ref))
    return result


def _rewritten(paddle, memopt, name, **kw):
    built = _fresh(paddle, name)
    memopt.memory_optimize(built[0], fetch_list=built[3], **kw)
    return built


def _budget_error(paddle, memopt, name):
    """budget=1 byte: BudgetError, program byte-identical."""
    built = _fresh(paddle, name)
    main, fetch = built[0], built[3]
    before = str(main)
    try:
        memopt.memory_optimize(main, budget=1, batch_size=BATCH, fetch_list=fetch)
    except memopt.errors.BudgetError as e:
        if str(main) != before:
            return "FAIL program changed by BudgetError"
        return f"ok (smallest {e.smallest_budget})"
    except Exception as e:
        if _memopt_error(memopt, e) and str(main) == before:
            return "ok refusal: " + _one_line(e)
        raise
    return "FAIL no BudgetError for budget=1"


def workflows(paddle, memopt, name, ref):
    done = []
    b0, b1 = _fresh(paddle, name), _rewritten(paddle, memopt, name, level=2)
    m0, m1 = paddle.pir.IrMapping(), paddle.pir.IrMapping()
    c0, c1 = b0[0].clone(m0), b1[0].clone(m1)
    a = run(paddle, c0, b0[1], b0[2], [m0.look_up(v) for v in b0[3]], loaded_scope=b0[5])
    b = run(paddle, c1, b1[1], b1[2], [m1.look_up(v) for v in b1[3]], loaded_scope=b1[5])
    assert same(a[:2], b[:2]), "clone() of the rewritten program differs"
    done.append("clone")
    if name == "jit_inference":
        return "ok (" + ", ".join(done) + "; loaded program: no save/load)"
    if name in PADDLE_CANNOT_SAVE:
        return "ok (" + ", ".join(done) + "; paddle cannot static.save it unchanged)"
    with tempfile.TemporaryDirectory() as tmp:
        b0 = _fresh(paddle, name)
        a = _run_built(paddle, b0, steps=2)
        a2 = _run_built(paddle, b0, steps=2, scope=a[2], init=False, rng_seed=5)
        b1 = _rewritten(paddle, memopt, name, level=2)
        main1, startup1, feed1, fetch1 = b1[:4]
        b = _run_built(paddle, b1, steps=2)
        with paddle.static.scope_guard(b[2]):
            paddle.static.save(main1, os.path.join(tmp, "m"))
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            paddle.static.Executor(paddle.CPUPlace()).run(startup1)
            paddle.static.load(main1, os.path.join(tmp, "m"))
        b2 = _run_built(paddle, b1, steps=2, scope=scope, init=False, rng_seed=5)
        assert same(a2[:2], b2[:2]), "training after static.save/load differs"
        done.append("save/load")
        k = INFERENCE_OUT.get(name, -1)
        outs1 = [fetch1[k]] if name not in FORWARD_ONLY else list(fetch1)
        outs0 = [b0[3][k]] if name not in FORWARD_ONLY else list(b0[3])
        feeds1, feeds0 = _data_values(main1), _data_values(b0[0])
        np.savez(os.path.join(tmp, "feed.npz"), **feed1(np.random.default_rng(3)))
        with paddle.static.scope_guard(scope):
            paddle.static.save_inference_model(os.path.join(tmp, "inf1"), feeds1, outs1,
                                               paddle.static.Executor(paddle.CPUPlace()),
                                               program=main1)
        with paddle.static.scope_guard(a[2]):
            paddle.static.save_inference_model(os.path.join(tmp, "inf0"), feeds0, outs0,
                                               paddle.static.Executor(paddle.CPUPlace()),
                                               program=b0[0])
        r0 = _load_and_run(os.path.join(tmp, "inf0"), tmp)
        r1 = _load_and_run(os.path.join(tmp, "inf1"), tmp)
        assert len(r0) == len(r1) and all(x.tobytes() == y.tobytes() for x, y in zip(r0, r1, strict=True)), \
            "the loaded inference model differs"
        done.append("inference")
    return "ok (" + ", ".join(done) + ")"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, metavar="NAME")
    args = parser.parse_args()
    print(json.dumps(check_one(args.worker)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
