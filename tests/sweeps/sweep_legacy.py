"""Sweep memory_optimize over legacy Paddle training programs and the
workflows users run around them.

Every model is built as a legacy ``ProgramDesc`` (``FLAGS_enable_pir_api=0``
set before Paddle is imported), rewritten with ``memopt.memory_optimize`` at
levels 0, 1 and 2 (level 2: block 0 in a memory-aware order kept by
``depend`` ops; ``--levels 2,B`` adds ``B``: level 1 with ``budget=`` 0.9 x the
predicted peak, or the smallest budget its BudgetError names, variant A) in two
variants -- ``A``: ``skip_grads=True, fetch_list=[loss, prediction],
print_log=True``; ``B``: ``skip_grads=False, skip_opt_set={an activation}``
-- and checked against the same model built unchanged:

- ``train``: 3 steps planned and run with the garbage collector off
  (``FLAGS_eager_delete_tensor_gb=-1``) and on (``0``); every fetch of every
  step and every parameter afterwards bit-identical (same bytes); ``cross_off`` /
  ``cross_on``: planned with the GC off / on, run with it the other way;
- ``fetch``: one more step fetching every name a user could fetch (each
  persistable tensor, each feed, the fetch list, the loss, every other
  name the rewritten program still declares) gives the unchanged program's
  values; each name the rewrite removed raises ``MergedVariableError``;
- ``clone``: ``clone(for_test=True)`` evaluates as the unchanged clone does;
- ``save``: ``paddle.static.save`` after 2 steps, ``load`` into a fresh scope,
  one more step; ``parse``: ``Program.parse_from_string`` of the desc trains
  3 steps bit-identically;
- ``infer``: ``save_inference_model`` of the prediction, loaded in a new
  process, gives the unchanged model's outputs (variant A only: B may merge
  the prediction away, and then saving it must fail naming it).

The cells are tests of ``test_sweep_legacy.py``, model x configuration
(``L0A`` ... ``L2B``; a configuration's cell is every check above), each
model in a fresh process (``--check NAME`` prints one JSON object) with
``FLAGS_enable_pir_api=0``.  ``SWEEP_FORCE_ORDER=greedy`` (or ``depth``,
``optimizer``) makes level 2 apply that candidate order whatever its gain.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np

STEPS = 3
LEVELS = (0, 1, 2)
#: The pseudo-level of ``budget=`` (level 1 and a budget of
#: BUDGET_FRACTION x the program's predicted peak at its feed's batch).
BUDGET = "B"
BUDGET_FRACTION = 0.9
GC = {"off": -1.0, "on": 0.0}


# -- models ------------------------------------------------------------------------------------

def _data(name, shape, dtype="float32", **kw):
    import paddle

    return paddle.static.data(name, shape, dtype, **kw)


def _ce(logits, label):
    import paddle

    return paddle.mean(paddle.nn.functional.cross_entropy(logits, label))


def _image(make, size, batch=4, classes=10, head=None, lr=0.01):
    def build():
        import paddle

        x, y = _data("img", [-1, 3, size, size]), _data("label", [-1, 1], "int64")
        out = make()(x)
        if head is not None:
            out = head(out)
        loss = _ce(out, y)

        def feed(rng):
            return {"img": rng.random((batch, 3, size, size), dtype=np.float32),
                    "label": rng.integers(0, classes, (batch, 1)).astype("int64")}
        return feed, loss, out, paddle.optimizer.Momentum(lr, 0.9)
    return build


def _vgg_head(out):
    import paddle

    return paddle.nn.Linear(512, 10)(paddle.flatten(out, 1))


def _vision(fn, **kw):
    def make():
        import paddle.vision.models as vm

        return getattr(vm, fn)(**kw)
    return make


def _transformer(batch=4, seq=8, vocab=50, d=32):
    """nn.TransformerEncoder classifier with a key-padding mask
    (:func:`memopt.testing.encoders.encoder_classifier`), Adam."""
    import paddle

    from memopt.testing.encoders import encoder_classifier

    feed, loss, logits = encoder_classifier(seq=seq, d_model=d, vocab=vocab, classes=3,
                                            key_padding_mask=True)
    return (lambda rng: feed(rng, batch)), loss, logits, paddle.optimizer.Adam(0.001)


def _rnn(cell, batch=4, seq=6, vocab=40, d=16):
    import paddle

    ids, y = _data("ids", [-1, seq], "int64"), _data("label", [-1, 1], "int64")
    lens = _data("lens", [-1], "int64")
    h = paddle.nn.Embedding(vocab, d)(ids)
    net = getattr(paddle.nn, cell)(d, d, num_layers=2, direction="bidirect")
    out, _ = net(h, sequence_length=lens)
    logits = paddle.nn.Linear(2 * d, 3)(paddle.mean(out, axis=1))

    def feed(rng):
        return {"ids": rng.integers(0, vocab, (batch, seq)).astype("int64"),
                "lens": rng.integers(1, seq + 1, (batch,)).astype("int64"),
                "label": rng.integers(0, 3, (batch, 1)).astype("int64")}
    return feed, _ce(logits, y), logits, paddle.optimizer.SGD(0.1)


def _sequence(batch=4, d=8):
    import paddle
    from paddle.base import core

    x = _data("words", [-1, d], lod_level=1)
    y = _data("label", [-1, 1], "int64")
    conv = paddle.static.nn.sequence_conv(x, num_filters=16, filter_size=3, act="relu")
    pooled = paddle.static.nn.sequence_pool(conv, "max")
    last = paddle.static.nn.sequence_last_step(conv)
    logits = paddle.static.nn.fc(paddle.concat([pooled, last], axis=1), 3)

    def feed(rng):
        lens = rng.integers(1, 5, batch)
        t = core.DenseTensor()
        t.set(rng.random((int(lens.sum()), d), dtype=np.float32), core.CPUPlace())
        t.set_recursive_sequence_lengths([lens.tolist()])
        return {"words": t, "label": rng.integers(0, 3, (batch, 1)).astype("int64")}
    return feed, _ce(logits, y), logits, paddle.optimizer.SGD(0.1)


def _sparse(opt_name, batch=8, slots=4, vocab=500, d=8):
    def build():
        import paddle

        ids, y = _data("ids", [-1, slots], "int64"), _data("click", [-1, 1])
        emb = paddle.nn.Embedding(vocab, d, sparse=True)(ids)
        h = paddle.nn.functional.relu(paddle.nn.Linear(slots * d, 16)(
            paddle.reshape(emb, [-1, slots * d])))
        logit = paddle.nn.Linear(16, 1)(h)
        loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, y))
        opt = (paddle.optimizer.SGD(0.1) if opt_name == "sgd"
               else paddle.optimizer.Adagrad(0.1))

        def feed(rng):
            return {"ids": rng.integers(0, vocab, (batch, slots)).astype("int64"),
                    "click": rng.integers(0, 2, (batch, 1)).astype("float32")}
        return feed, loss, logit, opt
    return build


def _mlp_feed(batch=8, width=16, classes=4):
    def feed(rng):
        return {"x": rng.random((batch, width), dtype=np.float32),
                "label": rng.integers(0, classes, (batch, 1)).astype("int64")}
    return feed


def _amp(dtype):
    def build():
        import paddle

        x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
        h = paddle.nn.functional.relu(paddle.nn.Linear(16, 32)(x))
        h = paddle.nn.LayerNorm(32)(paddle.nn.Linear(32, 32)(h))
        logits = paddle.nn.Linear(32, 4)(h)
        loss = _ce(paddle.cast(logits, "float32"), y)
        opt = paddle.static.amp.decorate(paddle.optimizer.Momentum(0.01, 0.9), level="O1",
                                         dtype=dtype, use_dynamic_loss_scaling=False)
        return _mlp_feed(), loss, logits, opt
    return build


def _grad_merge():
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.nn.functional.relu(paddle.nn.Linear(16, 32)(x))
    logits = paddle.nn.Linear(32, 4)(h)
    opt = paddle.incubate.optimizer.GradientMergeOptimizer(
        paddle.optimizer.Momentum(0.01, 0.9), k_steps=2, avg=True)
    return _mlp_feed(), _ce(logits, y), logits, opt


def _control():
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    i = paddle.full([1], 0, "int64")
    n = paddle.full([1], 3, "int64")
    fc = paddle.nn.Linear(16, 16)

    def body(i, h):
        return i + 1, paddle.nn.functional.relu(fc(h)) + h

    _, h = paddle.static.nn.while_loop(lambda i, h: i < n, body, [i, h])
    s = paddle.mean(h)
    # paddle.static.nn.cond fails in the legacy IR (Paddle 3.3.1: logical_not()
    # takes PIR Values only): two conditional_blocks and a select_input instead
    from memopt.testing.models import _cond

    h = _cond("legacy", s, 0.5, lambda: h * 2.0, lambda: h - 1.0)
    logits = paddle.static.nn.fc(h, 4)
    return _mlp_feed(), _ce(logits, y), logits, paddle.optimizer.SGD(0.05)


def _cond_dropout():
    """Two conditional_blocks (one branch with a dropout inside) between
    two dropouts of block 0: sub-block readers and writers, three random
    ops."""
    import paddle
    from memopt.testing.models import _cond

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.nn.Dropout(0.3)(paddle.nn.functional.relu(paddle.nn.Linear(16, 32)(x)))
    g = paddle.nn.Linear(32, 32)(h)
    h = _cond("legacy", paddle.mean(g), 0.0, lambda: paddle.nn.functional.dropout(g, 0.5),
              lambda: g * 0.5)
    h = paddle.nn.Dropout(0.2)(paddle.nn.functional.relu(h)) + g
    logits = paddle.nn.Linear(32, 4)(h)
    return _mlp_feed(), _ce(logits, y), logits, paddle.optimizer.Adam(0.01)


def _fluid_cnn(batch=4):
    import paddle

    x, y = _data("img", [-1, 3, 16, 16]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.conv2d(x, 8, 3, padding=1)
    h = paddle.static.nn.batch_norm(h, act="relu")
    h = paddle.nn.functional.max_pool2d(h, 2)
    h = paddle.static.nn.conv2d(h, 16, 3, padding=1, act="relu")
    h = paddle.static.nn.batch_norm(h)
    logits = paddle.static.nn.fc(paddle.flatten(h, 1), 10)

    def feed(rng):
        return {"img": rng.random((batch, 3, 16, 16), dtype=np.float32),
                "label": rng.integers(0, 10, (batch, 1)).astype("int64")}
    return feed, _ce(logits, y), logits, paddle.optimizer.Momentum(0.01, 0.9)


def _clip_decay():
    """Gradient clipping by norm (ClipGradByGlobalNorm fails in the legacy IR of
    Paddle 3.3.1: sqrt() takes PIR Values only), L2 weight decay, a learning-rate
    schedule, Adam, a second loss term and a frozen layer."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    frozen = paddle.nn.Linear(16, 16)
    frozen.weight.stop_gradient = True
    h = paddle.nn.functional.relu(frozen(x))
    h = paddle.nn.Dropout(0.2)(paddle.nn.functional.relu(paddle.nn.Linear(16, 32)(h)))
    logits = paddle.nn.Linear(32, 4)(h)
    loss = _ce(logits, y) + 0.01 * paddle.mean(paddle.square(h))
    lr = paddle.optimizer.lr.PiecewiseDecay([2], [0.01, 0.001])
    opt = paddle.optimizer.Adam(lr, weight_decay=paddle.regularizer.L2Decay(1e-4),
                                grad_clip=paddle.nn.ClipGradByNorm(1.0))
    return _mlp_feed(), loss, logits, opt


