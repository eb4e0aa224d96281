"""Sweep memory_optimize over the optimizer / regularizer / clipping /
LR-schedule zoo a Paddle user trains with.

The other training sweeps (sweep_training_setups.py: AMP, gradient
penalty, GAN, edited gradients, py_func, QAT, ...) train with one
optimizer; this one keeps the network small (an MLP with dropout, or a
2-conv CNN with BatchNorm and dropout) and varies what updates it:

- every optimizer Paddle 3.3.1 has in static mode, once with its defaults
  (SGD, Momentum with Nesterov, Adam with amsgrad, AdamW with
  apply_decay_param_fun, Adamax, Adagrad, RMSProp centered, Adadelta, Lamb
  with exclude_from_weight_decay_fn, NAdam, RAdam, ASGD, Rprop, LBFGS);
- regularizers (L1Decay, L2Decay, a per-parameter ParamAttr regularizer),
  clipping (ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue), LR
  schedulers stepped between runs (StepDecay, CosineAnnealingDecay,
  LinearWarmup, ReduceOnPlateau fed the loss, PiecewiseDecay),
  multi_precision=True, ExponentialMovingAverage (update, then an eval
  clone run under apply / restore), LookAhead, ModelAverage (apply /
  restore), GradientMergeOptimizer, a weight used twice, frozen layers
  (trainable=False, stop_gradient), minimize(parameters=subset);
- a handful of combined configs (AdamW + global-norm clip + warmup + EMA,
  ...).

Each program x config (level 0, 1, 2, levels 1 and 2 with
``skip_grads=False``, ``budget=`` 0.9 of
``memopt.analyze(main, fetch_list=...).total_peak(batch)``, ``budget=`` the
smallest budget a BudgetError at 1 byte names and 1.2x it; level 2 and the
smallest budget applied after the first step, on a program the executor
has already run; level 1 and the smallest budget without ``fetch_list``,
the run still fetching), print_log on, is built fresh, rewritten,
trained 3 steps in a fresh scope (the last a partial batch of 16 rows): every fetch, every after-training array
(EMA / ModelAverage eval) and every persistable (parameters, moments, beta
pows, LR variables, EMA shadows, step counters) must equal the unchanged
program's bit for bit (same dtype); an error must be memopt's and leave the
program as it was.

The cells are tests of ``test_sweep_optimizers.py``: program x IR (PIR,
Paddle's default; legacy, ``FLAGS_enable_pir_api=0`` before Paddle is
imported) x GC (on, the default; off, ``FLAGS_eager_delete_tensor_gb=-1``)
x config -> ok / refused (message) / paddle fails unchanged / DIFFERS /
BUG; one fresh process per program, IR and GC (``--worker NAMES`` prints
one JSON object, ``{program: cells}``).
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
from sweep_programs import _one_line  # noqa: E402
# (_matmul: x @ y, legacy matmul_v2 appended by hand; Paddle 3.3.1's paddle.matmul
# takes PIR Values only)
from sweep_training_setups import (_matmul, _pir, _text_of,  # noqa: E402
                                   persistable_names, same)
from sweep_user_programs import _memopt_error  # noqa: E402

BATCH = 64
STEPS = 3


def _rows(step):
    """The batch fed at ``step``: BATCH, the last step a quarter of it (an
    epoch's partial last batch; memopt plans at BATCH)."""
    return BATCH if step < STEPS - 1 else BATCH // 4


class Spec:
    """One trained program: ``main`` fed ``feed(rng, step)`` fetching
    ``fetch``; ``between(step, fetched)`` (optional) what the user runs after
    each step (``scheduler.step()``); ``after(exe)`` (optional) arrays an
    evaluation after the steps returns (EMA's apply / restore)."""

    def __init__(self, main, feed, fetch, between=None, after=None):
        self.main, self.feed, self.fetch = main, feed, fetch
        self.between, self.after = between, after


# -- networks ------------------------------------------------------------------------

def _mlp(paddle, weight_attr=None):
    """x -> Linear 16x128 (``weight_attr``) -> relu -> Linear 128x128 -> relu
    -> dropout 0.2 -> Linear 128x4: mean square.  Returns ``(loss, out, feed)``."""
    x = paddle.static.data("x", [-1, 16], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Linear(16, 128, weight_attr=weight_attr)(x))
    h = paddle.nn.functional.relu(paddle.nn.Linear(128, 128)(h))
    h = paddle.nn.functional.dropout(h, 0.2)
    out = paddle.nn.Linear(128, 4)(h)
    loss = paddle.mean(out * out)

    def feed(rng, step):
        return {"x": rng.standard_normal((_rows(step), 16)).astype("float32")}
    return loss, out, feed


def _cnn(paddle):
    """img 2x8x8 -> conv 8 BN relu -> conv 8 BN relu -> dropout -> Linear:
    softmax cross entropy.  Returns ``(loss, logits, feed)``."""
    img = paddle.static.data("img", [-1, 2, 8, 8], "float32")
    label = paddle.static.data("label", [-1, 1], "int64")
    h = img
    for cin, cout in ((2, 8), (8, 8)):
        h = paddle.nn.Conv2D(cin, cout, 3, padding=1)(h)
        h = paddle.nn.functional.relu(paddle.nn.BatchNorm2D(cout)(h))
    h = paddle.nn.functional.dropout(paddle.flatten(h, 1), 0.2)
    logits = paddle.nn.Linear(8 * 8 * 8, 3)(h)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))

    def feed(rng, step):
        return {"img": rng.standard_normal((_rows(step), 2, 8, 8)).astype("float32"),
                "label": rng.integers(0, 3, (_rows(step), 1)).astype("int64")}
    return loss, logits, feed


