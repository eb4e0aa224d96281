"""Sweep memory_optimize over training set-ups the other sweeps do not build.

Both IRs (PIR, Paddle's default; legacy with ``FLAGS_enable_pir_api=0`` set
before Paddle is imported).  The programs, each a small one a user would
write, trained 3 steps:

- AMP with dynamic loss scaling (``paddle.static.amp.decorate``), O1 and O2,
  float16 and bfloat16, the scale so large that the first steps overflow:
  ``check_finite_and_unscale`` / ``update_loss_scaling`` skip the update and
  shrink the scale (the loss scaling and the good/bad step counters fetched);
- second-order gradients: a WGAN-GP gradient penalty, and a double backward
  through conv / relu / matmul / tanh;
- a GAN as two programs (discriminator step, generator step) sharing
  parameters in one scope, each rewritten, run alternately;
- the user's own backward: ``append_backward`` then clip / scale / seeded
  noise on the gradients and ``apply_gradients``; ``minimize`` with
  ``no_grad_set`` and ``parameters``; two losses summed; stop_gradient
  branches;
- ``static.Print`` of an activation (both IRs);
- legacy only: ``py_func`` with and without a backward function,
  ``static.Print``, an intermediate variable fed by name, ``_prune`` and
  ``clone(for_test=True)`` after memory_optimize, QAT passes on the IrGraph;
- PIR only: ``static_pylayer`` with its own backward (a Layer with a
  PyLayer turned static by ``paddle.jit.to_static`` cannot be called in
  static mode in Paddle 3.3.1).

Each program x config (level 0, 1, 2, levels 1 and 2 with
``skip_grads=False``, ``budget=`` 0.9 of ``memopt.analyze(main).total_peak(batch)``
and the smallest budget BudgetError names, at level 0 and 2; a program's
own ``skip_opt_set`` where it has one) is built
fresh, rewritten, trained in a fresh scope: fetches and every persistable
must equal the unchanged program's bit for bit (same dtype); an error must
be memopt's and leave the program as it was.

The cells are tests of ``test_sweep_training_setups.py``: program x IR x
config -> ok / refused (message) / paddle fails unchanged / DIFFERS / BUG;
each program runs in a fresh process (``--worker NAME`` prints one JSON
object), GC on (Paddle's default) and off.
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

BATCH = 64
STEPS = 3


class Step:
    """One program a training step runs: ``main`` fed ``feed(rng, step)``
    fetching ``fetch``; ``after(exe, main, fetch)`` (optional) the arrays of
    a workflow run once the steps are done (an eval clone, a pruned
    program); ``init(exe)`` (optional) what runs after the startup program
    (AMP O2's ``amp_init``)."""

    def __init__(self, main, feed, fetch, after=None, init=None, run_kw=None, skip=()):
        self.main, self.feed, self.fetch, self.after, self.init = main, feed, fetch, after, init
        self.run_kw, self.skip = run_kw or {}, list(skip)


def _pir(paddle):
    return paddle.framework.in_pir_mode()


def _op(paddle, op, x, **attrs):
    """``paddle.<op>(x)`` in PIR; in legacy the op appended by hand (Paddle
    3.3.1's paddle.tanh / sigmoid / gelu / abs / sqrt take PIR Values only)."""
    if _pir(paddle):
        return getattr(paddle.nn.functional if op == "gelu" else paddle, op)(x)
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper(op)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type=op, inputs={"X": x}, outputs={"Out": out}, attrs=attrs)
    return out


def _matmul(paddle, x, y):
    if _pir(paddle):
        return paddle.matmul(x, y)
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper("matmul_v2")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type="matmul_v2", inputs={"X": x, "Y": y}, outputs={"Out": out},
                     attrs={"trans_x": False, "trans_y": False})
    return out


def _row_sum(paddle, x):
    """sum over axis 1 (legacy: reduce_sum by hand)."""
    if _pir(paddle):
        return paddle.sum(x, axis=1)
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper("reduce_sum")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type="reduce_sum", inputs={"X": x}, outputs={"Out": out},
                     attrs={"dim": [1], "keep_dim": False, "reduce_all": False})
    return out


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape).astype("float32")


def _feeds(**makers):
    """feed(rng, step): each name's array from its maker."""
    return lambda rng, step: {k: m(rng) for k, m in makers.items()}