def _tied_two_losses(batch=4, seq=6, vocab=30, d=16):
    """A language model whose output projection reuses the embedding table
    (one parameter read twice: its grads summed through ``@RENAME@``
    names), and a second loss minimized by a second optimizer over the head
    only (two backward passes in one program)."""
    import paddle

    ids = _data("ids", [-1, seq], "int64")
    nxt = _data("next", [-1, seq, 1], "int64")
    emb = paddle.nn.Embedding(vocab, d)
    h = paddle.nn.functional.relu(paddle.nn.Linear(d, d)(emb(ids)))
    logits = paddle.einsum("bsd,vd->bsv", h, emb.weight)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, nxt))
    head = paddle.nn.Linear(d, 1)
    aux = paddle.mean(paddle.square(head(h.detach()) - 1.0))

    class Both:
        def minimize(self, loss):
            paddle.optimizer.SGD(0.1).minimize(loss)
            paddle.optimizer.SGD(0.05, parameters=head.parameters()).minimize(aux)

    def feed(rng):
        return {"ids": rng.integers(0, vocab, (batch, seq)).astype("int64"),
                "next": rng.integers(0, vocab, (batch, seq, 1)).astype("int64")}
    return feed, loss, logits, Both()


MODELS = {
    "vgg11": _image(_vision("vgg11", num_classes=0, with_pool=False), 32, head=_vgg_head),
    "squeezenet1_1": _image(_vision("squeezenet1_1", num_classes=10), 64),
    "shufflenet_v2_x0_25": _image(_vision("shufflenet_v2_x0_25", num_classes=10), 32),
    "mobilenet_v3_small": _image(_vision("mobilenet_v3_small", num_classes=10), 32),
    "densenet121": _image(_vision("densenet121", num_classes=10), 32, batch=2,
                          lr=0.001),  # at 0.01 its eval after 3 steps is NaN
    "resnet18": _image(_vision("resnet18", num_classes=10), 32),
    "transformer": _transformer,
    "lstm2_bi": lambda: _rnn("LSTM"),
    "gru2_bi": lambda: _rnn("GRU"),
    "sequence_ops": _sequence,
    "sparse_sgd": _sparse("sgd"),
    "sparse_adagrad": _sparse("adagrad"),
    "amp_bf16_O1": _amp("bfloat16"),
    "amp_fp16_O1": _amp("float16"),
    "grad_merge": _grad_merge,
    "while_cond": _control,
    "cond_dropout": _cond_dropout,
    "fluid_cnn": _fluid_cnn,
    "clip_decay_adam": _clip_decay,
    "tied_two_losses": _tied_two_losses,
}
#: Feeds the prediction does not read (left out of the inference model).
LABELS = ("label", "click", "next")
#: Models also checked as a forward-only (inference) program.
INFER_ONLY = ("resnet18", "transformer")


