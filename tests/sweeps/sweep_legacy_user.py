"""Sweep memory_optimize over legacy programs written the way Fluid-era users
wrote them (the book's models, old transpiler tests, optimizers and
workflows sweep_legacy.py does not cover).

Each program is built as a legacy ``ProgramDesc`` (``FLAGS_enable_pir_api=0``
before Paddle is imported) and checked with sweep_legacy.py's harness
(imported, not copied): levels 0, 1, 2 and ``B`` (``budget=`` 0.9 x
``memopt.analyze``'s predicted peak at the feed's batch), variant ``A``
(``fetch_list=[loss, prediction], print_log=True``) and ``B``
(``skip_grads=False, skip_opt_set={an activation}`` or the program's own
skip set); checks ``train``/``cross`` (3 steps, GC off and on), ``fetch``
(every user-visible name), ``clone`` (``clone(for_test=True)`` eval),
``save`` (``paddle.static.save``/``load`` then a step), ``parse`` and
``infer`` (``save_inference_model``, loaded in a new process).  What this
script adds to the harness:

- every persistable tensor after the steps is compared (not only the
  parameters): optimizer moments, learning rates, EMA shadows, counters;
- a BudgetError must leave ``program.desc.serialize_to_string()``
  byte-identical;
- ``compiled``: the rewritten program run through
  ``CompiledProgram(main, build_strategy)`` (Paddle's own
  ``memory_optimize`` / ``enable_inplace`` passes on) trains as the
  unchanged one does;
- ``prune``: ``Executor.run(use_prune=True)`` fetching the prediction;
- ``two``: the program built twice with ``program_guard`` in one process
  (no ``unique_name.guard``: the second copy's names go on counting), both
  rewritten, both trained, each equal to its unchanged twin.

A raise from memopt that is not a ``memopt.errors.MemoptError`` (or a
TypeError/ValueError of the arguments) is a bug: the cell names the
exception and the memopt line it came from.

The cells are tests of ``test_sweep_legacy_user.py``, program x
configuration, each program in a fresh process (``--check NAME`` prints one
JSON object) with ``FLAGS_enable_pir_api=0``.
"""
import contextlib
import io
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_legacy as s  # noqa: E402

_data, _ce = s._data, s._ce


# -- programs ----------------------------------------------------------------------------------

def _fit_a_line(batch=8):
    """The book's fit_a_line: one fc, square_error_cost, SGD."""
    import paddle

    x, y = _data("x", [-1, 13]), _data("y", [-1, 1])
    pred = paddle.static.nn.fc(x, 1)
    loss = paddle.mean(paddle.nn.functional.square_error_cost(pred, y))

    def feed(rng):
        return {"x": rng.random((batch, 13), dtype=np.float32),
                "y": rng.random((batch, 1), dtype=np.float32)}
    return feed, loss, pred, paddle.optimizer.SGD(0.001)


def _reshape_skip(batch=8):
    """Old Fluid's memory_optimization_transpiler test: fc -> reshape ->
    reshape -> fc, skip_opt_set={cost, fc}."""
    import paddle

    x, y = _data("x", [-1, 13]), _data("y", [-1, 1])
    h = paddle.static.nn.fc(x, 20)
    h = paddle.reshape(paddle.reshape(h, [-1, 4, 5]), [-1, 20])
    pred = paddle.static.nn.fc(h, 1)
    cost = paddle.nn.functional.square_error_cost(pred, y)
    loss = paddle.mean(cost)

    def feed(rng):
        return {"x": rng.random((batch, 13), dtype=np.float32),
                "y": rng.random((batch, 1), dtype=np.float32)}
    return feed, loss, pred, paddle.optimizer.SGD(0.001), {"skip": [cost.name, h.name]}


class _Backward:
    """No optimizer: ``append_backward`` only (the gradients are computed,
    nothing is updated)."""

    def minimize(self, loss):
        import paddle

        paddle.static.append_backward(loss)


