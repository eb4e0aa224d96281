"""Fetches after memory_optimize / release_memory, wherever the program goes.

What a user can fetch from a rewritten program -- from the program itself,
from ``clone()`` / ``clone(for_test=True)``, from a serialized and parsed
copy, after ``paddle.static.save`` / ``load``, after
``save_inference_model`` / ``load_inference_model``, with a new Executor,
in another process, and from the files ``memopt optimize`` writes -- is
either the value the unoptimized program computes (bit-identical) or an
error naming the variable; never another variable's data, never None.

Every check runs real Paddle programs (memopt's models plus an LSTM and a
GRU classifier, a sparse-embedding CTR model and the issue's accuracy
model), under both garbage-collection modes and levels 0/1, and compares
against the same workflow applied to an unoptimized build of the same model.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import memopt
from memopt.testing import models
from memopt.errors import MergedVariableError

GC = {"on": {"FLAGS_eager_delete_tensor_gb": 0.0}, "off": {"FLAGS_eager_delete_tensor_gb": -1.0}}


# -- models ------------------------------------------------------------------------------------

def _accuracy(ir, batch, opts):
    """The issue's program: a linear classifier with a softmax accuracy metric."""
    import paddle

    x = paddle.static.data("x", [-1, 5, 8], "float32")
    y = paddle.static.data("y", [-1, 1], "int64")
    logits = paddle.reshape(paddle.nn.Linear(8, 4)(x), [-1, 4])
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
    acc = paddle.metric.accuracy(paddle.nn.functional.softmax(logits), y)

    def feed(rng):
        return {"x": rng.random((batch, 5, 8), dtype=np.float32),
                "y": rng.integers(0, 4, (batch * 5, 1)).astype("int64")}

    return feed, [loss, acc, logits]


def _rnn(cell):
    def build(ir, batch, opts):
        """A sequence classifier: embedding, one LSTM/GRU layer, mean over time."""
        import paddle

        steps, vocab, hidden = 6, 50, 16
        ids = paddle.static.data("ids", [-1, steps], "int64")
        label = paddle.static.data("label", [-1, 1], "int64")
        emb = paddle.nn.Embedding(vocab, hidden)(ids)
        rnn = paddle.nn.LSTM(hidden, hidden) if cell == "lstm" else paddle.nn.GRU(hidden, hidden)
        out, _ = rnn(emb)
        pooled = paddle.mean(out, axis=1)
        logits = paddle.nn.Linear(hidden, 3)(paddle.nn.functional.relu(pooled))
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))

        def feed(rng):
            return {"ids": rng.integers(0, vocab, (batch, steps)).astype("int64"),
                    "label": rng.integers(0, 3, (batch, 1)).astype("int64")}

        return feed, [loss, logits]
    return build


def _ctr(ir, batch, opts):
    """A CTR model: sparse embeddings of categorical slots, an MLP, a sigmoid loss."""
    import paddle

    slots, vocab, dim = 4, 1000, 8
    ids = paddle.static.data("slot_ids", [-1, slots], "int64")
    dense = paddle.static.data("dense", [-1, 5], "float32")
    click = paddle.static.data("click", [-1, 1], "float32")
    emb = paddle.nn.Embedding(vocab, dim, sparse=True)(ids)
    flat = paddle.reshape(emb, [-1, slots * dim])
    h = paddle.concat([flat, dense], axis=1)
    for width in (32, 16):
        h = paddle.nn.functional.relu(paddle.nn.Linear(h.shape[-1], width)(h))
    logit = paddle.nn.Linear(16, 1)(h)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, click))

    def feed(rng):
        return {"slot_ids": rng.integers(0, vocab, (batch, slots)).astype("int64"),
                "dense": rng.random((batch, 5), dtype=np.float32),
                "click": rng.integers(0, 2, (batch, 1)).astype("float32")}

    return feed, [loss, logit]


EXTRA = {"accuracy": _accuracy, "lstm": _rnn("lstm"), "gru": _rnn("gru"), "ctr": _ctr}


def build(name, ir, batch=4, optimizer="sgd"):
    """A model of :mod:`memopt.testing.models` or of :data:`EXTRA`, built alike every time."""
    import paddle

    if name not in EXTRA:
        return models.build(name, ir, batch_size=batch, optimizer=optimizer)
    paddle.enable_static()
    with models.ir_guard(ir):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            feed, fetch_list = EXTRA[name](ir, batch, {})
            models._optimizer(optimizer).minimize(fetch_list[0])
    return models.BuiltModel(name=name, ir=ir, main=main, startup=startup, feed=feed,
                             fetch_list=list(fetch_list), batch_size=batch)


# -- legacy helpers ----------------------------------------------------------------------------

def user_names(program):
    """Block 0's non-persistable tensors a user could fetch (feed/fetch holders
    and memopt's own names left out)."""
    from paddle.base import core

    dense = {core.VarDesc.VarType.DENSE_TENSOR}
    out = []
    for name, var in program.global_block().vars.items():
        if var.persistable or name.startswith("memopt@") or var.desc.type() not in dense:
            continue
        if name in ("feed", "fetch") or getattr(var, "is_data", False) \
                or var.desc.need_check_feed():
            continue
        out.append(name)
    return sorted(out)