class Built:
    """One build of a model: programs, feed, loss, prediction."""

    def __init__(self, name, train=True):
        import paddle

        paddle.enable_static()
        self.main, self.startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(self.main, self.startup), \
                paddle.utils.unique_name.guard():
            self.feed, self.loss, self.pred, opt = MODELS[name]()
            if train:
                opt.minimize(self.loss)
        self.params = sorted(p.name for p in self.main.all_parameters())
        self.feed_names = sorted(n for n, v in self.main.global_block().vars.items()
                                 if getattr(v, "is_data", False))

    def fetch(self, variant="A"):
        """What a step fetches: variant B passes no fetch_list, so only the
        loss (which memopt keeps anyway) is fetched."""
        return [self.loss, self.pred] if variant == "A" else [self.loss]


@contextlib.contextmanager
def gc_mode(mode):
    import paddle

    old = paddle.get_flags(["FLAGS_eager_delete_tensor_gb"])
    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": GC[mode]})
    try:
        yield
    finally:
        paddle.set_flags(old)


def train(b, program=None, steps=STEPS, fetch=None, scope=None, variant="A"):
    """``steps`` steps from the startup program; (fetches per step, params)."""
    import paddle

    program = b.main if program is None else program
    scope = paddle.static.Scope() if scope is None else scope
    rng = np.random.default_rng(1)
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(b.startup)
        out = [[np.array(a) for a in exe.run(program, feed=b.feed(rng),
                                             fetch_list=fetch or b.fetch(variant))]
               for _ in range(steps)]
        params = [np.array(scope.find_var(p).get_tensor()) for p in b.params]
    return out, params