def _opt_program(net, make_opt):
    """A builder: ``net`` trained by ``make_opt(paddle)``'s minimize."""
    def build(paddle):
        loss, out, feed = net(paddle)
        make_opt(paddle).minimize(loss)
        return Spec(paddle.static.default_main_program(), feed, [loss, out])
    return build


def _optimizers():
    """Each optimizer once with defaults (the options a user turns on)."""
    def decay_weights(name):
        return "w_" in name  # weights, not biases

    def no_bias(param):
        return param.name.endswith(".b_0") or "b_" in param.name

    opt = {
        "sgd": lambda p: p.optimizer.SGD(0.05),
        "momentum_nesterov": lambda p: p.optimizer.Momentum(0.05, 0.9, use_nesterov=True),
        "adam": lambda p: p.optimizer.Adam(1e-2),
        "adam_amsgrad": lambda p: p.optimizer.Adam(1e-2, amsgrad=True),
        "adamw_decay_fun": lambda p: p.optimizer.AdamW(
            1e-2, weight_decay=0.1, apply_decay_param_fun=decay_weights),
        "adamax": lambda p: p.optimizer.Adamax(1e-2),
        "adagrad": lambda p: p.optimizer.Adagrad(1e-2),
        "rmsprop_centered": lambda p: p.optimizer.RMSProp(1e-2, centered=True, momentum=0.5),
        "adadelta": lambda p: p.optimizer.Adadelta(1.0),
        "lamb_exclude": lambda p: p.optimizer.Lamb(
            1e-2, lamb_weight_decay=0.05, exclude_from_weight_decay_fn=no_bias),
        "nadam": lambda p: p.optimizer.NAdam(1e-2),
        "radam": lambda p: p.optimizer.RAdam(1e-2),
        "asgd": lambda p: p.optimizer.ASGD(1e-2, batch_num=2),
        "rprop": lambda p: p.optimizer.Rprop(1e-2),
        "lbfgs": lambda p: p.optimizer.LBFGS(1e-2),
    }
    return {name: _opt_program(_mlp, make) for name, make in opt.items()}


def _regularized(paddle):
    """MLP, Momentum with L2Decay; the first weight its own L1Decay (a
    ParamAttr regularizer wins over the optimizer's)."""
    loss, out, feed = _mlp(paddle, weight_attr=paddle.ParamAttr(
        regularizer=paddle.regularizer.L1Decay(1e-3)))
    paddle.optimizer.Momentum(0.05, 0.9, weight_decay=paddle.regularizer.L2Decay(1e-3)) \
        .minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _clip(kind):
    def build(paddle):
        loss, out, feed = _cnn(paddle)
        clip = {"global_norm": lambda: paddle.nn.ClipGradByGlobalNorm(0.5),
                "norm": lambda: paddle.nn.ClipGradByNorm(0.1),
                "value": lambda: paddle.nn.ClipGradByValue(0.01)}[kind]()
        paddle.optimizer.SGD(0.1, grad_clip=clip).minimize(loss)
        return Spec(paddle.static.default_main_program(), feed, [loss, out])
    return build