def _six_embeddings(batch=4, vocab=1000, d=8):
    """Old Fluid's transpiler test: six embeddings concatenated in cascade,
    mean, append_backward without an optimizer."""
    import paddle

    ids = [_data(f"w{i}", [-1, 1], "int64") for i in range(6)]
    embs = [paddle.static.nn.embedding(w, size=[vocab, d]) for w in ids]
    h = embs[0]
    for e in embs[1:]:
        h = paddle.concat([h, e], axis=1)
    loss = paddle.mean(h)

    def feed(rng):
        return {f"w{i}": rng.integers(0, vocab, (batch, 1)).astype("int64") for i in range(6)}
    return feed, loss, h, _Backward()


def _recognize_digits(batch=4):
    """The book's recognize_digits conv-pool net with batch_norm, softmax +
    cross_entropy on probabilities, Adam."""
    import paddle

    img, y = _data("img", [-1, 1, 28, 28]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.conv2d(img, 20, 5, act="relu")
    h = paddle.nn.functional.max_pool2d(h, 2, 2)
    h = paddle.static.nn.batch_norm(h)
    h = paddle.static.nn.conv2d(h, 50, 5, act="relu")
    h = paddle.nn.functional.max_pool2d(h, 2, 2)
    pred = paddle.static.nn.fc(h, 10, activation="softmax")
    loss = paddle.mean(paddle.nn.functional.cross_entropy(pred, y, use_softmax=False))
    paddle.static.accuracy(pred, y)

    def feed(rng):
        return {"img": rng.random((batch, 1, 28, 28), dtype=np.float32),
                "label": rng.integers(0, 10, (batch, 1)).astype("int64")}
    return feed, loss, pred, paddle.optimizer.Adam(0.001)


def _word2vec(batch=8, vocab=200, d=16):
    """The book's word2vec: four embeddings sharing one table
    (``param_attr='shared_w'``), concat, fc sigmoid, fc softmax."""
    import paddle

    words = [_data(f"w{i}", [-1, 1], "int64") for i in range(4)]
    y = _data("label", [-1, 1], "int64")
    embs = [paddle.static.nn.embedding(w, size=[vocab, d], param_attr="shared_w")
            for w in words]
    h = paddle.static.nn.fc(paddle.concat(embs, axis=1), 32, activation="sigmoid")
    pred = paddle.static.nn.fc(h, vocab, activation="softmax")
    loss = paddle.mean(paddle.nn.functional.cross_entropy(pred, y, use_softmax=False))

    def feed(rng):
        out = {f"w{i}": rng.integers(0, vocab, (batch, 1)).astype("int64") for i in range(4)}
        out["label"] = rng.integers(0, vocab, (batch, 1)).astype("int64")
        return out
    return feed, loss, pred, paddle.optimizer.SGD(0.01)


def _sentiment(batch=4, vocab=100, d=8):
    """The book's understand_sentiment convolution net: LoD word ids,
    embedding, two sequence_conv + sequence_pool windows, fc softmax,
    Adagrad."""
    import paddle
    from paddle.base import core

    words = _data("words", [-1], "int64", lod_level=1)
    y = _data("label", [-1, 1], "int64")
    emb = paddle.static.nn.embedding(words, size=[vocab, d])
    pools = []
    for window in (3, 4):
        conv = paddle.static.nn.sequence_conv(emb, num_filters=8, filter_size=window,
                                              act="tanh")
        pools.append(paddle.static.nn.sequence_pool(conv, "sqrt"))
    pred = paddle.static.nn.fc(paddle.concat(pools, axis=1), 2, activation="softmax")
    loss = paddle.mean(paddle.nn.functional.cross_entropy(pred, y, use_softmax=False))

    def feed(rng):
        lens = rng.integers(2, 6, batch)
        t = core.DenseTensor()
        t.set(rng.integers(0, vocab, (int(lens.sum()),)).astype("int64"), core.CPUPlace())
        t.set_recursive_sequence_lengths([lens.tolist()])
        return {"words": t, "label": rng.integers(0, 2, (batch, 1)).astype("int64")}
    return feed, loss, pred, paddle.optimizer.Adagrad(0.01)


def _seq2seq(batch=4, src_len=6, trg_len=5, vocab=30, d=16):
    """Machine translation: a GRU encoder, a GRU decoder started from the
    encoder's last state and fed the target shifted by one (teacher
    forcing), a vocabulary projection, Adam."""
    import paddle

    src, trg = _data("src", [-1, src_len], "int64"), _data("trg", [-1, trg_len], "int64")
    nxt = _data("label", [-1, trg_len, 1], "int64")
    _, state = paddle.nn.GRU(d, d)(paddle.nn.Embedding(vocab, d)(src))
    out, _ = paddle.nn.GRU(d, d)(paddle.nn.Embedding(vocab, d)(trg), state)
    logits = paddle.nn.Linear(d, vocab)(out)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, nxt))

    def feed(rng):
        return {"src": rng.integers(0, vocab, (batch, src_len)).astype("int64"),
                "trg": rng.integers(0, vocab, (batch, trg_len)).astype("int64"),
                "label": rng.integers(0, vocab, (batch, trg_len, 1)).astype("int64")}
    return feed, loss, logits, paddle.optimizer.Adam(0.01)