def bits_equal(a, c):
    """Bit-identical arrays: same dtype, shape and bytes (a NaN equals the
    same NaN: an eval of a diverged model gives NaN in both programs)."""
    a, c = np.asarray(a), np.asarray(c)
    return a.dtype == c.dtype and a.shape == c.shape and a.tobytes() == c.tobytes()


def same(x, y):
    (fa, pa), (fb, pb) = x, y
    if len(fa) != len(fb) or len(pa) != len(pb):
        return False
    return all(bits_equal(a, c) for s, t in zip(fa, fb, strict=True) for a, c in zip(s, t, strict=True)) and \
        all(bits_equal(a, c) for a, c in zip(pa, pb, strict=True))


def force_order(name):
    """Make level 2 apply candidate order ``name`` (``greedy``, ``depth``,
    ``optimizer``, or ``program, kept``: the program's own order with the
    depend ops; the first other candidate if it is not made) whatever its
    predicted gain: every order level 2 may choose must run bit-identically
    and keep every workflow."""
    from memopt.paddle.legacy import schedule as legacy_schedule
    from memopt.paddle.pir.schedule import OrderChoice

    def forced(table, orders, min_gain):
        peaks = {k: row["own"] for k, row in table.items()}
        pick = name if name in orders else next(k for k in orders if k != "program")
        return OrderChoice(pick, orders[pick], peaks)
    legacy_schedule.choose_order = forced


