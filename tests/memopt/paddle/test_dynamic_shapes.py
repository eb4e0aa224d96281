"""Values whose ``-1`` dims are not the batch (tests/sweeps/test_sweep_dynamic_shapes.py):
``masked_select`` / ``unique`` outputs whose length the data decides, and a
batch folded into another dim by ``reshape`` / ``flatten``
(:mod:`memopt.paddle.dim_extents`).

Each test builds a small real program, compares ``memopt.analyze``'s step
peak with Paddle's allocator (the lowest step over what the startup program
left, as tests/memopt/paddle/test_kernel_memory.py measures) and trains the
rewritten program against the unchanged one, bit for bit.
"""
import contextlib
import io

import numpy as np
import pytest

import memopt
from memopt.errors import BudgetError
from runs import assert_same_steps, train_steps

B = 64


def _lowest_step_peak(paddle, main, startup, feed, fetch, settle_to, most=16):
    """The least allocator peak of a step over what the startup program
    left, after the first (warm-up) step: steps go on (up to ``most``)
    while every one peaked above ``settle_to`` (Paddle's collector frees on
    its own thread; the step whose frees all landed on time is what the
    model describes)."""
    from paddle.base import core

    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        # after the startup program: the scope keeps the last step's feeds,
        # which the model counts inside the step
        start = core.host_memory_stat_current_value("Allocated", 0)
        exe.run(main, feed=feed, fetch_list=fetch)
        peaks = []
        while len(peaks) < 4 or (min(peaks) > settle_to and len(peaks) < most):
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            exe.run(main, feed=feed, fetch_list=fetch)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0) - start)
    return min(peaks)


def _build(paddle, make):
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        fetch = make(paddle)
    return main, startup, fetch


def _masked_select_net(paddle):
    """masked_select of a [B, 256] value (every element selected): a [-1]
    output of 256 * B elements, and three more like it (silu, the square,
    their gradients), trained with SGD."""
    x = paddle.static.data("x", [-1, 256], "float32")
    h = paddle.nn.Linear(256, 256)(x)
    sel = paddle.masked_select(h, h > -100.0)
    s2 = paddle.nn.functional.silu(sel)
    loss = paddle.mean(s2 * s2)
    paddle.optimizer.SGD(0.1).minimize(loss)
    return [loss]


def _folded_batch_net(fold):
    """``fold`` of a [B, 6, 64] value: reshape to [-1, 32] (12 * B rows) or
    flatten(0, 1) (6 * B rows), through a Linear, trained with SGD."""
    def net(paddle):
        x = paddle.static.data("x", [-1, 6, 64], "float32")
        h = paddle.nn.Linear(64, 64)(x)
        if fold == "reshape":
            r = paddle.nn.Linear(32, 32)(paddle.reshape(h, [-1, 32]))
        else:
            r = paddle.nn.Linear(64, 64)(paddle.flatten(h, 0, 1))
        loss = paddle.mean(r * r)
        paddle.optimizer.SGD(0.1).minimize(loss)
        return [loss]
    return net


def _assert_predicted(ir, predicted, measured):
    """With the garbage collector off (every buffer of the step held: no
    collector thread whose late frees change the step's peak from run to
    run), PIR: 0.93-1.01x the allocator (measured 0.942 on the
    masked_select net, 0.987-0.988 on the folded ones; the rule reading
    every -1 as the batch gave about 0.7).  Legacy: 0.85-1.2x (the legacy
    executor's step varies from process to process: the [-1, 32] reshape
    net measured 589,828 B in some and 688,132 B, the prediction, in
    others, GC on)."""
    low, high = (0.93, 1.01) if ir == "pir" else (0.85, 1.2)
    assert low * measured <= predicted <= high * measured, (predicted, measured)


def _predicted_and_measured(paddle, make, shape):
    """(analyze's step peak, the allocator's lowest step peak) of the net
    ``make`` builds, fed ``shape`` rows, with the garbage collector off."""
    from memopt.testing import models

    with models.flags(eager_delete_tensor_gb=-1.0):
        main, startup, fetch = _build(paddle, make)
        predicted = memopt.analyze(main, B, fetch_list=fetch).peak(B)
        return predicted, _lowest_step_peak(paddle, main, startup, _feed(shape), fetch,
                                            settle_to=predicted * 1.01)


def _feed(shape):
    return {"x": np.random.default_rng(0).standard_normal((B,) + shape).astype("float32")}


