"""Sweep the workflows a user takes a rewritten program through, both IRs.

Derivations sweep_user_programs.py, sweep_legacy_user.py and
tests/memopt/paddle/test_fetch_trust.py do not cover: the deployment
predictor (``paddle.inference.Config`` + ``create_predictor``, IR optim on /
off, its own ``enable_memory_optim``) on a ``save_inference_model`` of the
rewritten program in a new process; desc round trips (``copy.deepcopy``,
clone of a clone, a clone with ops appended, ``serialize_program`` /
``deserialize_program`` + persistables, ``save_to_file`` /
``load_from_file``, ``normalize_program``, the legacy desc translated to
PIR); Executor variants (``use_prune=True``, every name fetched by string,
``return_numpy=False``, a second Executor with ``scope=`` a new Scope,
``CompiledProgram`` with ``BuildStrategy`` flags,
``load_program_state`` / ``set_program_state``); ``paddle.jit.load`` of a
PIR inference model; ``memopt optimize`` (CLI) on a saved model loaded and
run in a new process.

Each program (a CNN with BN + dropout, a small ResNet, a Transformer
encoder, an LSTM, a sparse-embedding CTR model, AMP O1, a while/cond
program, an inference-only program) is built twice; one copy is rewritten
(levels 0/1/2, ``budget=`` 0.9 of ``memopt.analyze``'s predicted peak) with
``fetch_list`` = its loss and logits, and every workflow is applied to both:
the rewritten one must give the same bytes and dtypes, or a memopt error
(a refused fetch of a name the rewrite merged counts as ok).  Cells:
``ok`` / ``ok (k refused)`` / ``refused: <message>`` / ``paddle fails
unchanged too`` / ``BUG: <error>``.

The cells are tests of ``test_sweep_workflows.py``, program x IR x GC x
configuration (a configuration's cell is every workflow: :func:`config_cell`);
each (program, IR, GC mode) runs in its own process
(``--one cnn_bn_dropout pir on`` prints one JSON object).  Legacy programs are built and run under ``OldIrGuard`` (as the
tests do): with ``FLAGS_enable_pir_api=0`` in the environment Paddle 3.3.1
cannot build the Transformer or the while program unchanged (``tanh():
argument (position 1) must be Value, but got Variable``).  The new process
loading legacy models does set it.
"""
import argparse
import contextlib
import copy
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 4
CONFIGS = ("L0", "L1", "L2", "budget0.9")
GC = {"on": 0.0, "off": -1.0}


# -- programs ----------------------------------------------------------------------
# builder(paddle, ir) -> (feed(rng) -> dict, [loss or output, logits], train?)

def _cnn_bn_dropout(paddle, ir):
    nn = paddle.nn
    x = paddle.static.data("image", [-1, 3, 16, 16], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(),
                      nn.MaxPool2D(2), nn.Conv2D(8, 8, 3, padding=1), nn.BatchNorm2D(8),
                      nn.ReLU(), nn.Flatten(), nn.Dropout(0.3))(x)
    logits = nn.Linear(8 * 8 * 8, 10)(h)
    loss = paddle.mean(nn.functional.cross_entropy(logits, y))
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)
    return (lambda rng: {"image": rng.standard_normal((BATCH, 3, 16, 16)).astype("float32"),
                         "label": rng.integers(0, 10, (BATCH, 1)).astype("int64")},
            [loss, logits], True)


def _resnet_small(paddle, ir):
    x = paddle.static.data("image", [-1, 3, 32, 32], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    logits = paddle.vision.models.resnet18(num_classes=10)(x)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
    paddle.optimizer.SGD(0.01).minimize(loss)
    return (lambda rng: {"image": rng.standard_normal((2, 3, 32, 32)).astype("float32"),
                         "label": rng.integers(0, 10, (2, 1)).astype("int64")},
            [loss, logits], True)


def _transformer(paddle, ir):
    if ir == "legacy":  # nn.TransformerEncoderLayer cannot build legacy programs (matmul():
        # "must be Value, but got Variable", unchanged): memopt.testing.models' einsum encoder
        from memopt.testing import models

        feed, fetch = models._transformer(ir, BATCH, {})
        paddle.optimizer.Adam(1e-3).minimize(fetch[0])
        return feed, fetch, True
    from memopt.testing.encoders import encoder_classifier

    feed, loss, logits = encoder_classifier(seq=8, d_model=32, vocab=50, classes=5)
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return (lambda rng: feed(rng, BATCH)), [loss, logits], True


def _lstm(paddle, ir):
    steps, vocab, hidden = 6, 50, 16
    ids = paddle.static.data("ids", [-1, steps], "int64")
    label = paddle.static.data("label", [-1, 1], "int64")
    out, _ = paddle.nn.LSTM(hidden, hidden)(paddle.nn.Embedding(vocab, hidden)(ids))
    logits = paddle.nn.Linear(hidden, 3)(paddle.nn.functional.relu(paddle.mean(out, axis=1)))
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
    paddle.optimizer.SGD(0.1).minimize(loss)
    return (lambda rng: {"ids": rng.integers(0, vocab, (BATCH, steps)).astype("int64"),
                         "label": rng.integers(0, 3, (BATCH, 1)).astype("int64")},
            [loss, logits], True)


def _ctr(paddle, ir):
    slots, vocab, dim = 4, 1000, 8
    ids = paddle.static.data("slot_ids", [-1, slots], "int64")
    dense = paddle.static.data("dense", [-1, 5], "float32")
    click = paddle.static.data("click", [-1, 1], "float32")
    emb = paddle.nn.Embedding(vocab, dim, sparse=True)(ids)
    h = paddle.concat([paddle.reshape(emb, [-1, slots * dim]), dense], axis=1)
    for width in (32, 16):
        h = paddle.nn.functional.relu(paddle.nn.Linear(h.shape[-1], width)(h))
    logit = paddle.nn.Linear(16, 1)(h)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, click))
    paddle.optimizer.Adam(1e-3).minimize(loss)
    return (lambda rng: {"slot_ids": rng.integers(0, vocab, (BATCH, slots)).astype("int64"),
                         "dense": rng.random((BATCH, 5), dtype=np.float32),
                         "click": rng.integers(0, 2, (BATCH, 1)).astype("float32")},
            [loss, logit], True)