def optimize(b, level, variant):
    """``memory_optimize`` of ``b.main`` at ``level`` in ``variant``: the
    Report and what print_log printed.  A memopt error must leave the
    program as it was (its serialized desc byte-identical)."""
    import memopt

    before = b.main.desc.serialize_to_string()
    try:
        return _optimize(b, level, variant)
    except memopt.errors.MemoptError:
        if b.main.desc.serialize_to_string() != before:
            raise AssertionError("memopt refused and left the program changed")
        raise


def _optimize(b, level, variant):
    import memopt

    if os.environ.get("SWEEP_FORCE_ORDER") and level == 2:
        force_order(os.environ["SWEEP_FORCE_ORDER"])

    buf = io.StringIO()
    if variant == "A":
        kw = dict(skip_grads=True, fetch_list=b.fetch(), print_log=True)
    else:
        kw = dict(skip_grads=False, skip_opt_set={_an_activation(b)})
    if level == BUDGET:
        batch = len(next(v for v in b.feed(np.random.default_rng(0)).values()
                         if isinstance(v, np.ndarray)))
        predicted = memopt.analyze(b.main, batch, fetch_list=b.fetch()).total_peak()
        kw.update(budget=int(BUDGET_FRACTION * predicted), batch_size=batch)
        level = 1
        try:
            with contextlib.redirect_stdout(buf):
                report = memopt.memory_optimize(b.main, level=level, **kw)
            return report, buf.getvalue()
        except memopt.BudgetError as exc:  # the least budget that plans, then
            kw["budget"] = exc.smallest_budget
    with contextlib.redirect_stdout(buf):
        report = memopt.memory_optimize(b.main, level=level, **kw)
    if variant == "A" and not buf.getvalue().strip():
        raise AssertionError("print_log=True printed nothing")
    return report, buf.getvalue()