def same(want, got) -> bool:
    """Bit-identical; a value the unoptimized program itself gives as None
    (an output Paddle never allocates: ``reshape2``'s ``XShape``) must be
    None in the rewritten one too."""
    want, got = np.asarray(want), np.asarray(got)
    if want.dtype == object or got.dtype == object:
        return want.dtype == got.dtype and want.shape == got.shape and \
            all(a is None and b is None for a, b in zip(want.flat, got.flat, strict=True))
    return np.array_equal(want, got, equal_nan=want.dtype.kind == "f")


def data_names(program):
    return sorted(n for n, v in program.global_block().vars.items()
                  if v.desc.need_check_feed())


def run_fetch(model, program, names, feed, scope=None, params_from=None):
    """Run ``program`` once in a fresh scope (parameters from the seeded
    startup program, or loaded by ``params_from(exe)``) with a new Executor;
    fetch the ``names`` it declares.  Returns ``{name: array}``."""
    import paddle

    scope = paddle.static.Scope() if scope is None else scope
    present = [n for n in names if program.global_block().has_var(n)]
    with paddle.static.scope_guard(scope), models.ir_guard("legacy"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        if params_from is None:
            model.initialize(exe)
        else:
            params_from(exe)
        out = exe.run(program, feed=feed, fetch_list=present)
    return {n: np.array(v) for n, v in zip(present, out, strict=True)}


def assert_refused(model, program, name, feed, guarded=True):
    """Fetching ``name`` fails naming it (MergedVariableError where memopt's
    guard is installed, Paddle's own error otherwise)."""
    import paddle

    kind = MergedVariableError if guarded else Exception
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("legacy"), \
            pytest.raises(kind, match=re.escape(name)):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        exe.run(program, feed=feed, fetch_list=[name])


def optimize_legacy(model, gc, level, skip_grads=True, release=True, **kw):
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=GC[gc][
            "FLAGS_eager_delete_tensor_gb"]):
        report = memopt.memory_optimize(model.main, level=level, skip_grads=skip_grads, **kw)
        rel = memopt.release_memory(model.main, **kw) if release else None
    return report, rel


def workflows(paddle, tmp_path):
    """``name -> (program -> (program, params_from or None))`` for every way a
    legacy program travels that keeps block 0's variables."""
    from paddle.base.framework import Program as LegacyProgram
    def same(p, scope):
        return p, None

    def clone(p, scope):
        return p.clone(), None

    def clone_test(p, scope):
        return p.clone(for_test=True), None

    def parsed(p, scope):
        return LegacyProgram.parse_from_string(p.desc.serialize_to_string()), None

    def saved(p, scope, model=None):
        prefix = str(tmp_path / f"saved_{id(p)}")
        with paddle.static.scope_guard(scope), models.ir_guard("legacy"):
            exe = paddle.static.Executor(paddle.CPUPlace())
            scope_model.initialize(exe)
            paddle.static.save(p, prefix)
        with open(prefix + ".pdmodel", "rb") as f:
            loaded = LegacyProgram.parse_from_string(f.read())

        def params_from(exe):
            paddle.static.load(loaded, prefix, exe)
        return loaded, params_from

    scope_model = None

    def bind(model):
        nonlocal scope_model
        scope_model = model

    return {"program": same, "clone": clone, "clone(for_test)": clone_test,
            "serialize/parse": parsed, "static.save/load": saved}, bind


def check_legacy(paddle, tmp_path, name, gc, level, skip_grads=True):
    """Every workflow: every user name of the unoptimized program fetched
    from the rewritten one gives the unoptimized value or is refused by name."""
    ref, opt = build(name, "legacy"), build(name, "legacy")
    names = user_names(ref.main)
    report, rel = optimize_legacy(opt, gc, level, skip_grads, release=(gc == "off"))
    gone = [n for n in names if not opt.main.global_block().has_var(n)]
    feed = ref.feed(np.random.default_rng(7))
    flows, bind = workflows(paddle, tmp_path)
    results = {}
    with models.flags(eager_delete_tensor_gb=GC[gc]["FLAGS_eager_delete_tensor_gb"]):
        for flow, make in flows.items():
            bind(ref)
            p_ref, load_ref = make(ref.main, paddle.static.Scope())
            bind(opt)
            p_opt, load_opt = make(opt.main, paddle.static.Scope())
            want = run_fetch(ref, p_ref, names, feed, params_from=load_ref)
            got = run_fetch(opt, p_opt, names, feed, params_from=load_opt)
            assert set(got) | set(gone) >= set(want), flow
            for n, value in got.items():
                assert same(want[n], value), (flow, n)
            for n in gone:
                if p_ref.global_block().has_var(n):
                    assert_refused(opt, p_opt, n, feed)
            results[flow] = (len(got), len(gone))
        # an inference model of the rewritten program
        infer = check_inference(paddle, tmp_path, ref, opt, names, gone, feed)
    return report, rel, gone, results, infer