class _Gradients:
    """No optimizer: ``paddle.static.gradients`` of the loss with respect to
    the input and a hidden activation (what saliency / adversarial users
    did)."""

    def __init__(self, targets):
        self.targets = targets

    def minimize(self, loss):
        import paddle

        paddle.static.gradients([loss], self.targets)


def _static_gradients(batch=8):
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    x.stop_gradient = False
    h = paddle.static.nn.fc(x, 32, activation="relu")
    logits = paddle.static.nn.fc(h, 4)
    return s._mlp_feed(), _ce(logits, y), logits, _Gradients([x, h])


def _two_optimizers(batch=8):
    """Two towers summed into one loss, SGD on one tower's parameters and
    Adam on the other's (two minimize calls, disjoint parameter lists)."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    a1, a2 = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 4)
    b1, b2 = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 4)
    logits = a2(paddle.nn.functional.relu(a1(x))) + b2(paddle.square(b1(x)))
    loss = _ce(logits, y)

    class Both:
        def minimize(self, loss):
            paddle.optimizer.SGD(0.1, parameters=a1.parameters() + a2.parameters()) \
                .minimize(loss)
            paddle.optimizer.Adam(0.01, parameters=b1.parameters() + b2.parameters()) \
                .minimize(loss)
    return s._mlp_feed(), loss, logits, Both()


def _decayed(kind):
    def build():
        import paddle

        x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
        h = paddle.static.nn.fc(x, 32, activation="relu")
        h = paddle.static.nn.layer_norm(h)
        logits = paddle.static.nn.fc(h, 4)
        if kind == "lamb":
            opt = paddle.optimizer.Lamb(paddle.optimizer.lr.ExponentialDecay(0.01, 0.9))
        elif kind == "rmsprop":
            opt = paddle.optimizer.RMSProp(paddle.optimizer.lr.NoamDecay(16, 10),
                                           momentum=0.9, centered=True)
        else:
            opt = paddle.optimizer.Adagrad(paddle.optimizer.lr.CosineAnnealingDecay(0.1, 10))
        return s._mlp_feed(), _ce(logits, y), logits, opt
    return build


def _ema():
    """ExponentialMovingAverage of the parameters, updated after each step."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.fc(x, 32, activation="relu")
    logits = paddle.static.nn.fc(h, 4)

    class WithEma:
        def minimize(self, loss):
            paddle.optimizer.Momentum(0.01, 0.9).minimize(loss)
            paddle.static.ExponentialMovingAverage(0.99).update()
    return s._mlp_feed(), _ce(logits, y), logits, WithEma()