def single(fn):
    """A builder of one program: ``fn(paddle)`` run inside its program_guard
    returns ``(feed, fetch)`` or ``(feed, fetch, after)``."""
    def build(paddle, startup):
        main = paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            got = fn(paddle)
        return [Step(main, *got)]
    build.__doc__ = fn.__doc__
    return build


# -- programs ----------------------------------------------------------------------

def _amp(level, dtype):
    @single
    def build(paddle):
        """AMP, dynamic loss scaling from a scale that overflows."""
        x = paddle.static.data("x", [-1, 16], "float32")
        h = paddle.nn.functional.relu(paddle.nn.Linear(16, 32)(x))
        out = paddle.nn.Linear(32, 4)(h)
        loss = paddle.mean(out * out)
        opt = paddle.static.amp.decorate(
            paddle.optimizer.Adam(1e-3), level=level, dtype=dtype,
            init_loss_scaling=2.0 ** 126,
            use_dynamic_loss_scaling=True, incr_every_n_steps=2,
            decr_every_n_nan_or_inf=2, decr_ratio=2.0 ** -20)
        opt.minimize(loss)
        # bfloat16: Paddle turns dynamic loss scaling off (no counters)
        state = [v for v in (opt._loss_scaling, getattr(opt, "_num_good_steps", None),
                             getattr(opt, "_num_bad_steps", None)) if v is not None]
        init = (lambda exe: opt.amp_init(paddle.CPUPlace())) if level == "O2" else None

        def feed(rng, step):  # steps 0 and 1 overflow float32: skipped, the scale shrinks
            return {"x": rng.standard_normal((BATCH, 16)).astype("float32")
                    * (1e19 if step < 2 else 1.0)}
        return feed, [loss, out] + state, None, init
    return build


@single
def _gradient_penalty(paddle):
    """WGAN-GP: the critic's gradient w.r.t. its interpolated input in the loss."""
    real = paddle.static.data("real", [-1, 8], "float32")
    fake = paddle.static.data("fake", [-1, 8], "float32")
    alpha = paddle.static.data("alpha", [-1, 1], "float32")
    l1, l2 = paddle.nn.Linear(8, 16), paddle.nn.Linear(16, 1)

    def critic(v):
        return l2(_op(paddle, "tanh", l1(v)))
    mixed = alpha * real + (1 - alpha) * fake
    mixed.stop_gradient = False
    grad = paddle.static.gradients([paddle.mean(critic(mixed))], [mixed])[0]
    norm = _op(paddle, "sqrt", _row_sum(paddle, grad * grad) + 1e-12)
    penalty = paddle.mean((norm - 1.0) ** 2)
    loss = paddle.mean(critic(fake)) - paddle.mean(critic(real)) + 10.0 * penalty
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return (_feeds(real=_normal(BATCH, 8), fake=_normal(BATCH, 8),
                   alpha=lambda rng: rng.random((BATCH, 1)).astype("float32")),
            [loss, penalty, grad])


@single
def _double_backward(paddle):
    """Double backward through conv2d, relu, matmul, tanh: the input
    gradient's square in the loss."""
    x = paddle.static.data("img", [-1, 2, 6, 6], "float32")
    x.stop_gradient = False
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(2, 4, 3, padding=1)(x))
    w = paddle.static.create_parameter([144, 8], "float32", name="mm_w")
    h = _op(paddle, "tanh", _matmul(paddle, paddle.reshape(h, [-1, 144]), w))
    out = paddle.nn.Linear(8, 1)(h)
    gx = paddle.static.gradients([paddle.mean(out)], [x])[0]
    loss = paddle.mean(out * out) + paddle.mean(gx * gx)
    paddle.optimizer.SGD(0.05).minimize(loss)
    return _feeds(img=_normal(BATCH, 2, 6, 6)), [loss, gx, out]