def check_inference(paddle, tmp_path, ref, opt, names, gone, feed):
    out = []
    for model in (ref, opt):
        prefix = str(tmp_path / f"infer_{model is opt}")
        block = model.main.global_block()
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope), models.ir_guard("legacy"):
            exe = paddle.static.Executor(paddle.CPUPlace())
            model.initialize(exe)
            paddle.static.save_inference_model(
                prefix, [block.var(n) for n in data_names(model.main)],
                [block.var(model.loss.name)], exe, program=model.main)
            program, _, targets = paddle.static.load_inference_model(prefix, exe)
            # the pruned program keeps declarations no op writes any more
            # (None in the unoptimized model too): fetch what an op writes
            written = {n for op in program.global_block().ops for n in op.output_arg_names}
            present = [n for n in names if n in written]
            values = exe.run(program, feed=feed, fetch_list=targets + present)
            out.append((program, dict(zip(["@target"] + present, values)), written))
            if model is opt:
                ref_written = out[0][2]
                for n in gone:
                    # pruned away in the unoptimized model too: Paddle's own
                    # error (naming it); else memopt's
                    kind = MergedVariableError if n in ref_written else Exception
                    with pytest.raises(kind, match=re.escape(n)):
                        exe.run(program, feed=feed, fetch_list=[n])
    (_, want, _), (_, got, _) = out
    for n, value in got.items():
        assert same(want[n], value), n
    return len(got)


# -- the issue's repro -------------------------------------------------------------------------

def test_issue_repro_clone_for_test_never_returns_softmax(paddle):
    """Issue 9 item 1, as reported: the clone(for_test=True) of a rewritten
    program must not hand back the softmax's values for ``logits``."""
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=0.0):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, 5, 8], "float32")
            y = paddle.static.data("y", [-1, 1], "int64")
            logits = paddle.reshape(paddle.nn.Linear(8, 4)(x), [-1, 4])
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
            paddle.metric.accuracy(paddle.nn.functional.softmax(logits), y)
            paddle.optimizer.SGD(0.1).minimize(loss)
        before = main.clone(for_test=True)
        memopt.memory_optimize(main)
        test = main.clone(for_test=True)
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        feed = {"x": np.random.rand(2, 5, 8).astype("float32"), "y": np.zeros((10, 1), "int64")}
        a = exe.run(before, feed=feed, fetch_list=[logits])[0]
        assert not np.allclose(a.sum(1), 1.0)
        # the right values: with GC on memopt.any_order does not let the
        # softmax write over logits (the loss reads them too), so the clone
        # fetches them as the unchanged program does
        got = exe.run(test, feed=feed, fetch_list=[logits])[0]
        assert np.array_equal(a, got)
        # the user's Variable still knows its name, shape and dtype
        assert logits.name.startswith("reshape2") and list(logits.shape) == [-1, 4]

        # and with fetch_list it is kept: the value is right
        main2, startup2 = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main2, startup2), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, 5, 8], "float32")
            y = paddle.static.data("y", [-1, 1], "int64")
            logits2 = paddle.reshape(paddle.nn.Linear(8, 4)(x), [-1, 4])
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits2, y))
            paddle.metric.accuracy(paddle.nn.functional.softmax(logits2), y)
            paddle.optimizer.SGD(0.1).minimize(loss)
        memopt.memory_optimize(main2, fetch_list=[logits2])
        with paddle.static.scope_guard(paddle.static.Scope()):
            paddle.seed(1)
            exe.run(startup2)
            b = exe.run(main2.clone(for_test=True), feed=feed, fetch_list=[logits2])[0]
        assert np.array_equal(a, b)


# -- the legacy matrix ----------------------------------------------------------------------------

LEGACY_CASES = [("accuracy", "on", 0), ("accuracy", "off", 1), ("mlp", "on", 0),
                ("mlp", "off", 0), ("mlp", "off", 1), ("cnn", "on", 1), ("cnn", "off", 0),
                ("lstm", "on", 0), ("lstm", "off", 1), ("gru", "off", 0), ("ctr", "on", 1),
                ("ctr", "off", 1), ("transformer", "off", 1), ("branches", "on", 2),
                ("branches", "off", 2)]


@pytest.mark.parametrize("name,gc,level", LEGACY_CASES)
def test_legacy_every_workflow_fetches_right_or_refuses(paddle, tmp_path, name, gc, level):
    report, rel, gone, results, infer = check_legacy(paddle, tmp_path, name, gc, level)
    # the check could fail: something was merged or released, and is refused
    assert gone, (name, gc, level, report.reuses)
    merged = {r.var for r in report.reuses} | {r.takes for r in report.reuses}
    released = set(rel.released) if rel is not None else set()
    assert set(gone) <= merged | released
    assert all(r.renamed_to.startswith("memopt@buf_") for r in report.reuses)
    if level == 2 and gc == "on":  # the order was changed and is kept by depend ops
        assert any("depend ops keep it" in note for note in report.notes), report.notes


def test_legacy_skip_grads_off_gradients_refused_by_name(paddle, tmp_path):
    report, rel, gone, results, infer = check_legacy(paddle, tmp_path, "mlp", "off", 1,
                                                     skip_grads=False)
    assert any("@GRAD" in n for n in gone)


# -- fetch_list and unknown names ---------------------------------------------------------------