def _scheduled(kind):
    """MLP, Adam on an LR scheduler the user steps between runs."""
    def build(paddle):
        lr = paddle.optimizer.lr
        sched = {
            "step_decay": lambda: lr.StepDecay(0.05, step_size=1, gamma=0.5),
            "cosine": lambda: lr.CosineAnnealingDecay(0.05, T_max=2),
            "warmup": lambda: lr.LinearWarmup(0.05, warmup_steps=2, start_lr=0.0, end_lr=0.05),
            "plateau": lambda: lr.ReduceOnPlateau(0.05, patience=0, factor=0.5),
            "piecewise": lambda: lr.PiecewiseDecay([1, 2], [0.05, 0.02, 0.01]),
        }[kind]()
        loss, out, feed = _mlp(paddle)
        paddle.optimizer.Adam(sched).minimize(loss)

        def between(step, fetched):
            if kind == "plateau":
                sched.step(float(fetched[0]))
            else:
                sched.step()
        return Spec(paddle.static.default_main_program(), feed, [loss, out], between)
    return build


def _multi_precision(paddle):
    """CNN, Adam with multi_precision=True on float32 parameters (no master
    weights on CPU)."""
    loss, out, feed = _cnn(paddle)
    paddle.optimizer.Adam(1e-2, multi_precision=True).minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _eval_clone(paddle, main, pred):
    """``(program, fetch)``: the program's eval clone and ``pred`` in it
    (legacy: ``clone(for_test=True)``; a PIR Program's clone takes only an
    IrMapping, its dropout stays in training mode, seeded the same in every
    run)."""
    if not _pir(paddle):
        return main.clone(for_test=True), pred.name
    mapping = paddle.pir.IrMapping()
    test = main.clone(mapping)
    return test, mapping.look_up(pred)


def _ema_eval(paddle, main, feed, pred, ema):
    """after(exe): the eval clone's prediction under ema.apply, then the
    same after restore."""
    test, pred = _eval_clone(paddle, main, pred)

    def after(exe):
        f = feed(np.random.default_rng(5), 0)
        with ema.apply(exe):
            got = exe.run(test, feed=f, fetch_list=[pred])
        return [np.array(a) for a in got + exe.run(test, feed=f, fetch_list=[pred])]
    return after


def _ema(paddle):
    """CNN, Momentum; ExponentialMovingAverage.update after minimize; the eval
    clone run with the averages applied, then restored."""
    loss, out, feed = _cnn(paddle)
    paddle.optimizer.Momentum(0.05, 0.9).minimize(loss)
    ema = paddle.static.ExponentialMovingAverage(0.9)
    ema.update()
    main = paddle.static.default_main_program()
    return Spec(main, feed, [loss, out], after=_ema_eval(paddle, main, feed, out, ema))


def _lookahead(paddle):
    """MLP, LookAhead(Adam, k=2)."""
    loss, out, feed = _mlp(paddle)
    paddle.incubate.optimizer.LookAhead(paddle.optimizer.Adam(1e-2), alpha=0.5, k=2) \
        .minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _model_average(paddle):
    """CNN, Momentum then ModelAverage.minimize; the eval clone run with the
    averages applied, then restored."""
    loss, out, feed = _cnn(paddle)
    main = paddle.static.default_main_program()
    test, pred = _eval_clone(paddle, main, out)
    paddle.optimizer.Momentum(0.05, 0.9).minimize(loss)
    avg = paddle.incubate.optimizer.ModelAverage(0.15, min_average_window=2,
                                                  max_average_window=4)
    avg.minimize(loss)

    def after(exe):
        f = feed(np.random.default_rng(5), 0)
        with avg.apply(exe):
            got = exe.run(test, feed=f, fetch_list=[pred])
        return [np.array(a) for a in got + exe.run(test, feed=f, fetch_list=[pred])]
    return Spec(main, feed, [loss, out], after=after)