def _gan(paddle, startup):
    """A GAN as two programs sharing parameters by name in one scope:
    the discriminator step (Adam on D's parameters), the generator step
    (Adam on G's)."""
    attr = paddle.ParamAttr

    def gen(z):
        h = paddle.nn.functional.relu(paddle.nn.Linear(
            4, 16, weight_attr=attr(name="g_w1"), bias_attr=attr(name="g_b1"))(z))
        return _op(paddle, "tanh", paddle.nn.Linear(
            16, 8, weight_attr=attr(name="g_w2"), bias_attr=attr(name="g_b2"))(h))

    def disc(v):
        h = paddle.nn.functional.leaky_relu(paddle.nn.Linear(
            8, 16, weight_attr=attr(name="d_w1"), bias_attr=attr(name="d_b1"))(v), 0.2)
        return paddle.nn.Linear(16, 1, weight_attr=attr(name="d_w2"),
                                bias_attr=attr(name="d_b2"))(h)

    def bce(logit, target):
        return paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(
            logit, paddle.full_like(logit, target)))

    def params(main, prefix):
        if _pir(paddle):
            return [op.result(0) for op in main.global_block().ops
                    if op.name() == "builtin.parameter"
                    and op.attrs()["parameter_name"].startswith(prefix)]
        return [p for p in main.global_block().all_parameters() if p.name.startswith(prefix)]

    d_main, g_main = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(d_main, startup):
        real = paddle.static.data("real", [-1, 8], "float32")
        z = paddle.static.data("z", [-1, 4], "float32")
        fake = gen(z)
        fake.stop_gradient = True
        d_loss = bce(disc(real), 1.0) + bce(disc(fake), 0.0)
        paddle.optimizer.Adam(1e-3, parameters=params(d_main, "d_")).minimize(d_loss)
    with paddle.static.program_guard(g_main, startup):
        z = paddle.static.data("z", [-1, 4], "float32")
        fake = gen(z)
        g_loss = bce(disc(fake), 1.0)
        paddle.optimizer.Adam(1e-3, parameters=params(g_main, "g_")).minimize(g_loss)
    return [Step(d_main, _feeds(real=_normal(BATCH, 8), z=_normal(BATCH, 4)), [d_loss]),
            Step(g_main, _feeds(z=_normal(BATCH, 4)), [g_loss, fake])]


@single
def _edited_grads(paddle):
    """append_backward, then the user's clip / scale / seeded noise on each
    gradient, then apply_gradients."""
    x = paddle.static.data("x", [-1, 16], "float32")
    h = _op(paddle, "gelu", paddle.nn.Linear(16, 32)(x), approximate=False)
    out = paddle.nn.Linear(32, 4)(h)
    loss = paddle.mean(out * out)
    opt = paddle.optimizer.Momentum(0.05, momentum=0.9)
    params_grads = paddle.static.append_backward(loss)
    edited = []
    for i, (p, g) in enumerate(params_grads):
        g = paddle.clip(g, -0.05, 0.05) * 0.5
        g = g + paddle.uniform(g.shape, "float32", -1e-3, 1e-3, seed=11 + i)
        edited.append((p, g))
    opt.apply_gradients(edited)
    return _feeds(x=_normal(BATCH, 16)), [loss, out, edited[0][1]]


@single
def _partial_minimize(paddle):
    """Two losses summed; minimize with parameters= a subset and no_grad_set
    of a branch; a stop_gradient branch."""
    x = paddle.static.data("x", [-1, 16], "float32")
    a, b, c = paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4), paddle.nn.Linear(16, 4)
    frozen = paddle.nn.Linear(16, 16)
    ha = _op(paddle, "tanh", a(x))
    side = paddle.nn.functional.relu(frozen(x))
    side.stop_gradient = True
    loss1 = paddle.mean(b(ha + side) ** 2)
    hc = c(_op(paddle, "sigmoid", ha))
    loss2 = paddle.mean(_op(paddle, "abs", hc))
    loss = loss1 + 0.5 * loss2
    no_grad = {c.bias} if _pir(paddle) else {c.bias.name}
    paddle.optimizer.Adam(1e-3, parameters=a.parameters() + b.parameters()
                          + c.parameters()).minimize(loss, no_grad_set=no_grad)
    return _feeds(x=_normal(BATCH, 16)), [loss, loss1, loss2, hc]


@single
def _print_op(paddle):
    """paddle.static.Print of an activation and its gradient in a trained net."""
    x = paddle.static.data("x", [-1, 8], "float32")
    h = _op(paddle, "tanh", paddle.nn.Linear(8, 8)(x))
    h = paddle.static.Print(h, summarize=2, message="h", print_phase="both")
    out = paddle.nn.Linear(8, 2)(h)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.1).minimize(loss)
    return _feeds(x=_normal(BATCH, 8)), [loss, out]


