"""memory_optimize on ops with unusual memory semantics (tests/sweeps/test_sweep_memory_semantics.py).

Each test builds a small real program the sweep found a bug in, rewrites
it, trains it 3 steps with Paddle's executor and demands every fetch and
every persistable bit-identical to the unchanged program's.
"""
import contextlib
import io

import pytest

import memopt
from memopt.errors import BudgetError
from runs import assert_same_steps, train_steps

BATCH = 64


def _build(paddle, make):
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        fetch = make(paddle)
    return main, startup, fetch


def _smallest_budget(main, fetch):
    with pytest.raises(BudgetError) as err:
        memopt.memory_optimize(main, budget=1, batch_size=BATCH, fetch_list=fetch)
    return err.value.smallest_budget


def _setitem_net(paddle):
    """before = silu(h); h[1:3] = y; h[:, 0] = 0; setitem(h, [:, 4:6], ...);
    relu(h): Paddle's backward of silu reads h as the writes left it."""
    F = paddle.nn.functional
    x = paddle.static.data("x", [BATCH, 8], "float32")
    h = paddle.nn.Linear(8, 8)(x)
    before = F.silu(h)
    y = paddle.nn.Linear(8, 8)(x)
    h[1:3] = y[0:2] * 2.0
    h[:, 0] = 0.0
    h = paddle.static.setitem(h, (slice(None), slice(4, 6)), paddle.square(before[:, 0:2]))
    out = paddle.nn.Linear(8, 2)(F.relu(h) + before)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-2).minimize(loss)
    return [loss, out, before]


def _feed8(rng):
    return {"x": rng.standard_normal((BATCH, 8)).astype("float32")}


@pytest.mark.xfail(strict=True, reason="under the one peak model no recompute plan lowers this small program's step peak below its unchanged/level-1 plan, so budget= recomputes nothing and the test does not exercise what it guards; it needs a program where recomputation pays")
def test_budget_never_recomputes_a_value_written_over_in_place(paddle):
    """budget= at its smallest budget recomputed the Linear output ``h``
    for silu's backward, which in the unchanged program reads ``h`` after
    the set_value ops wrote into it: the first Linear's gradient differed
    (Adam moved its weights by 0.02 more).  A value an in-place op writes
    over while later ops read it is never made again nor read by a clone."""
    want = train_steps(paddle, *_build(paddle, _setitem_net), _feed8)
    main, startup, fetch = _build(paddle, _setitem_net)
    budget = _smallest_budget(main, fetch)
    with contextlib.redirect_stdout(io.StringIO()):
        report = memopt.memory_optimize(main, budget=budget, batch_size=BATCH,
                                        fetch_list=fetch)
    assert report.recomputed  # still recomputes what it may
    assert_same_steps(want, train_steps(paddle, main, startup, fetch, _feed8))