def _an_activation(b):
    """A forward temporary (the middle one), for skip_opt_set."""
    block = b.main.global_block()
    names = [n for op in block.ops if not op.desc.has_attr("op_role")
             or int(op.desc.attr("op_role")) == 0
             for n in op.output_arg_names
             if n in block.vars and not block.vars[n].persistable]
    return names[len(names) // 2]


def fetchable(b_ref, b_opt):
    """Names a user could fetch from the rewritten program and the names it
    removed."""
    from paddle.base import core

    ref_vars = b_ref.main.global_block().vars
    opt_vars = b_opt.main.global_block().vars
    keep, gone = [], []
    for name, var in sorted(ref_vars.items()):
        if var.type not in (core.VarDesc.VarType.DENSE_TENSOR,) or name.startswith("memopt@"):
            continue
        if name in opt_vars:
            keep.append(name)
        else:
            gone.append(name)
    return keep, gone


def check_fetch(b_ref, b_opt, variant):
    """One step after two, fetching every name both programs declare."""
    import paddle

    import memopt
    from memopt.errors import MergedVariableError

    keep, gone = fetchable(b_ref, b_opt)
    must = set(b_ref.params) | set(b_ref.feed_names) | {v.name for v in b_ref.fetch(variant)}
    lost = sorted(must & set(gone))
    results = []
    for b in (b_ref, b_opt):
        scope = paddle.static.Scope()
        rng = np.random.default_rng(1)
        with paddle.static.scope_guard(scope):
            exe = two_steps(b, rng)
            feed = b.feed(rng)
            out = exe.run(b.main, feed=feed, fetch_list=keep, return_numpy=False)
            results.append([np.array(t) if t._is_initialized() else None for t in out])
            if b is b_opt:
                refused = 0
                for name in gone[:25]:
                    try:
                        exe.run(b.main, feed=feed, fetch_list=[name])
                    except MergedVariableError:
                        refused += 1
                    except Exception as exc:  # noqa: BLE001
                        return f"fetch {name}: {type(exc).__name__}: {str(exc)[:200]}"
                if refused != len(gone[:25]):
                    return f"fetching a removed name did not raise ({refused}/{len(gone[:25])})"
    bad = [n for n, a, c in zip(keep, *results)
           if (a is None) != (c is None) or (a is not None and not bits_equal(a, c))]
    del memopt
    if lost:
        return f"user names removed: {lost[:5]}"
    if bad:
        return f"differ: {bad[:5]} ({len(bad)}/{len(keep)})"
    return f"ok ({len(keep)} kept, {len(gone)} refused)"


def two_steps(b, rng):
    """Startup (seed 1) and two training steps of ``b`` in the current
    scope; returns the executor."""
    import paddle

    exe = paddle.static.Executor(paddle.CPUPlace())
    paddle.seed(1)
    exe.run(b.startup)
    for _ in range(2):
        exe.run(b.main, feed=b.feed(rng), fetch_list=[b.loss])
    return exe


def check_clone(b_ref, b_opt, variant):
    import paddle

    outs = []
    for b in (b_ref, b_opt):
        try:
            test = b.main.clone(for_test=True)
        except Exception as exc:  # noqa: BLE001
            if b is b_ref:
                return f"paddle fails unchanged: {str(exc).strip().splitlines()[0][:120]}"
            raise
        scope = paddle.static.Scope()
        out, _ = train(b, scope=scope, variant=variant)
        rng = np.random.default_rng(7)
        fetch = [b.loss.name, b.pred.name] if variant == "A" else [b.loss.name]
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            outs.append([np.array(a) for a in exe.run(test, feed=b.feed(rng),
                                                      fetch_list=fetch)])
    ok = all(bits_equal(a, c) for a, c in zip(*outs))
    return "ok" if ok else "DIFFERS"


def check_save_load(b_ref, b_opt, tmp):
    import paddle

    outs = []
    for tag, b in (("ref", b_ref), ("opt", b_opt)):
        prefix = os.path.join(tmp, f"ckpt_{tag}")
        scope = paddle.static.Scope()
        rng = np.random.default_rng(1)
        with paddle.static.scope_guard(scope):
            two_steps(b, rng)
            paddle.static.save(b.main, prefix)
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(b.startup)
            paddle.static.load(b.main, prefix, exe)
            out = [np.array(a) for a in exe.run(b.main, feed=b.feed(rng), fetch_list=[b.loss])]
            out += [np.array(scope.find_var(p).get_tensor()) for p in b.params]
        outs.append(out)
    return "ok" if all(bits_equal(a, c) for a, c in zip(*outs)) else "DIFFERS"


def check_parse(b_ref, b_opt, variant):
    from paddle.base.framework import Program

    parsed = Program.parse_from_string(b_opt.main.desc.serialize_to_string())
    fetch = [v.name for v in b_opt.fetch(variant)]
    return "ok" if same(train(b_ref, fetch=fetch), train(b_opt, parsed, fetch=fetch)) \
        else "DIFFERS"


def save_inference(b, prefix):
    import paddle

    scope = paddle.static.Scope()
    train(b, scope=scope)
    feeds = [b.main.global_block().var(n) for n in b.feed_names if n not in LABELS]
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.static.save_inference_model(prefix, feeds, [b.pred], exe, program=b.main)
    return [v.name for v in feeds]


_LOAD_CHILD = r"""
import os, sys, json
import numpy as np
import paddle
sys.path.insert(0, {scripts!r})
import sweep_legacy as s
paddle.enable_static()
b = s.Built({name!r}, train=False)
feed = b.feed(np.random.default_rng(5))
res = {{}}
exe = paddle.static.Executor(paddle.CPUPlace())
outs = {{}}
for tag, names in {pairs!r}:
    prog, feeds, fetches = paddle.static.load_inference_model(os.path.join({tmp!r}, tag), exe)
    outs[tag] = [np.array(a) for a in exe.run(prog, feed={{n: feed[n] for n in feeds}},
                                              fetch_list=fetches)]
ref = outs.pop("ref")
print(json.dumps({{t: all(s.bits_equal(a, c) for a, c in zip(ref, o, strict=True)) for t, o in outs.items()}}))
"""


def load_in_new_process(name, tags, tmp):
    code = _LOAD_CHILD.format(scripts=os.path.dirname(os.path.abspath(__file__)), name=name,
                              pairs=[(t, None) for t in tags], tmp=tmp)
    env = dict(os.environ, FLAGS_enable_pir_api="0")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode:
        return {t: "child: " + proc.stderr.strip().splitlines()[-1][:200] for t in tags[1:]}
    return {t: ("ok" if v else "DIFFERS") for t, v in json.loads(proc.stdout.splitlines()[-1])
            .items()}


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb)
                      if "memopt" in f.filename), "paddle")
        return f"ERROR {type(exc).__name__} at {where}: {str(exc).strip()[:300]}"