@single
def _py_func(paddle):
    """paddle.static.py_func: a Python op with a backward function, and one
    without (its output stop_gradient)."""
    block = paddle.static.default_main_program().current_block()
    x = paddle.static.data("x", [-1, 8], "float32")
    h = paddle.nn.Linear(8, 8)(x)
    y = block.create_var(name="py_tanh_out", dtype="float32", shape=h.shape)
    paddle.static.py_func(lambda a: np.tanh(np.array(a)), h, y,
                          backward_func=lambda o, g: np.array(g) * (1 - np.array(o) ** 2),
                          skip_vars_in_backward_input=[h])
    z = block.create_var(name="py_stat_out", dtype="float32", shape=h.shape)
    paddle.static.py_func(lambda a: np.array(a) * 0 + np.array(a).mean(), h, z)
    z.stop_gradient = True
    out = paddle.nn.Linear(8, 2)(y + z)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.1).minimize(loss)
    return _feeds(x=_normal(BATCH, 8)), [loss, out]


def _feed_intermediate(paddle, startup):
    """An intermediate variable fed by name on alternate steps, run with
    ``use_prune=True`` (Paddle then drops the ops that compute it: the
    forward above it overridden)."""
    main = paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        feed, fetch, fed = _feed_intermediate_net(paddle)
    return [Step(main, feed, fetch, run_kw={"use_prune": True}, skip=[fed])]


def _feed_intermediate_net(paddle):
    x = paddle.static.data("x", [-1, 8], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Linear(8, 16)(x))
    h2 = _op(paddle, "tanh", paddle.nn.Linear(16, 16)(h))
    out = paddle.nn.Linear(16, 2)(h2)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.1).minimize(loss)
    name = h.name

    def feed(rng, step):
        f = {"x": rng.standard_normal((BATCH, 8)).astype("float32")}
        if step % 2:
            f[name] = rng.standard_normal((BATCH, 16)).astype("float32")
        return f
    return feed, [loss, out], name


@single
def _prune_and_clone(paddle):
    """clone(for_test=True) and _prune(targets=[prediction]) of the rewritten
    program run after training (dropout and batch_norm in test mode)."""
    x = paddle.static.data("x", [-1, 8], "float32")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    h = paddle.nn.functional.dropout(paddle.static.nn.batch_norm(h), 0.3)
    pred = paddle.static.nn.fc(h, 2)
    loss = paddle.mean(pred * pred)
    main = paddle.static.default_main_program()
    test = main.clone(for_test=True)
    paddle.optimizer.Adam(1e-3).minimize(loss)

    def after(exe, program, fetch):
        f = {"x": np.linspace(-1, 1, BATCH * 8, dtype="float32").reshape(BATCH, 8)}
        got = [np.array(a) for a in exe.run(program.clone(for_test=True), feed=f,
                                            fetch_list=[pred.name])]
        got += [np.array(a) for a in exe.run(program._prune(targets=[pred]), feed=f,
                                             fetch_list=[pred.name])]
        return got + [np.array(a) for a in exe.run(test, feed=f, fetch_list=[pred.name])]
    return _feeds(x=_normal(BATCH, 8)), [loss, pred], after


_QAT = {}


def _qat(paddle, startup):
    """QuantizationTransformPass and AddQuantDequantPass on the IrGraph of a
    trained conv net (fake quant/dequant ops with moving-average scales).
    IrGraph.to_program orders the ops differently from build to build (the
    moving-average accumulators then differ, the unchanged program too): the
    program is made once per process and every build parses it back."""
    if "desc" not in _QAT:
        _QAT.update(_qat_once(paddle, startup))
    main = paddle.static.Program.parse_from_string(_QAT["desc"])
    return paddle.static.Program.parse_from_string(_QAT["startup"]), [
        Step(main, _feeds(img=_normal(BATCH, 2, 6, 6)), list(_QAT["fetch"]), init=_QAT["init"])]


def _qat_once(paddle, startup):
    from paddle.base import core
    from paddle.framework import IrGraph
    from paddle.static.quantization import AddQuantDequantPass, QuantizationTransformPass

    main = paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        img = paddle.static.data("img", [-1, 2, 6, 6], "float32")
        h = paddle.static.nn.conv2d(img, 4, 3, padding=1, act="relu")
        h = paddle.nn.functional.max_pool2d(h, 2, 2) + 0.5
        pred = paddle.static.nn.fc(h, 2)
        loss = paddle.mean(pred * pred)
        paddle.optimizer.SGD(0.05).minimize(loss)
    scope, place = paddle.static.Scope(), paddle.CPUPlace()
    graph = IrGraph(core.Graph(main.desc), for_test=False)
    QuantizationTransformPass(scope=scope, place=place,
                              activation_quantize_type="moving_average_abs_max").apply(graph)
    AddQuantDequantPass(scope=scope, place=place).apply(graph)
    # the passes set the scales' first values in ``scope``: copied into the run's
    made = {n: np.array(scope.find_var(n).get_tensor()) for n in scope.local_var_names()
            if scope.find_var(n).get_tensor()._is_initialized()}

    def init(exe):
        for n, value in made.items():
            paddle.static.global_scope().var(n).get_tensor().set(value, place)
    return {"desc": graph.to_program().desc.serialize_to_string(), "init": init,
            "fetch": (loss.name, pred.name), "startup": startup.desc.serialize_to_string()}