def _gradient_merge(paddle):
    """MLP, GradientMergeOptimizer(SGD, k_steps=2, avg=True)."""
    loss, out, feed = _mlp(paddle)
    paddle.incubate.optimizer.GradientMergeOptimizer(
        paddle.optimizer.SGD(0.1), k_steps=2, avg=True).minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _shared_weight(paddle):
    """One parameter used twice (x @ w, then relu(.) @ w), Adam."""
    x = paddle.static.data("x", [-1, 16], "float32")
    w = paddle.static.create_parameter([16, 16], "float32", name="shared_w")
    h = paddle.nn.functional.relu(_matmul(paddle, x, w))
    h = paddle.nn.functional.dropout(h, 0.2)
    out = _matmul(paddle, h, w)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-2).minimize(loss)

    def feed(rng, step):
        return {"x": rng.standard_normal((_rows(step), 16)).astype("float32")}
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _param_groups(paddle):
    """MLP, Momentum over two parameter groups (the first its own learning
    rate and L2 decay)."""
    x = paddle.static.data("x", [-1, 16], "float32")
    first, last = paddle.nn.Linear(16, 128), paddle.nn.Linear(128, 4)
    out = last(paddle.nn.functional.dropout(paddle.nn.functional.relu(first(x)), 0.2))
    loss = paddle.mean(out * out)
    paddle.optimizer.Momentum(0.05, 0.9, parameters=[
        {"params": first.parameters(), "learning_rate": 0.5, "weight_decay": 0.01},
        {"params": last.parameters()}]).minimize(loss)

    def feed(rng, step):
        return {"x": rng.standard_normal((_rows(step), 16)).astype("float32")}
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _param_attr_lr_fetch_grads(paddle):
    """MLP whose first weight has ParamAttr(learning_rate=0.5, need_clip=False),
    Adam + ClipGradByNorm; the user fetches the gradients minimize returns
    and the optimizer's learning-rate variable."""
    loss, out, feed = _mlp(paddle, weight_attr=paddle.ParamAttr(learning_rate=0.5,
                                                                need_clip=False))
    opt = paddle.optimizer.Adam(1e-2, grad_clip=paddle.nn.ClipGradByNorm(0.5))
    _, params_grads = opt.minimize(loss)
    grads = [g for _, g in params_grads]
    return Spec(paddle.static.default_main_program(), feed,
                [loss, out, opt._global_learning_rate()] + grads)


def _lars(paddle):
    """CNN, LarsMomentumOptimizer."""
    loss, out, feed = _cnn(paddle)
    paddle.incubate.optimizer.LarsMomentumOptimizer(0.05, 0.9, lars_weight_decay=5e-4) \
        .minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _frozen(paddle):
    """MLP: a frozen first layer (ParamAttr trainable=False), a
    stop_gradient bias, minimize(parameters=) a subset."""
    x = paddle.static.data("x", [-1, 16], "float32")
    frozen = paddle.nn.Linear(16, 32, weight_attr=paddle.ParamAttr(trainable=False),
                              bias_attr=paddle.ParamAttr(trainable=False))
    mid = paddle.nn.Linear(32, 32)
    mid.bias.stop_gradient = True
    last = paddle.nn.Linear(32, 4)
    h = paddle.nn.functional.relu(frozen(x))
    h = paddle.nn.functional.relu(mid(h))
    out = last(paddle.nn.functional.dropout(h, 0.2))
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-2, parameters=[mid.weight] + last.parameters()).minimize(loss)

    def feed(rng, step):
        return {"x": rng.standard_normal((_rows(step), 16)).astype("float32")}
    return Spec(paddle.static.default_main_program(), feed, [loss, out])


def _adamw_clip_warmup_ema(paddle):
    """CNN, AdamW + ClipGradByGlobalNorm + LinearWarmup(Cosine) + EMA."""
    lr = paddle.optimizer.lr
    sched = lr.LinearWarmup(lr.CosineAnnealingDecay(0.05, T_max=3), warmup_steps=2,
                            start_lr=0.0, end_lr=0.05)
    loss, out, feed = _cnn(paddle)
    paddle.optimizer.AdamW(sched, weight_decay=0.01,
                           grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)).minimize(loss)
    ema = paddle.static.ExponentialMovingAverage(0.9)
    ema.update()
    main = paddle.static.default_main_program()
    return Spec(main, feed, [loss, out], between=lambda step, fetched: sched.step(),
                after=_ema_eval(paddle, main, feed, out, ema))


