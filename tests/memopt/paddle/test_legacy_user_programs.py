"""Legacy programs written the way Fluid-era users wrote them, which
tests/sweeps/test_sweep_legacy_user.py found memopt mishandling: each rewritten and
run on the legacy executor, bit-identical to the unchanged program."""
import numpy as np
import pytest

from memopt.testing import models


@pytest.fixture(scope="module")
def legacy_paddle(paddle):
    with models.ir_guard("legacy"):
        yield paddle


def _same(runs):
    """Every run's arrays bit-identical to the first run's."""
    want = runs[0]
    for got in runs[1:]:
        assert len(got) == len(want)
        for a, b in zip(want, got, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_gradients_target_is_kept_like_a_loss(legacy_paddle):
    """``paddle.static.gradients([loss], [x])`` gives no op the Loss role
    (its backward starts from a ``fill_any_like`` of the loss): without a
    fetch_list the loss was merged with ``mean_0.tmp_0@GRAD`` and its fetch
    refused (MergedVariableError).  It is kept like a minimized loss."""
    paddle = legacy_paddle
    import memopt

    rng = np.random.default_rng(0)
    feed = {"x": rng.random((8, 16), dtype=np.float32),
            "label": rng.integers(0, 4, (8, 1)).astype("int64")}
    runs = []
    with models.flags(eager_delete_tensor_gb=-1.0):
        for level in (None, 0, 1, 2):
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
                x = paddle.static.data("x", [-1, 16])
                x.stop_gradient = False
                y = paddle.static.data("label", [-1, 1], "int64")
                logits = paddle.static.nn.fc(paddle.static.nn.fc(x, 32, activation="relu"), 4)
                loss = paddle.mean(paddle.mean(paddle.nn.functional.cross_entropy(logits, y)))
                (grad,) = paddle.static.gradients([loss], [x])
            if level is not None:
                report = memopt.memory_optimize(main, level=level, skip_grads=False)
                assert report.reuses, "the other temporaries still share"
                merged = {n for r in report.reuses for n in (r.var, r.takes)}
                assert loss.name not in merged
            with paddle.static.scope_guard(paddle.static.Scope()):
                exe = paddle.static.Executor(paddle.CPUPlace())
                paddle.seed(1)
                exe.run(startup)
                runs.append([np.array(a) for a in exe.run(main, feed=feed,
                                                          fetch_list=[loss, grad])])
    _same(runs)


def test_non_iterable_data_loader(legacy_paddle):
    """``DataLoader.from_generator(iterable=False)`` puts its blocking queue
    in the scope from Python and reads it in the program's
    ``create_py_reader`` op without declaring it: memopt refused the program
    (GraphError: uses 'lod_tensor_blocking_queue_0', which no block of the
    program declares).  The name is left alone; the rest is optimized."""
    paddle = legacy_paddle
    import memopt

    rng = np.random.default_rng(0)
    batches = [(rng.random((8, 16), dtype=np.float32),
                rng.integers(0, 4, (8, 1)).astype("int64")) for _ in range(3)]
    runs = []
    for level in (None, 1, 2):
        scope = paddle.static.Scope()  # the queue is made in the global scope: this one
        with paddle.static.scope_guard(scope):
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
                x = paddle.static.data("x", [-1, 16])
                y = paddle.static.data("label", [-1, 1], "int64")
                loader = paddle.base.io.DataLoader.from_generator(
                    feed_list=[x, y], capacity=4, iterable=False)
                loader.set_batch_generator(lambda: iter(batches))
                logits = paddle.static.nn.fc(paddle.static.nn.fc(x, 32, activation="relu"), 4)
                loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
                paddle.optimizer.Adam(0.01).minimize(loss)
            if level is None:  # no PIR op to translate the reader to: a clear refusal
                with pytest.raises(memopt.errors.UnsupportedProgramError,
                                   match=r"'create_py_reader'.*iterable=True"):
                    memopt.analyze(main, 8)
            else:
                before = main.desc.serialize_to_string()
                report = memopt.memory_optimize(main, level=level, fetch_list=[loss])
                assert report.reuses and main.desc.serialize_to_string() != before
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(startup)
            loader.start()
            out = [np.array(exe.run(main, fetch_list=[loss])[0]) for _ in batches]
            loader.reset()
            out += [np.array(scope.find_var(p.name).get_tensor()) for p in main.all_parameters()]
            runs.append(out)
    _same(runs)


_PYLAYER_CHILD = r"""
import numpy as np
import paddle
import memopt
from memopt.errors import UnsupportedProgramError

paddle.enable_static()


def build():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, 16])
        y = paddle.static.data("label", [-1, 1], "int64")
        h = paddle.static.nn.static_pylayer(lambda a: paddle.nn.functional.relu(a) * 2.0,
                                            [paddle.static.nn.fc(x, 16)],
                                            backward_fn=lambda g: g * 0.5)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(paddle.static.nn.fc(h, 4), y))
        paddle.optimizer.SGD(0.05).minimize(loss)
    return main, startup, loss


def run(main, startup, loss):
    rng = np.random.default_rng(0)
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        return [np.array(exe.run(main, fetch_list=[loss], feed={
            "x": rng.random((8, 16), dtype=np.float32),
            "label": rng.integers(0, 4, (8, 1)).astype("int64")})[0]).tobytes()
            for _ in range(3)]


want = run(*build())
main, startup, loss = build()
before = main.desc.serialize_to_string()
for call in (lambda: memopt.analyze(main, 8),
             lambda: memopt.memory_optimize(main, budget=1000, batch_size=8, fetch_list=[loss])):
    try:
        call()
        raise SystemExit("no error")
    except UnsupportedProgramError as exc:
        assert "'pylayer'" in str(exc) and "static_pylayer" in str(exc), str(exc)
    assert main.desc.serialize_to_string() == before
report = memopt.memory_optimize(main, level=2, fetch_list=[loss])
assert report.reuses and any("own order kept" in str(n) for n in report.notes), report.notes
assert run(main, startup, loss) == want
print("PYLAYER-OK")
"""


def test_static_pylayer_never_reaches_the_translator(legacy_paddle):
    """Paddle 3.3.1's translator to PIR crashes the process (SIGSEGV) on a
    legacy ``pylayer`` op (``paddle.static.nn.static_pylayer``):
    ``analyze``, ``budget=`` and level 2 took a user's process down.
    ``analyze`` and ``budget=`` now raise UnsupportedProgramError naming the
    op (program unchanged) and level 2 keeps the program's order (level 1's
    result, bit-identical).  Run in a child: a regression kills only it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLAGS_enable_pir_api="0")
    proc = subprocess.run([sys.executable, "-c", _PYLAYER_CHILD], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "PYLAYER-OK" in proc.stdout, proc.stderr[-2000:]


def test_recompute_optimizer_leftover_blocks(legacy_paddle):
    """Fluid's ``RecomputeOptimizer`` leaves two blocks no op runs, whose
    ops read block 0's variables (an ``elementwise_add_grad`` reading
    ``fc_1.tmp_0`` for its dims): memopt substituted that read, merged
    ``fc_1.tmp_0``, and the rewrite refused (GraphError: used by an op of
    block 1).  Reads in blocks never run are not substituted; the program
    is rewritten and trains bit-identically."""
    paddle = legacy_paddle
    import memopt

    rng = np.random.default_rng(0)
    feed = {"x": rng.random((8, 16), dtype=np.float32),
            "label": rng.integers(0, 4, (8, 1)).astype("int64")}
    runs, reuses = [], []
    for level in (None, 0, 1):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, 16])
            y = paddle.static.data("label", [-1, 1], "int64")
            h = paddle.static.nn.fc(x, 32, activation="relu")
            logits = paddle.static.nn.fc(paddle.static.nn.fc(h, 32, activation="relu"), 4)
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
            opt = paddle.incubate.optimizer.RecomputeOptimizer(paddle.optimizer.SGD(0.1))
            opt._set_checkpoints([h])
            opt.minimize(loss)
        assert main.num_blocks == 3 and not any(
            op.desc.has_attr("sub_block") for op in main.global_block().ops)
        if level is None:  # blocks never run are no sub-blocks budget= refuses
            before = main.desc.serialize_to_string()
            with pytest.raises(memopt.BudgetError):
                memopt.memory_optimize(main, budget=1000, batch_size=8, fetch_list=[loss])
            assert main.desc.serialize_to_string() == before
        if level is not None:
            with models.flags(eager_delete_tensor_gb=-1.0):
                report = memopt.memory_optimize(main, level=level, skip_grads=False,
                                                fetch_list=[loss, logits])
            reuses.append(len(report.reuses))
        with paddle.static.scope_guard(paddle.static.Scope()), \
                models.flags(eager_delete_tensor_gb=-1.0):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(startup)
            out = [np.array(a) for _ in range(3)
                   for a in exe.run(main, feed=feed, fetch_list=[loss, logits])]
            runs.append(out + [np.array(paddle.static.global_scope().find_var(p.name)
                                        .get_tensor()) for p in main.all_parameters()])
    _same(runs)
    assert all(reuses), reuses  # the gradients still share