def _wrapped(kind):
    """Fluid-era optimizer wrappers: ModelAverage beside SGD, LookAhead
    around SGD, RecomputeOptimizer with a checkpoint (Paddle's own
    recompute, then memopt), LarsMomentum."""
    def build():
        import paddle

        x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
        h = paddle.static.nn.fc(x, 32, activation="relu")
        h2 = paddle.static.nn.fc(h, 32, activation="relu")
        logits = paddle.static.nn.fc(h2, 4)
        inc = paddle.incubate.optimizer

        class Opt:
            def minimize(self, loss):
                if kind == "model_average":
                    paddle.optimizer.SGD(0.1).minimize(loss)
                    inc.ModelAverage(0.15, min_average_window=2, max_average_window=4) \
                        .minimize(loss)
                elif kind == "lookahead":
                    inc.LookAhead(paddle.optimizer.SGD(0.1), alpha=0.5, k=2).minimize(loss)
                elif kind == "recompute":
                    opt = inc.RecomputeOptimizer(paddle.optimizer.Momentum(0.1, 0.9))
                    opt._set_checkpoints([h])
                    opt.minimize(loss)
                else:
                    inc.LarsMomentumOptimizer(0.1, 0.9).minimize(loss)
        return s._mlp_feed(), _ce(logits, y), logits, Opt()
    return build


def _mlp_head(h, y, opt):
    """fc logits on ``h``, the cross-entropy loss, the MLP feed."""
    import paddle

    logits = paddle.static.nn.fc(h, 4)
    return s._mlp_feed(), _ce(logits, y), logits, opt


def _static_pylayer():
    """paddle.static.nn.static_pylayer with its own backward function."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.static_pylayer(lambda a: paddle.nn.functional.relu(a) * 2.0,
                                        [paddle.static.nn.fc(x, 16)],
                                        backward_fn=lambda g: g * 0.5)
    return _mlp_head(h, y, paddle.optimizer.SGD(0.05))


def _assign_output(batch=8):
    """Fluid's ``assign(x, output=acc)`` writing one variable twice, and a
    persistable step counter ``increment``-ed in place."""
    import paddle

    x, y = _data("x", [batch, 16]), _data("label", [batch, 1], "int64")
    counter = paddle.static.create_global_var([1], 0, "int64", persistable=True,
                                              name="step_counter")
    paddle.increment(counter)
    h = paddle.static.nn.fc(x, 32, activation="relu")
    acc = paddle.zeros([batch, 32], "float32")
    paddle.assign(paddle.static.nn.fc(h, 32) + acc, output=acc)
    paddle.assign(paddle.nn.functional.relu(acc) + h, output=acc)
    return _mlp_head(acc, y, paddle.optimizer.SGD(0.05))


def _static_nn_zoo(batch=4):
    """paddle.static.nn layers Fluid users had: conv2d_transpose,
    group_norm, prelu, instance_norm, bilinear_tensor_product."""
    import paddle

    img, y = _data("img", [-1, 4, 8, 8]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.conv2d_transpose(img, 8, filter_size=3, padding=1)
    h = paddle.static.nn.instance_norm(paddle.static.nn.prelu(
        paddle.static.nn.group_norm(h, 4), "channel"))
    v = paddle.flatten(paddle.nn.functional.adaptive_avg_pool2d(
        paddle.static.nn.conv2d(h, 8, 3, padding=1), 1), 1)
    b = paddle.static.nn.bilinear_tensor_product(v, paddle.static.nn.fc(v, 8), 8)
    logits = paddle.static.nn.fc(b, 4)

    def feed(rng):
        return {"img": rng.random((batch, 4, 8, 8), dtype=np.float32),
                "label": rng.integers(0, 4, (batch, 1)).astype("int64")}
    return feed, _ce(logits, y), logits, paddle.optimizer.Momentum(0.01, 0.9)


def _nce_dropout():
    """Noise-contrastive estimation (negative sampling with a fixed seed)
    beside a dropout: two random ops."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    cost = paddle.static.nn.nce(h, y, num_total_classes=50, num_neg_samples=5, seed=7)
    loss = paddle.mean(cost) + paddle.mean(paddle.nn.functional.dropout(h, 0.3))

    def feed(rng):
        return {"x": rng.random((8, 16), dtype=np.float32),
                "label": rng.integers(0, 50, (8, 1)).astype("int64")}
    return feed, loss, h, paddle.optimizer.SGD(0.05)