def _amp_o1(paddle, ir):
    x = paddle.static.data("x", [-1, 32], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Linear(32, 64)(x))
    logits = paddle.nn.Linear(64, 4)(h)
    loss = paddle.mean(logits * logits)
    paddle.static.amp.decorate(paddle.optimizer.Adam(1e-3), level="O1",
                               dtype="bfloat16").minimize(loss)
    return (lambda rng: {"x": rng.standard_normal((BATCH, 32)).astype("float32")},
            [loss, logits], True)


def _while_cond(paddle, ir):
    if ir == "legacy":  # paddle.tanh cannot build legacy programs (unchanged): the
        # while loop of memopt.testing.models (ReLU layer + residual)
        from memopt.testing import models

        feed, fetch = models._while_loop(ir, BATCH, {})
        paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(fetch[0])
        return feed, fetch, True
    x = paddle.static.data("x", [-1, 16], "float32")
    # (an activation right before the loop: Paddle 3.3.1's PIR executor fails
    # the unchanged program, GC on: "Tensor holds no memory")
    h = paddle.nn.Linear(16, 16)(x)
    lin2 = paddle.nn.Linear(16, 16)
    i, n = paddle.full([1], 0, "int64"), paddle.full([1], 3, "int64")
    _, h = paddle.static.nn.while_loop(lambda i, v: i < n,
                                       lambda i, v: (i + 1, paddle.tanh(lin2(v)) + v), [i, h])
    if ir == "pir":
        h = paddle.static.nn.cond(paddle.mean(h) > 0, lambda: paddle.nn.functional.relu(h) * 2,
                                  lambda: paddle.nn.functional.sigmoid(h) - 1)
    logits = paddle.nn.Linear(16, 2)(h)
    loss = paddle.mean(logits * logits)
    paddle.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)
    return (lambda rng: {"x": rng.standard_normal((BATCH, 16)).astype("float32")},
            [loss, logits], True)


def _inference_only(paddle, ir):
    x = paddle.static.data("image", [-1, 3, 16, 16], "float32")
    nn = paddle.nn
    net = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(),
                        nn.Conv2D(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, 4))
    net.eval()
    out = nn.functional.softmax(net(x))
    return (lambda rng: {"image": rng.standard_normal((BATCH, 3, 16, 16)).astype("float32")},
            [out, out], False)


PROGRAMS = {"cnn_bn_dropout": _cnn_bn_dropout, "resnet_small": _resnet_small,
            "transformer": _transformer, "lstm": _lstm, "ctr": _ctr, "amp_o1": _amp_o1,
            "while_cond": _while_cond, "inference_only": _inference_only}


#: (program, IR) -> why Paddle cannot save it (unchanged): a save would
#: abort the worker.
PADDLE_CANNOT_SAVE = {("while_cond", "pir"): "paddle.static.save / save_inference_model abort "
                      "(SIGABRT: 'Destroyed a op_result that is still in use by "
                      "pd_op.matmul_grad ... cf.tuple_pop')"}


class Built:
    """One build of a program: main, startup, feed, fetch (loss, logits), ir."""

    def __init__(self, paddle, name, ir):
        from memopt.testing import models

        self.ir, self.name = ir, name
        with models.ir_guard(ir):
            self.main, self.startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(self.main, self.startup), \
                    paddle.utils.unique_name.guard():
                self.feed, self.fetch, self.train = PROGRAMS[name](paddle, ir)
        self.feed_names = sorted(self.feed(np.random.default_rng(0)))
        self.infer_feed = [n for n in self.feed_names if n not in ("label", "click")]

    def guard(self):
        from memopt.testing import models

        return models.ir_guard(self.ir)

    def init(self, exe):
        import paddle

        paddle.seed(1)
        with self.guard():
            exe.run(self.startup)


# -- helpers --------------------------------------------------------------------------

def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        return a.dtype == b.dtype and a.shape == b.shape and \
            all(x is None and y is None for x, y in zip(a.flat, b.flat))
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def one_line(e):
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:160]