@single
def _static_pylayer(paddle):
    """paddle.static.nn.static_pylayer with its own backward function, trained
    (paddle.jit.to_static of a Layer with a PyLayer cannot be called in
    static mode in Paddle 3.3.1: "Failed to run the callable object ...
    because it is NOT in dynamic mode")."""
    x = paddle.static.data("x", [-1, 8], "float32")
    h = paddle.nn.Linear(8, 16)(x)
    h = paddle.static.nn.static_pylayer(lambda a: _op(paddle, "tanh", a) * 2.0, [h],
                                        backward_fn=lambda g: g * 0.5)
    out = paddle.nn.Linear(16, 2)(h)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.1).minimize(loss)
    return _feeds(x=_normal(BATCH, 8)), [loss, out]


PROGRAMS = {
    "amp_o1_fp16": (_amp("O1", "float16"), "both"),
    "amp_o2_fp16": (_amp("O2", "float16"), "both"),
    "amp_o1_bf16": (_amp("O1", "bfloat16"), "both"),
    "amp_o2_bf16": (_amp("O2", "bfloat16"), "both"),
    "gradient_penalty": (_gradient_penalty, "both"),
    "double_backward": (_double_backward, "both"),
    "gan_two_programs": (_gan, "both"),
    "edited_grads": (_edited_grads, "both"),
    "partial_minimize": (_partial_minimize, "both"),
    "print_op": (_print_op, "both"),
    "feed_intermediate": (_feed_intermediate, "legacy"),
    "py_func": (_py_func, "legacy"),
    "prune_and_clone": (_prune_and_clone, "legacy"),
    "qat_passes": (_qat, "legacy"),
    "static_pylayer": (_static_pylayer, "pir"),
}

CONFIGS = {"L0": dict(level=0), "L1": dict(level=1), "L1 grads": dict(level=1, skip_grads=False),
           "L2": dict(level=2), "L2 grads": dict(level=2, skip_grads=False), "budget0.9": None,
           "budget@smallest": None, "L2 budget@smallest": None, "L2 skip": dict(level=2),
           "budget@smallest skip": None}


# -- running -----------------------------------------------------------------------

def build(paddle, name):
    """A fresh build of ``name`` (names reset): ``(startup, [Step])`` (a
    builder returns its steps, or its own startup and steps)."""
    from paddle.utils import unique_name

    startup = paddle.static.Program()
    with unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
        got = PROGRAMS[name][0](paddle, startup)
    return got if isinstance(got, tuple) else (startup, got)


def persistable_names(paddle, startup, steps):
    """Every persistable a step keeps (parameters, optimizer state, AMP's
    loss scaling and counters, QAT's scales)."""
    names = set()
    if _pir(paddle):
        from sweep_user_programs import persistable_names as pir_names
        for s in steps:
            names.update(pir_names(s.main, startup))
        return sorted(names)
    for prog in [startup] + [s.main for s in steps]:
        for var in prog.list_vars():
            if var.persistable and var.type not in (
                    paddle.base.core.VarDesc.VarType.FEED_MINIBATCH,
                    paddle.base.core.VarDesc.VarType.FETCH_LIST,
                    paddle.base.core.VarDesc.VarType.RAW):
                names.add(var.name)
    return sorted(names)