def check_model(name, levels=LEVELS):
    """Every check of one model at each of ``levels`` (``BUDGET``: a
    budget of :data:`BUDGET_FRACTION` of the predicted peak):
    {config: {check: result}}."""
    import paddle

    paddle.enable_static()
    res = {}
    try:
        b_ref = Built(name)
        ref = {}
        for mode in GC:
            with gc_mode(mode):
                ref[mode] = train(b_ref)
    except Exception as exc:  # noqa: BLE001
        return {"paddle": f"unchanged program fails: {type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"}
    tmp = tempfile.mkdtemp(prefix="sweep_")
    infer_tags = ["ref"]
    save_inference(b_ref, os.path.join(tmp, "ref"))
    for level in levels:
        for variant in ("A", "B") if level != BUDGET else ("A",):
            cfg = f"L{level}{variant}"
            r = res[cfg] = {}
            for mode in GC:
                with gc_mode(mode):
                    b = Built(name)
                    opt = _try(optimize, b, level, variant)
                    if isinstance(opt, str):
                        r[f"train_gc_{mode}"] = opt
                        continue
                    report, log_text = opt
                    r.setdefault("merged", len(report.reuses))
                    if level in (2, BUDGET):
                        r[f"note_{mode}"] = " ".join(str(n) for n in getattr(
                            report, "notes", ()) if "level 2" in str(n) or "budget" in str(n)
                            or "recomput" in str(n))[:300]
                    got = _try(train, b, None, STEPS, None, None, variant)
                    want = ref[mode] if variant == "A" else (
                        [s[:1] for s in ref[mode][0]], ref[mode][1])
                    r[f"train_gc_{mode}"] = got if isinstance(got, str) else (
                        "ok" if same(want, got) else "DIFFERS")
                    # the flag changed between planning and running
                    other = "on" if mode == "off" else "off"
                    with gc_mode(other):
                        got = _try(train, b, None, STEPS, None, None, variant)
                    want = ref[other] if variant == "A" else (
                        [s[:1] for s in ref[other][0]], ref[other][1])
                    r[f"cross_{mode}"] = got if isinstance(got, str) else (
                        "ok" if same(want, got) else "DIFFERS")
                    if mode != "off":
                        continue
                    b_un = Built(name)
                    r["fetch"] = _try(check_fetch, b_un, b, variant)
                    r["clone"] = _try(check_clone, b_un, b, variant)
                    r["save"] = _try(check_save_load, b_un, b, tmp)
                    r["parse"] = _try(check_parse, b_un, b, variant)
                    if variant == "A":
                        got = _try(save_inference, b, os.path.join(tmp, cfg))
                        if isinstance(got, str) and got.startswith("ERROR"):
                            r["infer"] = got
                        else:
                            infer_tags.append(cfg)
    if len(infer_tags) > 1:
        for cfg, v in load_in_new_process(name, infer_tags, tmp).items():
            res[cfg]["infer"] = v
    return res