def _while_array(batch=8, steps=3):
    """A while loop writing each step's hidden state into a tensor array,
    the array stacked and averaged after it (trained through while_grad; a
    fixed batch: Paddle's while_grad fills the array's gradients with
    fill_constant of the declared shape)."""
    import paddle

    x, y = _data("x", [batch, 16]), _data("label", [batch, 1], "int64")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    fc = paddle.nn.Linear(16, 16)
    i = paddle.full([1], 0, "int64")
    n = paddle.full([1], steps, "int64")
    arr = paddle.tensor.create_array("float32")

    def body(i, h, arr):
        h = paddle.nn.functional.relu(fc(h))
        paddle.tensor.array_write(h, i, array=arr)
        return i + 1, h, arr

    _, h, arr = paddle.static.nn.while_loop(lambda i, h, arr: i < n, body, [i, h, arr])
    stacked, _ = paddle.tensor.manipulation.tensor_array_to_tensor(
        arr, axis=1, use_stack=True)
    logits = paddle.static.nn.fc(paddle.mean(stacked, axis=1), 4)
    return s._mlp_feed(), _ce(logits, y), logits, paddle.optimizer.SGD(0.05)


def _lstm_sentiment(batch=4, seq=6, vocab=60, d=16):
    """understand_sentiment's stacked LSTM written with today's API (the
    Fluid dynamic_lstm is gone): padded ids, sequence lengths, two stacked
    LSTMs, max-pool over time, fc softmax, Adam."""
    import paddle

    ids, y = _data("ids", [-1, seq], "int64"), _data("label", [-1, 1], "int64")
    lens = _data("lens", [-1], "int64")
    h = paddle.static.nn.embedding(ids, size=[vocab, d])
    h, _ = paddle.nn.LSTM(d, d, num_layers=2)(h, sequence_length=lens)
    pred = paddle.static.nn.fc(paddle.max(h, axis=1), 2, activation="softmax")
    loss = paddle.mean(paddle.nn.functional.cross_entropy(pred, y, use_softmax=False))

    def feed(rng):
        return {"ids": rng.integers(0, vocab, (batch, seq)).astype("int64"),
                "lens": rng.integers(1, seq + 1, (batch,)).astype("int64"),
                "label": rng.integers(0, 2, (batch, 1)).astype("int64")}
    return feed, loss, pred, paddle.optimizer.Adam(0.01)


MODELS = {
    "fit_a_line": _fit_a_line,
    "reshape_skip": _reshape_skip,
    "six_embeddings": _six_embeddings,
    "recognize_digits": _recognize_digits,
    "word2vec": _word2vec,
    "sentiment_conv": _sentiment,
    "sentiment_lstm": _lstm_sentiment,
    "seq2seq_gru": _seq2seq,
    "static_gradients": _static_gradients,
    "two_optimizers": _two_optimizers,
    "lamb_expdecay": _decayed("lamb"),
    "rmsprop_noam": _decayed("rmsprop"),
    "adagrad_cosine": _decayed("adagrad"),
    "ema": _ema,
    "model_average": _wrapped("model_average"),
    "lookahead": _wrapped("lookahead"),
    "recompute_optimizer": _wrapped("recompute"),
    "lars_momentum": _wrapped("lars"),
    "while_array": _while_array,
    "static_pylayer": _static_pylayer,
    "assign_output": _assign_output,
    "static_nn_zoo": _static_nn_zoo,
    "nce_dropout": _nce_dropout,
}
#: Feeds the prediction does not read (left out of the inference model).
LABELS = ("label", "y")