def legacy_names(program):
    """Block 0's dense tensors a user can see, without feeds, holders and
    memopt's own buffers."""
    from paddle.base import core

    unwritten = {n for op in program.global_block().ops
                 if op.type == "batch_norm" and op.desc.has_attr("is_test")
                 and op.desc.attr("is_test")
                 for slot in ("SavedMean", "SavedVariance", "ReserveSpace")
                 if slot in op.output_names for n in op.output(slot)}  # eval mode
    out = []
    for name, var in program.global_block().vars.items():
        if name in unwritten:
            continue
        if name.startswith("memopt@") or name in ("feed", "fetch") or var.persistable:
            continue
        if var.desc.type() != core.VarDesc.VarType.DENSE_TENSOR or var.desc.need_check_feed():
            continue
        out.append(name)
    return sorted(out)


def pir_where(program):
    """(op index, result index) of the top block's non-persistable dense results."""
    out = []
    for k, op in enumerate(program.global_block().ops):
        if op.name().startswith("builtin.") or op.name() in ("pd_op.data", "pd_op.fetch"):
            continue
        for r in range(op.num_results()):
            v = op.result(r)
            if v.initialized() and any(u.name() == "builtin.shadow_output"
                                       for u in v.all_used_ops()):
                continue
            if v.initialized() and v.is_dense_tensor_type() and not v.persistable:
                out.append((k, r))
    return out


def refusal(e):
    from memopt.errors import MemoptError

    return isinstance(e, MemoptError)


class Outcome(Exception):
    """A cell's verdict raised from inside a workflow."""


def compare(want, got):
    """Bit-identical (bytes, dtype, shape) on every key both have; the
    rewritten program may lack only what it refused (a merged name, an
    overwritten value, or ops built on one)."""
    keys = [k for k in want if k != "@refused"]
    common = [k for k in keys if k in got]
    extra = [k for k in got if k != "@refused" and k not in want]
    bad = [k for k in common if not same(want[k], got[k])]
    if bad:
        return "BUG: differs at " + ", ".join(map(str, bad[:3]))
    if extra or not common:
        return f"BUG: keys {extra[:3]} / nothing compared"
    n = len(keys) - len(common) + len(got.get("@refused", []))
    return "ok" if not n else f"ok ({n} refused)"


def refused_names(got):
    return set(got.get("@refused", []))


def fetch_each(exe, program, feed, names, **kw):
    """Fetch ``names`` one run; on a memopt refusal fetch one by one and
    collect the refused names under ``@refused``.  Run with paddle.seed(1)."""
    import paddle

    from memopt.errors import MergedVariableError

    out, refused = {}, []
    try:
        paddle.seed(1)
        vals = exe.run(program, feed=feed, fetch_list=list(names), **kw)
        out.update({n: np.array(v) for n, v in zip(names, vals)})
    except MergedVariableError:
        for n in names:
            try:
                paddle.seed(1)
                out[n] = np.array(exe.run(program, feed=feed, fetch_list=[n], **kw)[0])
            except MergedVariableError as e:
                if str(n) not in str(e) and not isinstance(n, paddle.pir.Value):
                    raise Outcome(f"BUG: refusal of {n} does not name it: {one_line(e)}")
                refused.append(n)
    out["@refused"] = refused
    return out


# -- running a program -----------------------------------------------------------------

def run_fresh(b, program, fetch, steps=1, scope=None, exe=None, **kw):
    """Parameters from the seeded startup program in ``scope`` (a new one by
    default), ``steps`` runs of ``program`` (paddle.seed(1) before each),
    the last one fetching ``fetch``; ``{fetch item: array}``."""
    import paddle

    scope = paddle.static.Scope() if scope is None else scope
    feed = b.feed(np.random.default_rng(3))
    with paddle.static.scope_guard(scope), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace()) if exe is None else exe
        b.init(exe)
        out = None
        for _ in range(steps):
            paddle.seed(1)
            out = exe.run(program, feed=feed, fetch_list=list(fetch), **kw)
    return {k: np.array(v) for k, v in zip(_keys(fetch), out)}


def _keys(fetch):
    return [f if isinstance(f, str) else f"#{i}" for i, f in enumerate(fetch)]


def visible(b, program, look=None):
    """What a user can fetch from ``program`` (derived from ``b.main``;
    ``look`` maps a Value of ``b.main`` to ``program``'s).  Legacy: the
    names of the unchanged program.  PIR: the loss and logits, and the top
    block's values of the unchanged program found in ``program`` by their
    computation (:func:`pir_where_map`).  Returns
    (fetchable, expected refusals, keys): a name the rewrite merged away /
    a value it writes over must be refused (at most 3 are tried)."""
    from memopt.paddle.pir import rewrite as pir_rewrite

    if b.ir == "legacy":
        names = [n for n in legacy_names(b.ref_main) if n not in getattr(b, "exclude", ())]
        block = program.global_block()
        ok = [n for n in names if block.has_var(n)]
        return ok, [n for n in names if not block.has_var(n)][:3], ok
    look = look or (lambda v: v)
    items, keys = [look(b.fetch[0]), look(b.fetch[1])], ["loss", "logits"]
    bad = []
    ops = program.global_block().ops
    for key, (k, r) in b.where.items():
        v = ops[k].result(r)
        if pir_rewrite.overwritten_by(v) is not None:
            bad.append(v)
        else:
            items.append(v)
            keys.append(key)
    return items, bad[:3], keys