def run(paddle, startup, steps, amp_init=None):
    """STEPS steps of every program in ``steps`` (in order) from one seed:
    ``(fetches, {persistable: array}, after-arrays)``."""
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    outs = []
    with paddle.static.scope_guard(scope), contextlib.redirect_stdout(io.StringIO()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        for s in steps:
            if s.init is not None:
                s.init(exe)
        for k in range(STEPS):
            for s in steps:
                got = exe.run(s.main, feed=s.feed(rng, k), fetch_list=s.fetch, **s.run_kw)
                outs.append([np.array(a) for a in got])
        after = []
        for s in steps:
            if s.after is not None:
                after += s.after(exe, s.main, s.fetch)
        state = {}
        for n in persistable_names(paddle, startup, steps):
            var = scope.find_var(n)
            if var is not None and var.get_tensor()._is_initialized():
                state[n] = np.array(var.get_tensor())
    return outs, state, after


def same(a, b):
    """Bit-identical fetches, persistables and after-arrays (same dtype and shape)."""
    def eq(x, y):
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    (oa, sa, fa), (ob, sb, fb) = a, b
    if len(oa) != len(ob) or sorted(sa) != sorted(sb) or len(fa) != len(fb):
        return False
    return (all(len(x) == len(y) and all(map(eq, x, y)) for x, y in zip(oa, ob, strict=True))
            and all(eq(sa[n], sb[n]) for n in sa) and all(map(eq, fa, fb)))


def _kwargs(memopt, label, step):
    """memory_optimize's arguments for config ``label`` (None: the config
    does not apply: a "skip" config of a program that names no skip_opt_set)."""
    base = dict(fetch_list=step.fetch)
    if label.endswith(" skip"):
        if not step.skip:
            return None
        base["skip_opt_set"] = set(step.skip)
        label = label[:-len(" skip")]
    if label.startswith("L2 budget"):  # level 2's order with the budget's recomputation
        return dict(_kwargs(memopt, label[len("L2 "):], step), level=2)
    if CONFIGS[label] is not None:
        return dict(CONFIGS[label], **base)
    if label == "budget@smallest":  # what BudgetError says fits: recomputes the most
        before = _text_of(step.main)
        try:
            memopt.memory_optimize(step.main, budget=1, batch_size=BATCH, **base)
        except memopt.errors.BudgetError as e:
            assert _text_of(step.main) == before, "BudgetError left the program changed"
            return dict(budget=e.smallest_budget, batch_size=BATCH, **base)
        raise AssertionError("budget=1 planned")
    peak = memopt.analyze(step.main, BATCH, fetch_list=step.fetch).total_peak(BATCH)
    return dict(budget=int(0.9 * peak), batch_size=BATCH, **base)


def _text_of(program):
    """The program as text (PIR) or its serialized desc (legacy)."""
    from memopt.paddle.pir.program import is_pir_program

    return str(program) if is_pir_program(program) else program.desc.serialize_to_string()


def _memopt_error(memopt, e):
    from sweep_user_programs import _memopt_error as clean
    return clean(memopt, e)


def check_one(name):
    """{config: cell} for one program in this process."""
    import paddle

    import memopt

    paddle.enable_static()
    try:
        ref = run(paddle, *build(paddle, name))
        if not same(ref, run(paddle, *build(paddle, name))):
            paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
            ref = run(paddle, *build(paddle, name))
    except Exception as e:
        traceback.print_exc()
        return {"paddle": _one_line(e)}
    amp_state = [a for a in sorted(ref[1]) if "loss_scaling" in a or "_steps" in a]
    cells = {}
    if amp_state:
        cells["note"] = " ".join(f"{a}={ref[1][a].ravel()[0]:.3g}" for a in amp_state)
    for label in CONFIGS:
        startup, steps = build(paddle, name)
        refused, recomputed = [], 0
        if label.endswith(" skip") and not any(s.skip for s in steps):
            continue
        try:
            for s in steps:
                before = _text_of(s.main)
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        kw = _kwargs(memopt, label, s) or \
                            _kwargs(memopt, label[:-len(" skip")], s)  # this program: no skip
                        report = memopt.memory_optimize(s.main, **kw)
                    recomputed += len(report.recomputed or [])
                except Exception as e:
                    if _memopt_error(memopt, e) and _text_of(s.main) == before:
                        refused.append(_one_line(e))
                        continue
                    traceback.print_exc()
                    raise
            got = run(paddle, startup, steps)
            cells[label] = ("ok" if same(ref, got) else "DIFFERS") + \
                (f" ({recomputed} recomputed)" if recomputed else "") + \
                ("" if not refused else " (refused: " + "; ".join(refused) + ")")
        except Exception as e:
            if _memopt_error(memopt, e):
                cells[label] = "refused at run: " + _one_line(e)
            else:
                traceback.print_exc()
                cells[label] = "BUG " + _one_line(e)
    return cells



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, metavar="NAME")
    args = parser.parse_args()
    print(json.dumps(check_one(args.worker)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