@pytest.mark.parametrize("gc", ["on", "off"])
def test_legacy_fetch_list_keeps_what_is_fetched(paddle, gc):
    ref, opt = build("accuracy", "legacy"), build("accuracy", "legacy")
    plain = build("accuracy", "legacy")
    optimize_legacy(plain, gc, 1)
    names = user_names(ref.main)
    lost = [n for n in names if not plain.main.global_block().has_var(n)]
    assert lost
    fetch = [opt.main.global_block().var(n) for n in lost]
    optimize_legacy(opt, gc, 1, fetch_list=fetch)
    assert all(opt.main.global_block().has_var(n) for n in lost)
    feed = ref.feed(np.random.default_rng(3))
    with models.flags(eager_delete_tensor_gb=GC[gc]["FLAGS_eager_delete_tensor_gb"]):
        want = run_fetch(ref, ref.main, lost, feed)
        got = run_fetch(opt, opt.main, lost, feed)
    for n in lost:
        assert np.array_equal(want[n], got[n]), n


def test_unknown_names_raise_and_leave_program_unchanged(paddle):
    model = build("accuracy", "legacy")
    before = model.main.desc.serialize_to_string()
    with models.ir_guard("legacy"):
        with pytest.raises(ValueError, match=r"skip_opt_set.*'loss'.*closest") as info:
            memopt.memory_optimize(model.main, skip_opt_set={"loss"})
        with pytest.raises(ValueError, match=r"fetch_list.*'softmax_0.tmp_9'.*'softmax_0.tmp_0'"):
            memopt.memory_optimize(model.main, fetch_list=["softmax_0.tmp_9"])
        with pytest.raises(ValueError, match=r"fetch_list.*'reshape2_0.tmp'"):
            memopt.release_memory(model.main, fetch_list=["reshape2_0.tmp"])
    assert "nothing was changed" in str(info.value)
    assert model.main.desc.serialize_to_string() == before


def test_pir_unknown_names_raise(paddle):
    model = build("mlp", "pir")
    text = str(model.main)
    with pytest.raises(ValueError, match=r"skip_opt_set.*'loss'"):
        memopt.memory_optimize(model.main, skip_opt_set=["loss"])
    with pytest.raises(ValueError, match=r"fetch_list.*'%99999'"):
        memopt.memory_optimize(model.main, fetch_list=["%99999"])
    assert str(model.main) == text


def test_pir_values_of_another_program_raise(paddle):
    """A Value of the program a clone was made from names (by its %N) some
    value of the clone: memopt kept that one's memory silently and Paddle
    cannot fetch the Value from the clone (IndexError).  Now a ValueError
    naming the argument and the fix, the clone untouched; the mapped Value
    is accepted."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 8], "float32")
        h = paddle.nn.functional.relu(paddle.nn.Linear(8, 16)(x))
        loss = paddle.mean(paddle.nn.Linear(16, 4)(h) ** 2)
        paddle.optimizer.SGD(0.1).minimize(loss)
    mapping = paddle.pir.IrMapping()
    clone = main.clone(mapping)
    text = str(clone)
    for call in (memopt.memory_optimize, memopt.release_memory):
        with pytest.raises(ValueError, match=r"fetch_list\[1\] is a Value of another program"
                                             r".*pd_op.relu.*IrMapping"):
            call(clone, fetch_list=[mapping.look_up(loss), h])
        with pytest.raises(ValueError, match=r"skip_opt_set\[0\] is a Value of another"):
            call(clone, skip_opt_set={h})
        assert str(clone) == text
    memopt.memory_optimize(clone, level=1, fetch_list=[mapping.look_up(h)])
    assert not memopt.paddle.pir.rewrite.overwritten_by(mapping.look_up(h))


def _forward_then_optimized(paddle, level=1, trainable=False):
    """x -> linear -> relu -> tanh -> exp, rewritten at ``level`` keeping
    the exp: relu_ and tanh_ write over their inputs, so the Python Values
    of the relu and the tanh are erased.  The linear is frozen (a program
    with trainable parameters and no backward keeps what a later backward
    reads: :mod:`memopt.paddle.pending_backward`), unless ``trainable``.
    (main, startup, relu Value, exp Value, linear weight, the matmul's
    Value: its op stays, the add_ after it writes over it)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        lin = paddle.nn.Linear(16, 16)
        for p in (lin.weight, lin.bias):
            p.stop_gradient = not trainable
        product = paddle.matmul(x, lin.weight)
        h = paddle.nn.functional.relu(product + lin.bias)
        out = paddle.exp(paddle.tanh(h))
    if level is not None:
        memopt.memory_optimize(main, level=level, fetch_list=[out])
    return main, startup, h, out, lin.weight, product


def _steps(paddle, main, startup, fetch, steps=2):
    scope = paddle.static.Scope()
    x = np.linspace(-1, 1, 64, dtype="float32").reshape(4, 16)
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        return [[np.array(a) for a in exe.run(main, feed={"x": x}, fetch_list=fetch)]
                for _ in range(steps)]


def test_pir_op_added_after_memory_optimize_refused_at_run(paddle):
    """An op added after memory_optimize that reads a value the rewrite's
    in-place ops wrote over (the matmul's output, overwritten by add_) would
    compute on other values.  The run raises, naming the reader, the
    in-place writer and the fix.  (minimize after memory_optimize on a
    trainable program is bit-identical: test_pending_backward.py.)"""
    main, startup, _, out, _, product = _forward_then_optimized(paddle)
    with paddle.static.program_guard(main, startup):
        late = paddle.mean(product)
    with pytest.raises(MergedVariableError, match=r"reads .*writes over in place.*"
                                                  r"then call memory_optimize"):
        _steps(paddle, main, startup, [late])
    # optimized after minimize: trains as the unchanged program
    ref = _forward_then_optimized(paddle, None, trainable=True)
    opt = _forward_then_optimized(paddle, None, trainable=True)
    for m, s, _, o, _, _ in (ref, opt):
        with paddle.static.program_guard(m, s):
            m._loss = paddle.mean(o)
            paddle.optimizer.SGD(0.1).minimize(m._loss)
    memopt.memory_optimize(opt[0], level=1, fetch_list=[opt[0]._loss])
    a = _steps(paddle, ref[0], ref[1], [ref[0]._loss])
    b = _steps(paddle, opt[0], opt[1], [opt[0]._loss])
    assert [x.tobytes() for r in a for x in r] == [x.tobytes() for r in b for x in r]