def pir_signatures(program):
    """``{signature: (op index, result index)}`` of the top block's results:
    a signature is the op's name without the in-place ``_``, its attributes
    (memopt's marks left out) and its operands' signatures -- the same
    computation in the unchanged and the rewritten program (ops reordered,
    made in place or recomputed) has the same one."""
    import hashlib

    sig_of, out = {}, {}
    for k, op in enumerate(program.global_block().ops):
        attrs = {a: str(v) for a, v in op.attrs().items()
                 if not a.startswith("memopt")
                 and a not in ("op_callstack", "stop_gradient", "struct_name")}
        operands = []
        for i in range(op.num_operands()):
            src = op.operand_source(i)
            operands.append(sig_of.get(src.id, "?") if src.initialized() else "-")
        base = hashlib.sha1(repr((op.name().rstrip("_"), sorted(attrs.items()),
                                  operands)).encode()).hexdigest()
        for r in range(op.num_results()):
            sig = f"{base}.{r}"
            sig_of[op.result(r).id] = sig
            out.setdefault(sig, (k, r))
    return out


def pir_where_map(ref_main, main):
    """``{"k.r" of the unchanged program: (k', r) in main}`` for every
    fetchable value of the unchanged program main computes too."""
    theirs = pir_signatures(main)
    mine = {pos: sig for sig, pos in pir_signatures(ref_main).items()}
    out = {}
    ops = ref_main.global_block().ops
    for k, r in pir_where(ref_main):
        if ops[k].name().rstrip("_") == "pd_op.batch_norm" and r >= 3 \
                and ops[k].attrs().get("is_test"):
            continue  # saved mean / variance / reserve space: not written in eval mode
        if any(use.name() == "pd_op.while" and use.operand_source(0).is_same(ops[k].result(r))
               for use in ops[k].result(r).all_used_ops()):
            # a while's initial condition: Paddle 3.3.1's while writes each
            # trip's condition into it, and a fetch of it races with the loop
            # in the unchanged program too (True, False in 4 of 160 runs of
            # this sweep's while_cond program, GC off, memopt not imported)
            continue
        sig = mine.get((k, r))
        if sig in theirs:
            out[f"{k}.{r}"] = theirs[sig]
    return out


def fetch_visible(b, program, look=None, steps=1, **kw):
    """Run ``program``: every fetchable thing in one run, each expected
    refusal alone (it must raise a memopt error naming it)."""
    from memopt.errors import MemoptError

    items, bad, keys = visible(b, program, look)
    got = run_fresh(b, program, items, steps=steps, **kw)
    got = dict(zip(keys, got.values()))
    refused = []
    for item in bad:
        try:
            run_fresh(b, program, [item], steps=steps, **kw)
        except MemoptError as e:
            if b.ir == "legacy" and item not in str(e):
                raise Outcome(f"BUG: refusal of {item} does not name it: {one_line(e)}")
            refused.append(str(item) if b.ir == "legacy" else "value")
            continue
        raise Outcome(f"BUG: {item} fetched, no refusal")
    got["@refused"] = refused
    return got


# -- workflows: f(b, program, tmp) -> {key: array} ----------------------------------------
# ``program`` is b.main (the unchanged or the rewritten build); the same
# workflow runs on both builds and the results are compared.

def wf_deepcopy(b, p, tmp):
    with b.guard():
        q = copy.deepcopy(p)
    if b.ir == "pir":
        raise Outcome("n/a: no Value map for a deepcopy")
    return fetch_visible(b, q)


def wf_clone_clone(b, p, tmp):
    import paddle

    with b.guard():
        if b.ir == "legacy":
            return fetch_visible(b, p.clone().clone(for_test=False))
        m1, m2 = paddle.pir.IrMapping(), paddle.pir.IrMapping()
        q = p.clone(m1).clone(m2)
    return fetch_visible(b, q, lambda v: m2.look_up(m1.look_up(v)))


def wf_clone_ops(b, p, tmp):
    """A clone with a scale by 2 of every fetchable float tensor appended (ops that
    read them after the program's own last op)."""
    import paddle

    with b.guard():
        if b.ir == "legacy":
            q, look = p.clone(), None
        else:
            m = paddle.pir.IrMapping()
            q = p.clone(m)
            look = m.look_up
        items, _, keys = visible(b, q, look)
        if b.ir == "legacy":
            items = [q.global_block().var(n) for n in items]
        pairs = [(k, v) for k, v in zip(keys, items) if k in b.written_floats]
        with paddle.static.program_guard(q):
            sums = [paddle.scale(v, 2.0) for _, v in pairs]
    got = run_fresh(b, q, sums)
    return {k: v for (k, _), v in zip(pairs, got.values())}


def _infer_vars(b, p):
    if b.ir == "legacy":
        block = p.global_block()
        return [block.var(n) for n in b.infer_feed], [block.var(b.fetch[1].name)]
    data = [op.result(0) for op in p.global_block().ops
            if op.name() == "pd_op.data" and op.attrs()["name"] in b.infer_feed]
    return data, [b.fetch[1]]


def wf_parse(b, p, tmp):
    from paddle.base.framework import Program as LegacyProgram

    return fetch_visible(b, LegacyProgram.parse_from_string(p.desc.serialize_to_string()))


def _run_inference(b, program, exe, fetch):
    import paddle

    feed = {k: v for k, v in b.feed(np.random.default_rng(3)).items() if k in b.infer_feed}
    paddle.seed(1)
    return {f"#{i}": np.array(v) for i, v in
            enumerate(exe.run(program, feed=feed, fetch_list=fetch))}