def _momentum_l2_clip_step(paddle):
    """CNN, Momentum(nesterov, L2Decay, multi_precision) + ClipGradByNorm + StepDecay."""
    sched = paddle.optimizer.lr.StepDecay(0.05, step_size=1, gamma=0.5)
    loss, out, feed = _cnn(paddle)
    paddle.optimizer.Momentum(sched, 0.9, use_nesterov=True, multi_precision=True,
                              weight_decay=paddle.regularizer.L2Decay(1e-3),
                              grad_clip=paddle.nn.ClipGradByNorm(0.5)).minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out],
                between=lambda step, fetched: sched.step())


def _lamb_plateau_value_clip(paddle):
    """MLP, Lamb + ClipGradByValue + ReduceOnPlateau + L1 ParamAttr regularizer."""
    sched = paddle.optimizer.lr.ReduceOnPlateau(0.05, patience=0, factor=0.5)
    loss, out, feed = _mlp(paddle, weight_attr=paddle.ParamAttr(
        regularizer=paddle.regularizer.L1Decay(1e-3)))
    paddle.optimizer.Lamb(sched, grad_clip=paddle.nn.ClipGradByValue(0.05)).minimize(loss)
    return Spec(paddle.static.default_main_program(), feed, [loss, out],
                between=lambda step, fetched: sched.step(float(fetched[0])))


def _merge_lookahead_frozen(paddle):
    """MLP with a frozen layer, LookAhead(RMSProp) on a piecewise LR."""
    sched = paddle.optimizer.lr.PiecewiseDecay([1, 2], [0.05, 0.02, 0.01])
    x = paddle.static.data("x", [-1, 16], "float32")
    frozen = paddle.nn.Linear(16, 16, weight_attr=paddle.ParamAttr(trainable=False))
    h = paddle.nn.functional.relu(frozen(x))
    out = paddle.nn.Linear(16, 4)(paddle.nn.functional.dropout(h, 0.2))
    loss = paddle.mean(out * out)
    paddle.incubate.optimizer.LookAhead(paddle.optimizer.RMSProp(sched), alpha=0.5, k=2) \
        .minimize(loss)

    def feed(rng, step):
        return {"x": rng.standard_normal((_rows(step), 16)).astype("float32")}
    return Spec(paddle.static.default_main_program(), feed, [loss, out],
                between=lambda step, fetched: sched.step())


PROGRAMS = dict(_optimizers())
PROGRAMS.update({
    "regularizers_l1_l2": _regularized,
    "clip_global_norm": _clip("global_norm"),
    "clip_norm": _clip("norm"),
    "clip_value": _clip("value"),
    "lr_step_decay": _scheduled("step_decay"),
    "lr_cosine": _scheduled("cosine"),
    "lr_warmup": _scheduled("warmup"),
    "lr_plateau": _scheduled("plateau"),
    "lr_piecewise": _scheduled("piecewise"),
    "multi_precision": _multi_precision,
    "ema": _ema,
    "lookahead": _lookahead,
    "model_average": _model_average,
    "gradient_merge": _gradient_merge,
    "shared_weight": _shared_weight,
    "frozen_subset": _frozen,
    "param_groups": _param_groups,
    "param_attr_lr_fetch_grads": _param_attr_lr_fetch_grads,
    "lars_momentum": _lars,
    "adamw_clip_warmup_ema": _adamw_clip_warmup_ema,
    "momentum_l2_clip_step": _momentum_l2_clip_step,
    "lamb_plateau_value_clip": _lamb_plateau_value_clip,
    "lookahead_rmsprop_frozen": _merge_lookahead_frozen,
})

CONFIGS = ("L0", "L1", "L2", "L1 grads", "L2 grads", "budget0.9", "budget@smallest",
           "budget@1.2x smallest", "L2 after step 1", "budget@smallest after step 1",
           "L1 no fetch_list", "budget@smallest no fetch_list")


# -- running -----------------------------------------------------------------------