def test_pir_second_call_with_an_erased_value(paddle):
    """memory_optimize again with a Value the first call erased: it crashed
    the process (SIGSEGV reading the erased Value).  Now it is swapped for
    its replacement; one the first rewrite writes over is a ValueError."""
    main, startup, h, out, _, _ = _forward_then_optimized(paddle)
    text = str(main)
    with pytest.raises(ValueError, match=r"fetch_list\[1\] \(pd_op.relu_ at op \d+, "
                                         r"test_fetch_trust.py:\d+ .*written over in place by "
                                         r"pd_op.tanh_.*earlier memory_optimize"):
        memopt.memory_optimize(main, level=2, fetch_list=[out, h])
    assert str(main) == text
    ref = _forward_then_optimized(paddle, None)
    memopt.memory_optimize(main, level=2, fetch_list=[out])
    assert _steps(paddle, main, startup, [out])[0][0].tobytes() == \
        _steps(paddle, ref[0], ref[1], [ref[3]])[0][0].tobytes()


def test_pir_new_value_at_an_erased_values_address_fetches_itself(paddle):
    """An op built after the rewrite can get an erased Value's address, so
    its id (seen: the first op appended after a level-1 rewrite): the fetch
    guard took it for the erased Value and fetched that one's replacement.
    The record is made to hold the new Value's id as erased, as address
    reuse makes it; the Value the program defines is fetched as itself."""
    main, startup, _, out, _, _ = _forward_then_optimized(paddle)
    with paddle.static.program_guard(main, startup):
        new = paddle.sin(out) + 1.0
    main._memopt_pir_rewrites["replaced"][new.id] = out  # the address reused
    got, base = _steps(paddle, main, startup, [new, out], steps=1)[0]
    assert got.tobytes() != base.tobytes()
    np.testing.assert_allclose(got, np.sin(base) + np.float32(1.0), rtol=1e-6)


def test_fetch_list_is_keyword_only_after_fluids_positionals():
    import inspect

    for fn in (memopt.memory_optimize, memopt.release_memory):
        params = inspect.signature(fn).parameters
        assert params["fetch_list"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(memopt.memory_optimize).parameters)[:5] == [
        "program", "skip_opt_set", "skip_grads", "level", "print_log"]


# -- PIR ----------------------------------------------------------------------------------------

def _value_at(program, k, r):
    return program.global_block().ops[k].result(r)


def pir_values(program):
    """``(op index, result index)`` of every non-persistable tensor result of
    the top-level block's compute ops (what a user could fetch)."""
    out = []
    for k, op in enumerate(program.global_block().ops):
        if op.name().startswith("builtin.") or op.name() in ("pd_op.data", "pd_op.fetch",
                                                              "pd_op.full_int_array"):
            continue
        for r in range(op.num_results()):
            v = op.result(r)
            if v.initialized() and any(u.name() == "builtin.shadow_output"
                                       for u in v.all_used_ops()):
                continue  # memopt's record (pir_rewrite.write_record), no user value
            if v.initialized() and v.is_dense_tensor_type() and not v.persistable:
                out.append((k, r))
    return out


def run_pir(model, program, where, feed):
    """Run a PIR program once in a fresh scope, new Executor; fetch the values
    at ``where``.  Returns ``{where: array}``."""
    import paddle

    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        vals = [_value_at(program, k, r) for k, r in where]
        out = exe.run(program, feed=feed, fetch_list=vals)
    return dict(zip(where, (np.array(o) for o in out)))


@pytest.mark.parametrize("name,gc,level", [("mlp", "on", 0), ("mlp", "off", 1),
                                           ("cnn", "off", 0), ("accuracy", "on", 1),
                                           ("lstm", "off", 0), ("ctr", "on", 0)])
def test_pir_program_and_clone_fetch_right_or_refuse(paddle, name, gc, level):
    ref, opt = build(name, "pir"), build(name, "pir")
    with models.flags(eager_delete_tensor_gb=GC[gc]["FLAGS_eager_delete_tensor_gb"]):
        report = memopt.memory_optimize(opt.main, level=level)
        feed = ref.feed(np.random.default_rng(5))
        ops_ref = [op.name() for op in ref.main.global_block().ops]
        ops_opt = [op.name() for op in opt.main.global_block().ops]
        # the same ops, then the record of the marks (pir_rewrite.write_record)
        assert ops_opt[len(ops_ref):] == (["pd_op.full", "builtin.shadow_output"]
                                          if report.reuses else [])
        ops_opt = ops_opt[:len(ops_ref)]
        assert [n.rstrip("_") for n in ops_ref] == [n.rstrip("_") for n in ops_opt]
        where = pir_values(ref.main)
        for program_of in (lambda p: p, lambda p: p.clone()):
            p_ref, p_opt = program_of(ref.main), program_of(opt.main)
            refused = []
            for k, r in where:
                v = _value_at(p_opt, k, r)
                if memopt.paddle.pir.rewrite.overwritten_by(v) is not None:
                    refused.append((k, r))
            fine = [w for w in where if w not in refused]
            want = run_pir(ref, p_ref, fine, feed)
            got = run_pir(opt, p_opt, fine, feed)
            for w in fine:
                assert same(want[w], got[w]), (w, ops_ref[w[0]])
            assert len(refused) == sum(1 for r in report.reuses), (refused, report.reuses)
            for k, r in refused:
                with pytest.raises(MergedVariableError, match="write over it"):
                    run_pir(opt, p_opt, [(k, r)], feed)