def wf_serialize(b, p, tmp, files=False):
    import paddle

    with paddle.static.scope_guard(paddle.static.Scope()), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        b.init(exe)
        feeds, fetch = _infer_vars(b, p)
        desc = paddle.static.serialize_program(feeds, fetch, program=p)
        params = paddle.static.serialize_persistables(feeds, fetch, exe, program=p)
        if files:
            paddle.static.save_to_file(os.path.join(tmp, b.tag + ".pdmodel"), desc)
            paddle.static.save_to_file(os.path.join(tmp, b.tag + ".pdiparams"), params)
            desc = paddle.static.load_from_file(os.path.join(tmp, b.tag + ".pdmodel"))
            params = paddle.static.load_from_file(os.path.join(tmp, b.tag + ".pdiparams"))
    with paddle.static.scope_guard(paddle.static.Scope()), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        q = paddle.static.deserialize_program(desc)
        paddle.static.deserialize_persistables(q, params, exe)
        return _run_inference(b, q, exe, [fetch[0].name])


def wf_files(b, p, tmp):
    return wf_serialize(b, p, tmp, files=True)


def wf_normalize(b, p, tmp):
    import paddle

    with b.guard():
        feeds, fetch = _infer_vars(b, p)
        q = paddle.static.normalize_program(p, feeds, fetch)
    if b.ir == "pir":
        raise Outcome("n/a: PIR normalize_program returns no Value map")
    with paddle.static.scope_guard(paddle.static.Scope()), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        b.init(exe)
        return _run_inference(b, q, exe, [fetch[0].name])


def wf_use_prune(b, p, tmp):
    return run_fresh(b, p, [b.fetch[1].name if b.ir == "legacy" else b.fetch[1]],
                     use_prune=True)


def wf_return_tensor(b, p, tmp):
    return fetch_visible(b, p, return_numpy=False)


def wf_exe2_scope(b, p, tmp):
    """A second Executor, ``scope=`` a new Scope (not scope_guard); 2 steps."""
    import paddle

    with b.guard():
        scope = paddle.static.Scope()
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(b.startup, scope=scope)
        exe2 = paddle.static.Executor(paddle.CPUPlace())
        feed = b.feed(np.random.default_rng(3))
        items, _, keys = visible(b, p)
        for _ in range(2):
            paddle.seed(1)
            out = exe2.run(p, feed=feed, fetch_list=items, scope=scope)
    return {k: np.array(v) for k, v in zip(keys, out)}


def compiled(**flags):
    def wf(b, p, tmp):
        import paddle

        with b.guard():
            bs = paddle.static.BuildStrategy()
            for k, v in flags.items():
                setattr(bs, k, v)
            cp = paddle.static.CompiledProgram(p, build_strategy=bs)
        items, _, keys = visible(b, p)
        got = run_fresh(b, cp, items, steps=2)
        return dict(zip(keys, got.values()))
    return wf


def wf_program_state(b, p, tmp):
    """1 step, paddle.static.save; a new scope: set_program_state(load_program_state),
    1 more step fetching every visible thing; then every saved parameter."""
    import paddle

    prefix = os.path.join(tmp, "state_" + b.tag)
    scope = paddle.static.Scope()
    run_fresh(b, p, [b.fetch[0]] if b.ir == "pir" else [b.fetch[0].name], scope=scope)
    with paddle.static.scope_guard(scope), b.guard():
        paddle.static.save(p, prefix)
    items, _, keys = visible(b, p)
    scope2 = paddle.static.Scope()
    with paddle.static.scope_guard(scope2), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        b.init(exe)  # set_program_state sets what the startup program made
        state = paddle.static.load_program_state(prefix)
        paddle.static.set_program_state(p, state)
        paddle.seed(1)
        out = exe.run(p, feed=b.feed(np.random.default_rng(3)), fetch_list=items)
        got = {k: np.array(v) for k, v in zip(keys, out)}
        for n in sorted(state):
            if scope2.find_var(n) is not None:
                got["param:" + n] = np.array(scope2.find_var(n).get_tensor())
    return got


def wf_to_pir(b, p, tmp):
    """The legacy desc translated to PIR and run by the PIR executor (2
    steps); loss and logits fetched through the translation's name map."""
    import paddle

    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        b.init(exe)
    from memopt.testing import models

    with models.ir_guard("pir"):
        q, mapping = paddle.pir.translate_to_pir_with_param_map(p.desc)
    names = [n for n in (b.fetch[0].name, b.fetch[1].name) if n in mapping]
    values = [mapping[n][0] if isinstance(mapping[n], list) else mapping[n] for n in names]
    feed = b.feed(np.random.default_rng(3))
    with paddle.static.scope_guard(scope), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        out = None
        for _ in range(2):
            paddle.seed(1)
            out = exe.run(q, feed=feed, fetch_list=values)
    return {n: np.array(v) for n, v in zip(names, out)}