def build(paddle, name):
    """A fresh build of ``name`` (names reset, Paddle's seed fixed):
    ``(startup, Spec)``."""
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    paddle.seed(7)
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        spec = PROGRAMS[name](paddle)
    spec.main = main
    return startup, spec


def run(paddle, startup, spec, midway=None):
    """STEPS steps from one seed: ``(fetches, {persistable: array}, after)``;
    ``midway()`` (optional) called after the first step (memory_optimize on
    a program the executor has already run and cached)."""
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    outs = []
    with paddle.static.scope_guard(scope), contextlib.redirect_stdout(io.StringIO()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        for k in range(STEPS):
            got = [np.array(a) for a in exe.run(spec.main, feed=spec.feed(rng, k),
                                                 fetch_list=spec.fetch)]
            outs.append(got)
            if spec.between is not None:
                spec.between(k, got)
            if k == 0 and midway is not None:
                midway()
        after = spec.after(exe) if spec.after is not None else []
        state = {}
        for n in persistable_names(paddle, startup, [spec]):
            var = scope.find_var(n)
            if var is not None and var.get_tensor()._is_initialized():
                state[n] = np.array(var.get_tensor())
    return outs, state, after


def _kwargs(memopt, label, spec):
    """memory_optimize's arguments for config ``label``."""
    base = dict(fetch_list=spec.fetch, print_log=True)
    if label.endswith(" no fetch_list"):  # the run still fetches spec.fetch
        base, label = dict(print_log=True), label[:-len(" no fetch_list")]
    label = label.replace(" after step 1", "")
    if label.startswith("L"):  # "L<level>", "L<level> grads": skip_grads=False
        return dict(base, level=int(label[1]), skip_grads=not label.endswith("grads"))
    if label.startswith("budget@"):
        before = _text_of(spec.main)
        try:
            memopt.memory_optimize(spec.main, budget=1, batch_size=BATCH, **base)
        except memopt.errors.BudgetError as e:
            assert _text_of(spec.main) == before, "BudgetError left the program changed"
            scale = 1.2 if label == "budget@1.2x smallest" else 1
            return dict(base, budget=int(scale * e.smallest_budget), batch_size=BATCH)
        raise AssertionError("budget=1 planned")
    peak = memopt.analyze(spec.main, BATCH, fetch_list=spec.fetch).total_peak(BATCH)
    return dict(base, budget=int(0.9 * peak), batch_size=BATCH)


def check_one(name):
    """{config: cell} for program ``name`` in this process."""
    import paddle

    import memopt

    try:
        ref = run(paddle, *build(paddle, name))
        if not same(ref, run(paddle, *build(paddle, name))):
            return {"paddle": "two runs of the unchanged program differ"}
    except Exception as e:
        traceback.print_exc()
        return {"paddle": _one_line(e)}
    cells = {}
    for label in CONFIGS:
        startup, spec = build(paddle, name)
        before = _text_of(spec.main)
        reports = []

        def rewrite():
            with contextlib.redirect_stdout(io.StringIO()):
                reports.append(memopt.memory_optimize(spec.main, **_kwargs(memopt, label, spec)))
        try:
            if label.endswith("after step 1"):  # rewritten inside the run, after step 1
                got = run(paddle, startup, spec, midway=rewrite)
            else:
                rewrite()
        except Exception as e:
            if _memopt_error(memopt, e) and _text_of(spec.main) == before:
                cells[label] = "refused: " + _one_line(e)
            else:
                traceback.print_exc()
                cells[label] = "BUG " + _one_line(e) + (
                    "" if _text_of(spec.main) == before else " (program changed)")
            continue
        try:
            if not label.endswith("after step 1"):
                got = run(paddle, startup, spec)
        except Exception as e:
            traceback.print_exc()
            cells[label] = ("refused at run: " if _memopt_error(memopt, e) else "BUG ") + \
                _one_line(e)
            continue
        n = len(reports[0].recomputed or [])
        cells[label] = ("ok" if same(ref, got) else "DIFFERS") + \
            (f" ({n} recomputed)" if n else "")
    return cells


def check_group(names):
    """{program: cells} for every program in ``names`` in this process."""
    import paddle

    paddle.enable_static()
    return {name: check_one(name) for name in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, metavar="NAMES")
    args = parser.parse_args()
    print(json.dumps(check_group(args.worker.split(","))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