def test_masked_select_output_counts_the_input_elements(paddle):
    """The step peak is predicted as :func:`_assert_predicted` asks
    (masked_select selecting every element: the bound is reached).  Reading
    the [-1] output as B elements had predicted 394,244 B against 409,608 B
    with GC on, and 0.48x the allocator with GC off."""
    _assert_predicted("pir", *_predicted_and_measured(paddle, _masked_select_net, (256,)))


@pytest.mark.parametrize("ir", ["pir", "legacy"])
@pytest.mark.parametrize("fold", ["reshape", "flatten"])
def test_reshape_to_another_leading_dim_keeps_its_elements(paddle, ir, fold):
    """reshape to [-1, 32] / flatten(0, 1) of a [B, 6, 64] value: every value
    after it counts 384 * B elements, and the step peak is predicted as
    :func:`_assert_predicted` asks (PIR, GC on: 589,828 B against 589,784 B;
    it had been 393,476 B, 0.67x, reading 12 * B rows as B, 0.43x with GC
    off, and ``budget=`` the smallest
    budget BudgetError named measured 1.33x that budget in the lowest of 5
    steps)."""
    guard = paddle.pir_utils.OldIrGuard() if ir == "legacy" else contextlib.nullcontext()
    with guard:
        measured = _predicted_and_measured(paddle, _folded_batch_net(fold), (6, 64))
    _assert_predicted(ir, *measured)


def test_data_dependent_program_bit_identical_at_every_level(paddle):
    """masked_select, nonzero, unique with counts feeding an embedding, at
    levels 0-2 and ``budget=`` the smallest budget: fetches and parameters
    bit-identical to the unchanged program's after 3 Adam steps."""
    def net(paddle):
        x = paddle.static.data("x", [-1, 16], "float32")
        h = paddle.nn.Linear(16, 16)(x)
        sel = paddle.masked_select(h, h > 0)
        idx = paddle.nonzero(h > 0.5)
        uniq, inverse, counts = paddle.unique(paddle.cast(h > 0, "int64").reshape([-1]) + idx[0:1, 1],
                                              return_inverse=True, return_counts=True)
        e = paddle.nn.Embedding(20, 4)(inverse)
        loss = paddle.mean(paddle.square(sel)) + paddle.mean(paddle.square(e)) \
            + paddle.mean(paddle.cast(counts, "float32"))
        paddle.optimizer.Adam(1e-2).minimize(loss)
        return [loss, sel, idx, counts]

    feed = _feed((16,))
    want = train_steps(paddle, *_build(paddle, net), lambda rng: feed)
    configs = [dict(level=0), dict(level=1), dict(level=2), "smallest"]
    for config in configs:
        main, startup, fetch = _build(paddle, net)
        if config == "smallest":
            with pytest.raises(BudgetError) as err:
                memopt.memory_optimize(main, budget=1, batch_size=B, fetch_list=fetch)
            config = dict(budget=err.value.smallest_budget, batch_size=B)
        with contextlib.redirect_stdout(io.StringIO()):
            memopt.memory_optimize(main, fetch_list=fetch, **config)
        assert_same_steps(want, train_steps(paddle, main, startup, fetch, lambda rng: feed),
                          context=str(config))


def test_legacy_sparse_embedding_refusal_names_the_lookup(paddle):
    """A legacy program with nn.Embedding(sparse=True) under Adam: Paddle's
    translator to PIR refuses the SelectedRows gradient with a message that
    names a type, not an op ("Type validation failed for the 2th input, got
    pd_op.selectedrows<100x16xf32>"); ``budget=`` and ``analyze`` now name
    the sparse lookup and the dense-gradient way around, and leave the
    program as it was."""
    def net(paddle):
        ids = paddle.static.data("ids", [-1, 5], "int64")
        emb = paddle.nn.Embedding(100, 16, sparse=True, padding_idx=0)
        loss = paddle.mean(paddle.nn.functional.relu(paddle.nn.Linear(16, 16)(emb(ids))))
        paddle.optimizer.Adam(0.01).minimize(loss)
        return [loss]

    with paddle.pir_utils.OldIrGuard():
        main, _, fetch = _build(paddle, net)
        before = main.desc.serialize_to_string()
        for call in (lambda: memopt.memory_optimize(main, budget=10**6, batch_size=B,
                                                    fetch_list=fetch),
                     lambda: memopt.analyze(main, B, fetch_list=fetch)):
            with pytest.raises(memopt.errors.UnsupportedProgramError) as err:
                call()
            assert "'lookup_table_v2' (is_sparse=True, first at op 0 of block 0)" in str(err.value)
            assert "sparse=False" in str(err.value)
            assert main.desc.serialize_to_string() == before