LEGACY_FLOWS = {
    "deepcopy": wf_deepcopy, "clone(clone)": wf_clone_clone, "clone+ops": wf_clone_ops,
    "parse_from_string": wf_parse, "serialize_program": wf_serialize,
    "save_to_file": wf_files, "normalize_program": wf_normalize, "use_prune": wf_use_prune,
    "return_numpy=False": wf_return_tensor, "exe2+scope=": wf_exe2_scope,
    "Compiled": compiled(), "Compiled inplace+memopt": compiled(enable_inplace=True,
                                                                 memory_optimize=True),
    "Compiled fuse_*": compiled(fuse_elewise_add_act_ops=True, fuse_bn_act_ops=True,
                                fuse_bn_add_act_ops=True, fuse_broadcast_ops=True),
    "program_state": wf_program_state, "translate_to_pir": wf_to_pir,
}
PIR_FLOWS = {
    "clone(clone)": wf_clone_clone, "clone+ops": wf_clone_ops, "use_prune": wf_use_prune,
    "return_numpy=False": wf_return_tensor, "exe2+scope=": wf_exe2_scope,
    "Compiled": compiled(), "Compiled inplace+memopt": compiled(enable_inplace=True,
                                                                 memory_optimize=True),
    "program_state": wf_program_state,
}


# -- a new process: the predictor, load_inference_model, jit.load, the CLI's files ----------

CHILD = textwrap.dedent(r"""
    import json, os, sys
    job = json.load(open(sys.argv[1]))
    if job["ir"] == "legacy":
        os.environ["FLAGS_enable_pir_api"] = "0"
    import numpy as np, paddle
    from paddle.base import core
    feed = dict(np.load(job["feed"]))
    out, errors = {}, {}

    def keep(key, fn):
        try:
            for i, v in enumerate(fn()):
                out[f"{key}#{i}"] = np.array(v)
        except Exception as e:
            errors[key] = (type(e).__name__ + ": " + str(e)).replace("\n", " ")[-300:]

    def predictor(prefix, variant):
        model = prefix + (".json" if job["ir"] == "pir" else ".pdmodel")
        config = paddle.inference.Config(model, prefix + ".pdiparams")
        config.disable_gpu()
        if variant == "no_ir_optim":
            config.switch_ir_optim(False)
        if variant == "memory_optim":
            config.enable_memory_optim()
        if variant == "memory_optim+no_ir_optim":
            config.enable_memory_optim()
            config.switch_ir_optim(False)
        pred = paddle.inference.create_predictor(config)
        for name in pred.get_input_names():
            pred.get_input_handle(name).copy_from_cpu(feed[name])
        pred.run()
        return [pred.get_output_handle(n).copy_to_cpu() for n in pred.get_output_names()]

    def static_load(prefix):
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            program, feeds, targets = paddle.static.load_inference_model(prefix, exe)
            return exe.run(program, feed={k: feed[k] for k in feeds}, fetch_list=targets)

    def jit_load(prefix):
        paddle.disable_static()
        try:
            layer = paddle.jit.load(prefix)
            names = job["infer_feed"]
            res = layer(*[paddle.to_tensor(feed[n]) for n in names])
            res = res if isinstance(res, (list, tuple)) else [res]
            return [r.numpy() for r in res]
        finally:
            paddle.enable_static()

    def cli_steps(spec):
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            if job["ir"] == "legacy":
                program = paddle.static.Program.parse_from_string(open(spec["path"], "rb").read())
                paddle.static.load(program, spec["params"], exe)
                fetch = job["fetch_names"]
            else:
                program = paddle.static.Program()
                core.deserialize_pir_program(spec["path"], program, -1)
                for name, array in paddle.static.load_program_state(spec["params"]).items():
                    scope.var(name).get_tensor().set(array, paddle.CPUPlace())
                fetch = []
            res = []
            for _ in range(2):
                paddle.seed(1)
                res = exe.run(program, feed=feed, fetch_list=fetch)
            state = sorted(paddle.static.load_program_state(spec["params"]))
            return list(res) + [np.array(scope.find_var(n).get_tensor()) for n in state]

    for tag, prefix in job["inference"].items():
        for variant in ("ir_optim", "no_ir_optim", "memory_optim", "memory_optim+no_ir_optim"):
            keep(f"{tag}/predictor {variant}", lambda: predictor(prefix, variant))
        keep(f"{tag}/load_inference_model", lambda: static_load(prefix))
        if job["ir"] == "pir":
            keep(f"{tag}/jit.load", lambda: jit_load(prefix))
    for tag, spec in job["cli"].items():
        keep(f"{tag}/cli optimize", lambda: cli_steps(spec))
    np.savez(job["out"], **out)
    json.dump(errors, open(job["out"] + ".json", "w"))
""")