# -- the harness, extended ---------------------------------------------------------------------

def _persistables(program):
    """Every persistable dense tensor of ``program`` but feed/fetch."""
    from paddle.base import core

    return sorted(n for n, v in program.global_block().vars.items()
                  if v.persistable and v.type == core.VarDesc.VarType.DENSE_TENSOR
                  and n not in ("feed", "fetch"))


class UserBuilt(s.Built):
    """:class:`sweep_legacy.Built` of this script's programs: ``params`` is
    every persistable tensor, ``skip`` the program's own skip set (if any)."""

    def __init__(self, name, train=True, guard=True):
        import paddle

        paddle.enable_static()
        self.name = name
        self.main, self.startup = paddle.static.Program(), paddle.static.Program()
        names = paddle.utils.unique_name.guard() if guard else contextlib.nullcontext()
        with paddle.static.program_guard(self.main, self.startup), names:
            built = MODELS[name]()
            self.feed, self.loss, self.pred, opt = built[:4]
            self.extra = built[4] if len(built) > 4 else {}
            if train:
                opt.minimize(self.loss)
        self.params = _persistables(self.main)
        self.feed_names = sorted(n for n, v in self.main.global_block().vars.items()
                                 if getattr(v, "is_data", False))


def _an_activation(b):
    """The program's own skip set when it has one, else a middle forward
    temporary."""
    skip = getattr(b, "extra", {}).get("skip")
    return skip if skip else _default_activation(b)


def optimize(b, level, variant):
    """sweep_legacy.optimize with the program's own skip set, and a
    BudgetError checked to leave the program byte-identical."""
    import memopt

    before = b.main.desc.serialize_to_string()
    try:
        if variant == "B" and getattr(b, "extra", {}).get("skip"):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                report = memopt.memory_optimize(
                    b.main, level=1 if level == s.BUDGET else level, skip_grads=False,
                    skip_opt_set=set(b.extra["skip"]))
            return report, buf.getvalue()
        return _harness_optimize(b, level, variant)
    except memopt.BudgetError:
        if b.main.desc.serialize_to_string() != before:
            raise AssertionError("BudgetError left the program changed")
        raise


def _train(b, program=None, steps=s.STEPS, fetch=None, scope=None, variant="A"):
    """sweep_legacy.train, persistables the scope lacks left out."""
    import paddle

    scope = paddle.static.Scope() if scope is None else scope
    params = b.params
    b.params = [p for p in params if p in b.main.global_block().vars]
    try:
        with paddle.static.scope_guard(scope):
            out = _harness_train(b, program, steps, fetch, scope, variant)
    finally:
        b.params = params
    return out


def _save_inference(b, prefix):
    """sweep_legacy.save_inference trained with the GC off whatever the
    caller's mode (the unchanged while_array trains to other bits with the
    GC on than off: the saved models must come from one mode)."""
    with s.gc_mode("off"):
        return _harness_save_inference(b, prefix)


_harness_optimize, _harness_train = s.optimize, s.train
_harness_save_inference = s.save_inference
_default_activation = s._an_activation


def install():
    """Make sweep_legacy's harness run this module's programs (its
    ``Built``, ``optimize``, ``train``, ``save_inference`` replaced): done
    by the worker (``main``) and the inference child, never on import."""
    s.save_inference = _save_inference
    s.MODELS.update(MODELS)
    s.LABELS = tuple(set(s.LABELS) | set(LABELS))
    s.Built, s.optimize, s._an_activation, s.train = UserBuilt, optimize, _an_activation, _train
    s._LOAD_CHILD = s._LOAD_CHILD.replace(
        "import sweep_legacy as s",
        "import sweep_legacy_user\nsweep_legacy_user.install()\nimport sweep_legacy as s")


# -- workflows the harness lacks ---------------------------------------------------------------