def _legacy_setitem(paddle, value_as_tensor):
    """A legacy program: h[:, 0] = 0.0 (set_value, the value an attribute)
    or = paddle.full(...) (set_value with a ValueTensor), trained."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [BATCH, 8], "float32")
        h = paddle.nn.Linear(8, 8)(x)
        value = paddle.full([BATCH], 0.0, "float32") if value_as_tensor else 0.0
        h = paddle.static.setitem(h, (slice(None), 0), value)
        loss = paddle.mean(paddle.nn.functional.relu(h))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main, loss


def test_legacy_refusal_names_the_set_value_op_and_the_fix(paddle):
    """Paddle's translator refuses a legacy set_value whose value is an
    attribute ("[set_value][ValueTensor] should only have 1 variable, but
    got 0"), so analyze and budget= refuse the program: the message said
    "refused one of its ops"; it now names the op, where it is, and the
    way around (the value as a tensor, which translates)."""
    from paddle.pir_utils import OldIrGuard
    from memopt.errors import UnsupportedProgramError

    with OldIrGuard():
        main, loss = _legacy_setitem(paddle, value_as_tensor=False)
        before = main.desc.serialize_to_string()
        with pytest.raises(UnsupportedProgramError) as err:
            memopt.analyze(main, BATCH, fetch_list=[loss])
        position = [op.type for op in main.global_block().ops].index("set_value")
        assert f"op 'set_value' (first at op {position} of block 0)" in str(err.value)
        assert "paddle.full(shape, value, dtype)" in str(err.value)
        assert main.desc.serialize_to_string() == before
        main, loss = _legacy_setitem(paddle, value_as_tensor=True)
        assert memopt.analyze(main, BATCH, fetch_list=[loss]).total_peak(BATCH) > 0


def _legacy_running_buffer(paddle):
    """centred = h - buf; paddle.assign(0.9 buf + 0.1 mean(h), output=buf);
    silu(centred) * buf: a legacy variable written again after a read."""
    F = paddle.nn.functional
    x = paddle.static.data("x", [BATCH, 8], "float32")
    buf = paddle.create_parameter([8], "float32", name="running_buf",
                                  default_initializer=paddle.nn.initializer.Constant(0.5))
    buf.stop_gradient = True
    h = paddle.nn.Linear(8, 8)(x)
    centred = h - buf
    paddle.assign(buf * 0.9 + paddle.mean(h, axis=0) * 0.1, output=buf)
    out = paddle.nn.Linear(8, 2)(F.silu(centred) * buf)
    loss = paddle.mean(out * out)
    paddle.optimizer.SGD(0.05).minimize(loss)
    return [loss, out, buf]


def _legacy_train(paddle, main, startup, fetch):
    """:func:`runs.train_steps` of a legacy program fed :func:`_feed8`."""
    names = [v.name for v in main.list_vars()
             if v.persistable and v.name not in ("feed", "fetch")]
    return train_steps(paddle, main, startup, fetch, _feed8, names)


def test_legacy_budget_never_clones_a_read_of_a_variable_written_later(paddle):
    """Legacy budget= at its smallest budget cloned ``h - running_buf`` into
    the backward part, after paddle.assign(..., output=running_buf) had
    written the new buffer: the first Linear's gradient differed.  A legacy
    variable written again after an earlier read is never read by a clone."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        want = _legacy_train(paddle, *_build(paddle, _legacy_running_buffer))
        main, startup, fetch = _build(paddle, _legacy_running_buffer)
        budget = _smallest_budget(main, fetch)
        with contextlib.redirect_stdout(io.StringIO()):
            report = memopt.memory_optimize(main, budget=budget, batch_size=BATCH,
                                            fetch_list=fetch)
        assert report.recomputed
        assert_same_steps(want, _legacy_train(paddle, main, startup, fetch))


def _legacy_detach(paddle):
    """before = silu(h); d = h.detach() (legacy share_data: d is h's own
    buffer); later Linear outputs; d read at the end."""
    F = paddle.nn.functional
    x = paddle.static.data("x", [BATCH, 8], "float32")
    h = paddle.nn.Linear(8, 8)(x)
    before = F.silu(h)
    d = h.detach()
    g = F.elu(paddle.nn.Linear(8, 8)(x))
    out = paddle.nn.Linear(8, 2)(before + g + d)
    loss = paddle.mean(out * out)
    paddle.optimizer.Adam(1e-2).minimize(loss)
    return [loss, out]


def test_legacy_detach_alias_never_merged(paddle):
    """Level 1, GC off: a later Linear output was renamed into the name of
    ``h.detach()`` (share_data: h's own buffer), writing over ``h`` while
    silu's backward still read it; every parameter differed after 2 steps.
    Both names of a share_data are now left alone."""
    from paddle.pir_utils import OldIrGuard
    from memopt.testing import models

    with OldIrGuard(), models.flags(eager_delete_tensor_gb=-1.0):
        want = _legacy_train(paddle, *_build(paddle, _legacy_detach))
        main, startup, fetch = _build(paddle, _legacy_detach)
        report = memopt.memory_optimize(main, level=1, fetch_list=fetch)
        assert report.merged_count  # still merges the rest
        assert_same_steps(want, _legacy_train(paddle, main, startup, fetch))


def test_legacy_input_fetched_back_is_held(paddle):
    """A legacy program with no ops that fetches its own feed was analysed
    as holding 0 B (Paddle's translator makes values of ops only), so
    ``budget=1`` was accepted.  The fed input is held for the step: the
    analysis counts it and ``budget=1`` is refused, the program unchanged;
    a budget of that size plans."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        main, _, fetch = _build(paddle, lambda p: [p.static.data("x", [-1, 8], "float32")])
        held = memopt.analyze(main, BATCH, fetch_list=fetch).total_peak(BATCH)
        assert held == BATCH * 8 * 4
        before = main.desc.serialize_to_string()
        assert _smallest_budget(main, fetch) >= held
        assert main.desc.serialize_to_string() == before
        # not fetched: nothing the step holds
        assert memopt.analyze(main, BATCH).total_peak(BATCH) == 0