def _env(gc):
    env = dict(os.environ, GLOG_minloglevel="2", FLAGS_eager_delete_tensor_gb=str(GC[gc]),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("FLAGS_enable_pir_api", None)
    return env


def _cli_args(config, b):
    if config.startswith("budget"):
        args = ["--level", "1", "--budget", str(b.budget), "-b", str(BATCH)]
    else:
        args = ["--level", config[1]]
    if b.ir == "legacy":
        args += ["--fetch", b.fetch[0].name, b.fetch[1].name]
    return args


def prepare_child(paddle, b, tmp, job, config):
    """save_inference_model of ``b`` (its logits) and, for the unchanged
    build, paddle.static.save of it and ``memopt optimize`` of that file."""
    from memopt import cli

    prefix = os.path.join(tmp, f"infer_{b.tag}")
    with paddle.static.scope_guard(paddle.static.Scope()), b.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        b.init(exe)
        feeds, fetch = _infer_vars(b, b.main)
        paddle.static.save_inference_model(prefix, feeds, fetch, exe, program=b.main)
        job["inference"][b.tag] = prefix
        if b.tag == "ref" and b.train:
            saved = os.path.join(tmp, "ref_saved")
            paddle.static.save(b.main, saved)
            ext = ".pdmodel" if b.ir == "legacy" else ".json"
            job["cli"]["ref"] = {"path": saved + ext, "params": saved}
            job["saved"] = (saved, ext)
    if b.tag != "ref" and b.train and "saved" in job:
        saved, ext = job["saved"]
        out = os.path.join(tmp, f"cli_{config}{ext}")
        args = _cli_args(config, b)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["-q", "optimize", saved + ext, *args, "-o", out])
        smallest = re.search(r"smallest budget memopt can fit at this batch is ([0-9.]+) KiB",
                             err.getvalue())
        if code == 1 and smallest:  # the saved program (no fetch_list) needs another budget
            args[args.index("--budget") + 1] = str(int(float(smallest.group(1)) * 1024 * 1.02))
            with contextlib.redirect_stderr(err):
                code = cli.main(["-q", "optimize", saved + ext, *args, "-o", out])
        if code:
            job["cli_errors"][config] = f"exit {code}: " + err.getvalue().strip()[-200:]
        else:
            job["cli"][b.tag] = {"path": out, "params": saved}


# -- the worker ---------------------------------------------------------------------------

def optimize(paddle, memopt, b, config):
    """Rewrite ``b.main``; ``budget0.9``: 0.9 of analyze's predicted peak, or
    (when BudgetError says that cannot fit) the smallest budget it names."""
    kw = dict(fetch_list=list(b.fetch))
    with b.guard():
        if not config.startswith("budget"):
            return memopt.memory_optimize(b.main, level=int(config[1]), **kw), ""
        peak = memopt.analyze(b.main, BATCH, fetch_list=list(b.fetch)).total_peak(BATCH)
        b.budget = int(0.9 * peak)
        try:
            return memopt.memory_optimize(b.main, budget=b.budget, batch_size=BATCH, **kw), ""
        except memopt.BudgetError as e:
            b.budget = e.smallest_budget
            note = f"0.9 x peak refused (BudgetError); smallest_budget {e.smallest_budget}"
            return memopt.memory_optimize(b.main, budget=b.budget, batch_size=BATCH, **kw), note


def verdict(run_ref, run_opt):
    try:
        want = run_ref()
    except Outcome as o:
        return str(o)
    except Exception as e:  # noqa: BLE001
        want = e
    try:
        got = run_opt()
    except Outcome as o:
        return str(o)
    except Exception as e:  # noqa: BLE001
        if isinstance(want, Exception):
            return "paddle fails unchanged too: " + one_line(want)[:80]
        if refusal(e):
            return "refused: " + one_line(e)
        return "BUG: " + one_line(e) + " | " + traceback.format_exc().splitlines()[-3][:120]
    if isinstance(want, Exception):
        return "BUG: unchanged program fails, rewritten runs: " + one_line(want)[:80]
    return compare(want, got)