def _run_steps(b, program, fetch, scope, steps=s.STEPS, runner=None):
    """``steps`` steps of ``program`` (or ``runner(exe, feed)``) in ``scope``:
    the fetches and every persistable afterwards."""
    import paddle

    rng = np.random.default_rng(1)
    with paddle.static.scope_guard(scope), s.gc_mode("on"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(b.startup)
        out = []
        for _ in range(steps):
            feed = b.feed(rng)
            got = runner(exe, feed) if runner else exe.run(program, feed=feed, fetch_list=fetch)
            out.append([np.array(a) for a in got])
        params = [np.array(scope.find_var(p).get_tensor()) for p in b.params
                  if scope.find_var(p) is not None
                  and scope.find_var(p).get_tensor()._is_initialized()]
    return out, params


def _optimized(name, level, guard=True):
    import memopt

    b = UserBuilt(name, guard=guard)
    memopt.memory_optimize(b.main, level=level, fetch_list=[b.loss, b.pred])
    return b


def check_compiled(name, level):
    """The rewritten program run through CompiledProgram with Paddle's own
    memory passes on trains as the unchanged one does (also compiled)."""
    import paddle

    outs = []
    for b in (UserBuilt(name), _optimized(name, level)):
        strategy = paddle.static.BuildStrategy()
        strategy.memory_optimize = True
        strategy.enable_inplace = True
        compiled = paddle.static.CompiledProgram(b.main, build_strategy=strategy)
        outs.append(_run_steps(b, compiled, [b.loss, b.pred], paddle.static.Scope()))
    return "ok" if s.same(*outs) else "DIFFERS"


def check_prune(name, level):
    """Executor.run(use_prune=True) fetching the prediction."""
    import paddle

    outs = []
    for b in (UserBuilt(name), _optimized(name, level)):
        outs.append(_run_steps(b, b.main, None, paddle.static.Scope(), runner=lambda exe, f, b=b:
                               exe.run(b.main, feed=f, fetch_list=[b.pred], use_prune=True)))
    return "ok" if s.same(*outs) else "DIFFERS"


def check_two_programs(name, level):
    """Two copies built with program_guard in one process, no
    unique_name.guard (the second copy's layer names go on counting), both
    rewritten, each trained equal to an unchanged twin built the same way."""
    import paddle
    import memopt

    with paddle.utils.unique_name.guard():
        ref = [UserBuilt(name, guard=False) for _ in range(2)]
    with paddle.utils.unique_name.guard():
        opt = [UserBuilt(name, guard=False) for _ in range(2)]
    for b in opt:
        memopt.memory_optimize(b.main, level=level, fetch_list=[b.loss, b.pred])
    for r, o in zip(ref, opt, strict=True):
        if not s.same(_run_steps(r, r.main, [r.loss, r.pred], paddle.static.Scope()),
                      _run_steps(o, o.main, [o.loss, o.pred], paddle.static.Scope())):
            return "DIFFERS"
    return "ok"


EXTRA = {"compiled": check_compiled, "prune": check_prune, "two": check_two_programs}


# -- programs fed from a reader, not by Executor.run(feed=) ------------------------------------

def _reader_mlp(before_net=lambda x, y: None):
    """x, label and an MLP's loss (Adam), in the current program_guard;
    ``before_net(x, y)`` runs before the net is built (a DataLoader's
    ``read`` op must come before the ops reading its outputs)."""
    import paddle

    x, y = _data("x", [-1, 16]), _data("label", [-1, 1], "int64")
    extra = before_net(x, y)
    h = paddle.static.nn.fc(paddle.static.nn.fc(x, 32, activation="relu"), 32,
                            activation="relu")
    loss = _ce(paddle.static.nn.fc(h, 4), y)
    paddle.optimizer.Adam(0.01).minimize(loss)
    return x, y, loss, extra


def _run_reader(kind, config, tmp):
    """Train the reader-fed MLP (``kind``: ``loader`` --
    DataLoader.from_generator(iterable=False); ``dataset`` --
    QueueDataset + Executor.train_from_dataset) rewritten per ``config``
    (None: unchanged): every persistable afterwards (and the losses)."""
    import paddle

    import memopt

    paddle.enable_static()
    rng = np.random.default_rng(0)
    batches = [(rng.random((8, 16), dtype=np.float32),
                rng.integers(0, 4, (8, 1)).astype("int64")) for _ in range(3)]
    scope = paddle.static.Scope()  # the loader's queue goes to the global scope: this one
    with paddle.static.scope_guard(scope), s.gc_mode("on"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            def make_loader(x, y):
                if kind != "loader":
                    return None
                made = paddle.base.io.DataLoader.from_generator(
                    feed_list=[x, y], capacity=4, iterable=False)
                made.set_batch_generator(lambda: iter(batches))
                return made

            x, y, loss, loader = _reader_mlp(make_loader)
        if config is not None:
            level, variant = config
            before = main.desc.serialize_to_string()
            kw = (dict(fetch_list=[loss], print_log=True) if variant == "A"
                  else dict(skip_grads=False))
            if level == s.BUDGET:
                kw.update(budget=10 ** 9, batch_size=8)
                level = 1
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    memopt.memory_optimize(main, level=level, **kw)
            except memopt.errors.MemoptError:
                if main.desc.serialize_to_string() != before:
                    raise AssertionError("refused, but the program changed") from None
                raise
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        out = []
        if kind == "loader":
            loader.start()
            out = [np.array(exe.run(main, fetch_list=[loss])[0]) for _ in batches]
            loader.reset()
        else:
            path = os.path.join(tmp, "data.txt")
            with open(path, "w") as f:
                for bx, by in batches:
                    for row, lab in zip(bx, by):
                        f.write("16 " + " ".join(repr(float(v)) for v in row) + f" 1 {lab[0]}\n")
            ds = paddle.distributed.QueueDataset()
            ds.init(batch_size=8, thread_num=1, pipe_command="cat", use_var=[x, y])
            ds.set_filelist([path])
            with contextlib.chdir(tmp):  # Paddle writes <id>_train_desc.prototxt here
                exe.train_from_dataset(main, ds, thread=1)
        return out + [np.array(scope.find_var(n).get_tensor()) for n in _persistables(main)
                      if scope.find_var(n) is not None]


def check_reader(kind):
    """Every configuration of a reader-fed program: ok / DIFFERS / the error."""
    import tempfile

    tmp = tempfile.mkdtemp(prefix="sweep_reader_")
    want = _run_reader(kind, None, tmp)
    out = {}
    for cfg in CONFIGS:
        level = s.BUDGET if cfg[1] == "B" and cfg[0] == "L" else int(cfg[1])
        got = s._try(_run_reader, kind, (level, cfg[2]), tmp)
        out[cfg] = {"train_gc_on": got if isinstance(got, str) else (
            "ok" if len(got) == len(want) and all(s.bits_equal(a, c)
                                                  for a, c in zip(want, got, strict=True))
            else "DIFFERS")}
    return out


READERS = {"data_loader_non_iterable": "loader", "train_from_dataset": "dataset"}


def check_user(name):
    if name in READERS:
        return check_reader(READERS[name])
    out = s.check_model(name, s.LEVELS + (s.BUDGET,))
    if "paddle" in out:
        return out
    for level in (1, 2):
        r = out.setdefault(f"L{level}A", {})
        for check, fn in EXTRA.items():
            r[check] = s._try(fn, name, level)
    return out


CONFIGS = ("L0A", "L0B", "L1A", "L1B", "L2A", "L2B", "LBA")



def main(argv):
    if argv[:1] != ["--check"] or len(argv) != 2:
        print("usage: sweep_legacy_user.py --check NAME (one program's checks, JSON)",
              file=sys.stderr)
        return 2
    install()
    print(json.dumps(check_user(argv[1])))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLAGS_enable_pir_api", "0")  # before Paddle is imported
    sys.exit(main(sys.argv[1:]))