def test_pir_fetch_list_keeps_values(paddle):
    plain, opt = build("mlp", "pir"), build("mlp", "pir")
    report = memopt.memory_optimize(plain.main)
    assert report.reuses
    where = [w for w in pir_values(plain.main)
             if memopt.paddle.pir.rewrite.overwritten_by(_value_at(plain.main, *w))]
    keep = [_value_at(opt.main, *w) for w in where]
    memopt.memory_optimize(opt.main, fetch_list=keep)
    assert not any(memopt.paddle.pir.rewrite.overwritten_by(_value_at(opt.main, *w))
                   for w in where)


def test_legacy_inference_save_refuses_a_merged_target(paddle, tmp_path):
    """Legacy save_inference_model of a variable merged away raises
    MergedVariableError naming it (Paddle pruned the program to nothing and
    blamed the first feed: "'x' doesn't exist in pruned inference program");
    nothing is written."""
    model = build("accuracy", "legacy")
    logits = model.fetch_list[2]
    optimize_legacy(model, "off", 1, release=False)
    assert not model.main.global_block().has_var(logits.name), "merged without fetch_list"
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("legacy"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        x = model.main.global_block().var("x")
        with pytest.raises(MergedVariableError, match=re.escape(repr(logits.name))):
            paddle.static.save_inference_model(str(tmp_path / "m"), [x], [logits], exe,
                                               program=model.main)
    assert not list(tmp_path.iterdir())


def test_pir_inference_save_refuses_an_overwritten_target(paddle, tmp_path):
    model = build("mlp", "pir")
    memopt.memory_optimize(model.main)
    where = [w for w in pir_values(model.main)
             if memopt.paddle.pir.rewrite.overwritten_by(_value_at(model.main, *w))]
    assert where
    target = _value_at(model.main, *where[0])
    fed = set(model.feed(np.random.default_rng(2)))
    data = [op.result(0) for op in model.main.global_block().ops
            if op.name() == "pd_op.data" and op.attrs().get("name") in fed]
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        with pytest.raises(MergedVariableError, match="write over it"):
            paddle.static.save_inference_model(str(tmp_path / "m"), data, [target], exe,
                                               program=model.main)
        assert not (tmp_path / "m.json").exists()
        # the loss is fine: saved, loaded and run it gives the unoptimized value
        paddle.static.save_inference_model(str(tmp_path / "m"), data, [model.loss], exe,
                                           program=model.main)
        program, _, targets = paddle.static.load_inference_model(str(tmp_path / "m"), exe)
        got = exe.run(program, feed=model.feed(np.random.default_rng(2)), fetch_list=targets)
    ref = build("mlp", "pir")
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        ref.initialize(exe)
        want = exe.run(ref.main, feed=ref.feed(np.random.default_rng(2)), fetch_list=[ref.loss])
    assert np.array_equal(got[0], want[0])


# -- another process, and the CLI's files ----------------------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, os
    os.environ["FLAGS_enable_pir_api"] = "0"
    import numpy as np, paddle
    if sys.argv[2] == "memopt":
        import memopt
        memopt.install_fetch_guard()
    paddle.enable_static()
    job = json.load(open(sys.argv[1]))
    feed = dict(np.load(job["feed"]))
    out, errors = {}, {}
    exe = paddle.static.Executor(paddle.CPUPlace())
    for key, spec in job["programs"].items():
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            if spec["kind"] == "inference":
                program, _, targets = paddle.static.load_inference_model(spec["path"], exe)
            else:
                program = paddle.static.Program.parse_from_string(
                    open(spec["path"], "rb").read())
                paddle.static.load(program, spec["params"], exe)
            present = [n for n in job["names"] if program.global_block().has_var(n)]
            vals = exe.run(program, feed=feed, fetch_list=present)
            for n, v in zip(present, vals, strict=True):
                out[key + "/" + n] = np.array(v)
            for n in job["names"]:
                if n in present:
                    continue
                try:
                    r = exe.run(program, feed=feed, fetch_list=[n])
                    errors[key + "/" + n] = "NO ERROR: " + repr(r)
                except Exception as exc:
                    errors[key + "/" + n] = type(exc).__name__ + ": " + str(exc)
    np.savez(job["out"], **out)
    json.dump(errors, open(job["out"] + ".json", "w"))
""")


@pytest.mark.parametrize("guarded", [False, True])
def test_legacy_another_process_loads_saved_files_and_cli_output(paddle, tmp_path, guarded):
    from memopt import cli

    gc = "off"
    ref, opt = build("accuracy", "legacy"), build("accuracy", "legacy")
    names = user_names(ref.main)
    optimize_legacy(opt, gc, 1)
    gone = [n for n in names if not opt.main.global_block().has_var(n)]
    assert gone
    feed = ref.feed(np.random.default_rng(11))
    np.savez(tmp_path / "feed.npz", **feed)
    block = opt.main.global_block()
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("legacy"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        opt.initialize(exe)
        paddle.static.save(opt.main, str(tmp_path / "opt"))
        paddle.static.save_inference_model(
            str(tmp_path / "inf"), [block.var(n) for n in data_names(opt.main)],
            [block.var(opt.loss.name)], exe, program=opt.main)
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("legacy"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        ref.initialize(exe)
        paddle.static.save(ref.main, str(tmp_path / "ref"))
    with models.flags(eager_delete_tensor_gb=-1.0):
        code = cli.main(["-q", "optimize", str(tmp_path / "ref.pdmodel"), "--level", "1",
                         "--release", "-o", str(tmp_path / "cli.pdmodel")])
    assert code == 0
    job = {"feed": str(tmp_path / "feed.npz"), "names": names, "out": str(tmp_path / "out"),
           "programs": {
               "saved": {"kind": "program", "path": str(tmp_path / "opt.pdmodel"),
                         "params": str(tmp_path / "opt")},
               "cli": {"kind": "program", "path": str(tmp_path / "cli.pdmodel"),
                       "params": str(tmp_path / "ref")},
               "inference": {"kind": "inference", "path": str(tmp_path / "inf")}}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "child.py").write_text(CHILD)
    env = dict(os.environ, FLAGS_eager_delete_tensor_gb="-1", GLOG_minloglevel="2",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "job.json"),
                           "memopt" if guarded else "plain"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = dict(np.load(str(tmp_path / "out.npz"), allow_pickle=True))  # None: object
    errors = json.loads((tmp_path / "out.json").read_text())
    with models.flags(eager_delete_tensor_gb=-1.0):
        want = run_fetch(ref, ref.main, names, feed)
    assert any(k.startswith("saved/") for k in got) and any(k.startswith("cli/") for k in got)
    for key, value in got.items():
        assert same(want[key.split("/", 1)[1]], value), key
    refused = [k for k in errors if k.startswith(("saved/", "cli/"))]
    assert {k.split("/", 1)[1] for k in refused if k.startswith("saved/")} == set(gone)
    assert refused and {k.split("/", 1)[1] for k in refused if k.startswith("cli/")}
    for key, message in errors.items():
        name = key.split("/", 1)[1]
        assert not message.startswith("NO ERROR"), (key, message)
        assert name in message, (key, message)
        if guarded and not key.startswith("inference/"):
            # (the inference model is pruned to the loss: names off its path
            # are gone from the unoptimized model's too, Paddle's own error)
            assert message.startswith("MergedVariableError"), (key, message)


CHILD_PIR = textwrap.dedent("""
    import json, sys
    import numpy as np, paddle
    from paddle.base import core
    paddle.enable_static()
    job = json.load(open(sys.argv[1]))
    feed = dict(np.load(job["feed"]))
    out = {}
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        program, _, targets = paddle.static.load_inference_model(job["inference"], exe)
        out["inference/loss"] = np.array(exe.run(program, feed=feed, fetch_list=targets)[0])
    for key in ("saved", "cli"):
        spec = job[key]
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            program = paddle.static.Program()
            core.deserialize_pir_program(spec["path"], program, -1)
            for name, array in paddle.static.load_program_state(spec["params"]).items():
                scope.var(name).get_tensor().set(array, paddle.CPUPlace())
            ops = program.global_block().ops
            values = [ops[k].result(r) for k, r in job["where"]]
            got = exe.run(program, feed=feed, fetch_list=values)
            for (k, r), v in zip(job["where"], got, strict=True):
                out[f"{key}/{k}.{r}"] = np.array(v)
    np.savez(job["out"], **out)
""")


def test_pir_another_process_loads_saved_files_and_cli_output(paddle, tmp_path):
    """A PIR program rewritten (in place, with the loss and a value kept by
    fetch_list), saved three ways, loaded and run by another process: every
    value the rewrite does not write over equals the unoptimized one."""
    from memopt import cli

    ref, opt = build("mlp", "pir"), build("mlp", "pir")
    report = memopt.memory_optimize(opt.main)
    assert report.reuses
    where = [w for w in pir_values(opt.main)
             if memopt.paddle.pir.rewrite.overwritten_by(_value_at(opt.main, *w)) is None]
    feed = ref.feed(np.random.default_rng(13))
    np.savez(tmp_path / "feed.npz", **feed)
    fed = set(feed)

    def data_of(model):
        return [op.result(0) for op in model.main.global_block().ops
                if op.name() == "pd_op.data" and op.attrs().get("name") in fed]

    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        opt.initialize(exe)
        paddle.static.save(opt.main, str(tmp_path / "opt"))
        paddle.static.save_inference_model(str(tmp_path / "inf"), data_of(opt), [opt.loss], exe,
                                           program=opt.main)
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        ref.initialize(exe)
        paddle.static.save(ref.main, str(tmp_path / "ref"))
    assert cli.main(["-q", "optimize", str(tmp_path / "ref.json"),
                     "-o", str(tmp_path / "cli.json")]) == 0
    job = {"feed": str(tmp_path / "feed.npz"), "out": str(tmp_path / "out"),
           "inference": str(tmp_path / "inf"), "where": where,
           "saved": {"path": str(tmp_path / "opt.json"), "params": str(tmp_path / "opt")},
           "cli": {"path": str(tmp_path / "cli.json"), "params": str(tmp_path / "ref")}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "child.py").write_text(CHILD_PIR)
    env = dict(os.environ, GLOG_minloglevel="2",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "job.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = dict(np.load(str(tmp_path / "out.npz"), allow_pickle=True))
    want = run_pir(ref, ref.main, where, feed)
    loss_at = next(w for w in where if _value_at(ref.main, *w).is_same(ref.loss))
    assert same(want[loss_at], got["inference/loss"])
    for key in ("saved", "cli"):
        for k, r in where:
            assert same(want[(k, r)], got[f"{key}/{k}.{r}"]), (key, k, r)


def test_cli_unknown_skip_and_fetch_names_are_errors(paddle, tmp_path, capsys):
    """``--skip loss`` on a real legacy program names nothing: exit 1 with the
    names the program does have; nothing is written."""
    from memopt import cli

    model = build("accuracy", "legacy")
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("legacy"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        paddle.static.save(model.main, str(tmp_path / "m"))
    out = tmp_path / "o.pdmodel"
    assert cli.main(["-q", "optimize", str(tmp_path / "m.pdmodel"), "--skip", "loss",
                     "-o", str(out)]) == 1
    err = capsys.readouterr().err
    loss = model.loss.name
    assert "--skip" in err and f"'loss' (closest: '{loss}')" in err, err
    assert cli.main(["-q", "optimize", str(tmp_path / "m.pdmodel"), "--fetch", "softmax_0.tmp",
                     "--fetch", "mean_0.tmp_0", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    # only the unknown name is reported, with the real one it was meant to be
    assert "--fetch has a name" in err and "'softmax_0.tmp' (closest: 'softmax_0.tmp_0'" \
        in err and "'mean_0.tmp_0' (" not in err, err
    assert not out.exists()
    # the README's example names something real, and it stays fetchable
    assert cli.main(["-q", "optimize", str(tmp_path / "m.pdmodel"), "--level", "1",
                     "--fetch", "softmax_0.tmp_0", "-o", str(out)]) == 0
    from paddle.base.framework import Program as LegacyProgram

    written = LegacyProgram.parse_from_string(out.read_bytes())
    assert written.global_block().has_var("softmax_0.tmp_0")


def test_legacy_optimized_twice_then_released_keeps_every_name_in_the_record(paddle):
    """memory_optimize at level 0, again at level 1 (buffers merged into
    buffers), then release_memory: every name that left the program is in
    the record of the buffer it lives in, refused by name, and the rest
    fetch the unoptimized values."""
    from memopt.paddle.legacy import program as legacy

    ref, opt = build("transformer", "legacy"), build("transformer", "legacy")
    names = user_names(ref.main)
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=-1.0):
        memopt.memory_optimize(opt.main, level=0, skip_grads=False)
        memopt.memory_optimize(opt.main, level=1, skip_grads=False)
        memopt.release_memory(opt.main)
        record = legacy.merged_record(opt.main)
        gone = [n for n in names if not opt.main.global_block().has_var(n)]
        assert gone and set(gone) <= set(record)
        assert all(opt.main.global_block().has_var(buf) for buf in record.values())
        feed = ref.feed(np.random.default_rng(17))
        want = run_fetch(ref, ref.main, names, feed)
        got = run_fetch(opt, opt.main, names, feed)
        for n, value in got.items():
            assert same(want[n], value), n
        for n in gone[:5] + gone[-5:]:
            assert_refused(opt, opt.main, n, feed)


def _relu_program(paddle, optimize):
    """x -> frozen matmul -> relu -> exp (fetched); a metric built after
    memory_optimize on the relu's Value (the op relu_ replaced)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        weight = paddle.create_parameter([16, 16], "float32")
        weight.stop_gradient = True
        h = paddle.nn.functional.relu(paddle.matmul(x, weight))
        out = paddle.exp(h)
        if optimize:
            report = memopt.memory_optimize(main, level=1, fetch_list=[out])
            assert [r.op for r in report.reuses] == ["pd_op.relu -> pd_op.relu_"]
        metric = paddle.sum(h) * 2.0
    return main, startup, out, metric


def test_pir_op_built_on_a_replaced_value_reads_its_replacement(paddle):
    """An op built after memory_optimize on a Value of an op the rewrite
    replaced by its in-place variant: Paddle's builder crashed the process
    (SIGSEGV: the erased op had freed the Value).  The replaced op is
    retired instead (memopt.paddle.pir.retired), and before the run the
    new op reads the replacement: the same bytes as without memopt."""
    main, startup, out, metric = _relu_program(paddle, optimize=True)
    ref = _relu_program(paddle, optimize=False)
    got = _steps(paddle, main, startup, [out, metric])
    want = _steps(paddle, ref[0], ref[1], [ref[2], ref[3]])
    assert [a.tobytes() for step in got for a in step] == \
        [a.tobytes() for step in want for a in step]