def worker(name, ir, gc):
    import paddle

    import memopt
    from memopt.testing import models

    paddle.enable_static()
    flows = LEGACY_FLOWS if ir == "legacy" else PIR_FLOWS
    rows = {}
    tmp = tempfile.mkdtemp(prefix="sweep_wf_")
    job = {"ir": ir, "inference": {}, "cli": {}, "cli_errors": {}, "feed": "", "skipped": [],
           "out": os.path.join(tmp, "child")}
    with models.flags(eager_delete_tensor_gb=GC[gc]):
        for config in CONFIGS:
            try:
                ref, opt = Built(paddle, name, ir), Built(paddle, name, ir)
            except Exception as e:  # noqa: BLE001
                rows[("build", config)] = "paddle fails unchanged too: " + one_line(e)[:100]
                continue
            ref.tag, opt.tag = "ref", config
            ref.ref_main = opt.ref_main = ref.main
            try:
                _, note = optimize(paddle, memopt, opt, config)
                if note:
                    rows[("optimize", config)] = "ok: " + note
            except Exception as e:  # noqa: BLE001
                rows[("optimize", config)] = ("refused: " if refusal(e) else "BUG: ") + \
                    one_line(e)
                job["skipped"].append(config)
                continue
            if ir == "pir":
                ref.where = pir_where_map(ref.main, ref.main)
                opt.where = pir_where_map(ref.main, opt.main)
            try:
                ref_values = fetch_visible(ref, ref.main)  # what holds data: clone+ops reads it
            except Exception as e:  # noqa: BLE001
                if ir != "pir":
                    raise
                # the unchanged program cannot fetch every value: loss and logits only
                rows[("fetch every value", config)] = "paddle fails unchanged too: " + \
                    one_line(e)[:100]
                ref.where = opt.where = {}
                ref_values = fetch_visible(ref, ref.main)
            again = fetch_visible(ref, ref.main)
            unstable = {k for k in ref_values if k != "@refused"
                        and not same(ref_values[k], again.get(k))}
            if unstable:  # uninitialized outputs (batch_norm's saved_mean in eval mode)
                rows[("unchanged differs run to run", config)] = \
                    f"{len(unstable)} left out: " + ", ".join(sorted(unstable)[:3])
                ref.exclude = opt.exclude = unstable
                if ir == "pir":
                    ref.where = {k: v for k, v in ref.where.items() if k not in unstable}
                    opt.where = {k: v for k, v in opt.where.items() if k not in unstable}
                ref_values = {k: v for k, v in ref_values.items() if k not in unstable}
            ref.written_floats = opt.written_floats = {
                k for k, v in ref_values.items() if k != "@refused" and v.dtype == np.float32}
            rows[("program", config)] = verdict(lambda: fetch_visible(ref, ref.main),
                                                lambda: fetch_visible(opt, opt.main))
            for flow, fn in flows.items():
                if flow == "program_state" and (name, ir) in PADDLE_CANNOT_SAVE:
                    rows[(flow, config)] = "paddle fails unchanged too: " + \
                        PADDLE_CANNOT_SAVE[(name, ir)]
                    continue
                rows[(flow, config)] = verdict(lambda: fn(ref, ref.main, tmp),
                                               lambda: fn(opt, opt.main, tmp))
            if (name, ir) in PADDLE_CANNOT_SAVE:
                rows[("new process", config)] = "paddle fails unchanged too: " + \
                    PADDLE_CANNOT_SAVE[(name, ir)]
                continue
            if not job["feed"]:
                job["feed"] = os.path.join(tmp, "feed.npz")
                np.savez(job["feed"], **ref.feed(np.random.default_rng(3)))
                job["infer_feed"] = ref.infer_feed
                job["fetch_names"] = [f.name for f in ref.fetch] if ir == "legacy" else []
                try:
                    prepare_child(paddle, ref, tmp, job, "ref")
                except Exception as e:  # noqa: BLE001
                    rows[("child setup", "ref")] = "paddle fails unchanged too: " + one_line(e)
            try:
                prepare_child(paddle, opt, tmp, job, config)
            except Exception as e:  # noqa: BLE001
                rows[("save_inference_model", config)] = \
                    ("refused: " if refusal(e) else "BUG: ") + one_line(e)
    if not job["inference"]:
        return rows
    job_path = os.path.join(tmp, "job.json")
    json.dump(job, open(job_path, "w"))
    with open(os.path.join(tmp, "child.py"), "w") as f:
        f.write(CHILD)
    done = subprocess.run([sys.executable, os.path.join(tmp, "child.py"), job_path],
                          env=_env(gc), capture_output=True, text=True, timeout=1200)
    if done.returncode:
        rows[("new process", "all")] = "BUG: child failed " + done.stderr.strip()[-200:]
    else:
        got = dict(np.load(job["out"] + ".npz"))
        errors = json.load(open(job["out"] + ".json"))
        kinds = sorted({k.split("/", 1)[1].split("#")[0] for k in list(got) + list(errors)})
        for config in CONFIGS:
            if config in job["skipped"]:
                continue
            for kind in kinds:
                want = {k.split("/", 1)[1]: v for k, v in got.items()
                        if k.startswith("ref/" + kind + "#")}
                have = {k.split("/", 1)[1]: v for k, v in got.items()
                        if k.startswith(config + "/" + kind + "#")}
                e_ref, e_opt = errors.get("ref/" + kind), errors.get(config + "/" + kind)
                if kind == "cli optimize" and config in job["cli_errors"]:
                    cell = "BUG: cli " + job["cli_errors"][config]
                elif e_ref and e_opt:
                    cell = "paddle fails unchanged too: " + e_ref[:80]
                elif e_opt:
                    cell = ("refused: " if "Memopt" in e_opt or "Merged" in e_opt
                            else "BUG: ") + e_opt[:160]
                elif e_ref:
                    cell = "BUG: unchanged fails, rewritten runs: " + e_ref[:80]
                elif not want:
                    continue
                else:
                    cell = compare(want, have)
                rows[(kind, config)] = cell
    return rows


def config_cell(rows, config):
    """Every workflow of one configuration as one cell: ``BUG: ...`` if any
    workflow is one; ``refused: ...`` if memopt refused the program;
    ``paddle fails unchanged too: ...`` if Paddle could not build it; else
    ``ok`` (a refused fetch of a merged name and a workflow Paddle fails on
    the unchanged program too are listed, not failures)."""
    mine = {flow: cell for flow, c, cell in rows if c in (config, "all", "ref")}
    bugs = [f"{flow}: {cell}" for flow, cell in mine.items() if cell.startswith("BUG")]
    if bugs:
        return "BUG: " + "; ".join(bugs)[:400]
    if mine.get("build", "").startswith("paddle fails"):
        return mine["build"]
    if mine.get("optimize", "").startswith("refused"):
        return mine["optimize"]
    notes = [f"{flow}: {cell[:60]}" for flow, cell in mine.items() if not cell.startswith("ok")]
    return "ok" + (" (" + "; ".join(notes)[:300] + ")" if notes else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=3, metavar=("PROGRAM", "IR", "GC"), required=True)
    args = ap.parse_args()
    rows = worker(*args.one)
    print(json.dumps({"rows": [[k[0], k[1], v] for k, v in rows.items()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