def check_infer_only(name):
    """A forward-only program rewritten and run: outputs equal."""
    import paddle

    import memopt

    outs = []
    for opt in (False, True):
        b = Built(name, train=False)
        if opt:
            memopt.memory_optimize(b.main, level=1, fetch_list=[b.pred])
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope), gc_mode("off"):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(b.startup)
            outs.append(np.array(exe.run(b.main, feed=b.feed(np.random.default_rng(3)),
                                         fetch_list=[b.pred])[0]))
    return "ok" if bits_equal(*outs) else "DIFFERS"


#: memopt errors that refuse a program cleanly (the culprit named; optimize
#: checks the program was left as it was).
REFUSALS = ("UnsupportedProgramError", "BudgetError")


def config_cell(checks):
    """One configuration's checks as one cell: 'ok', 'refused: <message>'
    (every failing check a clean refusal of memopt: the program is one
    memopt does not take) or 'BUG: <the failing checks>'."""
    if not isinstance(checks, dict):
        return "BUG: " + str(checks)[:200]
    bad = {k: str(v) for k, v in checks.items()
           if k != "merged" and not k.startswith("note")
           and not (str(v) == "ok" or str(v).startswith("ok"))}
    if not bad:
        return "ok"
    if all(any(v.startswith(f"ERROR {e} ") for e in REFUSALS) for v in bad.values()):
        first = next(iter(bad.values()))
        return "refused: " + first.split(": ", 1)[1][:160]
    return "BUG: " + "; ".join(f"{k}: {v}" for k, v in bad.items())[:400]


def main(argv):
    if argv[:1] != ["--check"] or len(argv) != 2:
        print("usage: sweep_legacy.py --check NAME (one model's checks, JSON)", file=sys.stderr)
        return 2
    out = check_model(argv[1])
    if argv[1] in INFER_ONLY:
        out["infer_only"] = {"forward": _try(check_infer_only, argv[1])}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLAGS_enable_pir_api", "0")  # before Paddle is imported
    sys.exit(main(sys.argv[1:]))
