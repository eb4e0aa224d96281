"""memory_optimize(level=2): a memory-aware op order, every dependency
kept, never a higher predicted peak, bit-identical runs."""
import numpy as np
import pytest

from memopt.testing import models
from memopt.errors import PlanError
from memopt.schedule import (OrderOp, OrderProblem, candidate_orders, check_topological,
                             greedy_order, simulated_peak)


def _branches(n: int = 4) -> OrderProblem:
    """A root fanning out to ``n`` branches, each a big temporary reduced to
    a small one, joined at the end; program order makes every big value
    first (peak ~ n big), a good order finishes one branch at a time."""
    ops = [OrderOp(makes={"x": 1})]
    for b in range(n):
        ops.append(OrderOp(after=(0,), makes={f"big{b}": 100}, reads=("x",)))
    for b in range(n):
        ops.append(OrderOp(after=(1 + b,), makes={f"small{b}": 1}, reads=(f"big{b}",)))
    ops.append(OrderOp(after=tuple(range(1 + n, 1 + 2 * n)), makes={"out": 1},
                       reads=tuple(f"small{b}" for b in range(n))))
    return OrderProblem(ops, frozenset({"out"}))


def test_greedy_order_lowers_the_peak_of_branches():
    problem = _branches()
    program = list(range(len(problem.ops)))
    order = greedy_order(problem)
    check_topological(problem, order)
    assert simulated_peak(problem, program) >= 400
    assert simulated_peak(problem, order) <= 110


def test_candidates_keep_dependencies_and_bad_orders_are_refused():
    problem = _branches(3)
    names = [name for name, _ in candidate_orders(problem)]
    assert names[0] == "program"
    with pytest.raises(PlanError):
        check_topological(problem, list(reversed(range(len(problem.ops)))))
    with pytest.raises(PlanError):
        check_topological(problem, [0, 0, 1])


@pytest.mark.parametrize("name", ["unet", "densenet"])
def test_level2_bit_identical_and_never_worse(paddle, name):
    import memopt

    reference = models.run_steps(models.build(name, "pir"), steps=2)
    model = models.build(name, "pir")
    report = memopt.memory_optimize(model.main, level=2, batch_size=model.batch_size,
                                    skip_opt_set=model.fetch_list)
    assert report.level == 2
    assert report.peak_after <= report.peak_before
    assert any(note.startswith("level 2") for note in report.notes)
    if name == "densenet":  # each block's concats held again in the next: sliced out
        assert any("sliced out" in note for note in report.notes)
        assert report.peak_after < 0.85 * report.peak_before
    got = models.run_steps(model, steps=2)
    for x, y in zip(reference.fetches, got.fetches, strict=True):
        for u, v in zip(x, y, strict=True):
            assert np.array_equal(u, v)
    for u, v in zip(reference.params, got.params, strict=True):
        assert np.array_equal(u, v)


def test_level2_on_legacy_plans_an_order(paddle):
    """Legacy programs get level 1 and the memory-aware order
    (tests/memopt/paddle/test_legacy_schedule.py runs them); level 3 is refused."""
    import memopt

    model = models.build("mlp", "legacy")
    with models.ir_guard("legacy"):
        report = memopt.memory_optimize(model.main, level=2)
    assert report.level == 2
    assert any(note.startswith("level 2: ") for note in report.notes), report.notes
    assert not any("got level 1" in note for note in report.notes)
    with pytest.raises(ValueError, match="level"):
        memopt.memory_optimize(models.build("mlp", "pir").main, level=3)


def test_optimizer_order_moves_updates_up_to_their_gradients():
    """Two gradients made one after the other, their updates at the end:
    the optimizer order applies each right after its gradient."""
    from memopt.schedule import optimizer_up_order

    ops = [OrderOp(makes={"g0": 100}), OrderOp(makes={"g1": 100}),
           OrderOp(after=(0,), reads=("g0",), optimize=True),
           OrderOp(after=(1,), reads=("g1",), optimize=True)]
    problem = OrderProblem(ops)
    order = optimizer_up_order(problem)
    check_topological(problem, order)
    assert order == [0, 2, 1, 3]
    assert simulated_peak(problem, order) < simulated_peak(problem, [0, 1, 2, 3])


def test_sequential_executor_is_modelled_in_program_order(paddle):
    """FLAGS_new_executor_sequential_run runs the program's order: the
    runtime model follows it (level 2 then moves optimizer updates up)."""
    import paddle as pd

    from memopt.paddle import flags

    assert flags.runtime_model("pir").schedule == "dataflow"
    old = pd.get_flags(["FLAGS_new_executor_sequential_run"])
    pd.set_flags({"FLAGS_new_executor_sequential_run": True})
    try:
        assert flags.runtime_model("pir").schedule == "program"
    finally:
        pd.set_flags(old)


def _two_readers():
    """``x`` read by ``tanh`` and, last, by ``scale``: level 1 runs ``scale``
    in place over ``x`` (it dies there in program order), which makes the
    executor wait for ``tanh`` before ``scale_``."""
    import paddle as pd

    main, start = pd.static.Program(), pd.static.Program()
    with pd.static.program_guard(main, start):
        a = pd.static.data("a", [-1, 8], "float32")
        x = pd.matmul(a, pd.create_parameter([8, 8], "float32"))
        out = pd.tanh(x) + pd.scale(x, 2.0)
    return main, out


def test_level2_applies_only_in_place_variants_no_order_can_worsen(paddle):
    """Level 2 keeps level 1's in-place variants only where the input has
    no other reader (memopt.any_order): an added ordering edge could make
    the multi-thread executor hold more."""
    import memopt

    main, out = _two_readers()
    memopt.memory_optimize(main, level=1, fetch_list=[out])
    assert "pd_op.scale_" in [op.name() for op in main.global_block().ops]
    main, out = _two_readers()
    report = memopt.memory_optimize(main, level=2, fetch_list=[out])
    names = [op.name() for op in main.global_block().ops]
    assert "pd_op.scale" in names and "pd_op.scale_" not in names
    assert "input read by another op too" in str(report)


def test_level2_order_raises_no_executor_mode(paddle):
    """An order level 2 keeps is predicted no higher than the program's
    under every executor mode checked (program order, 4/2/1 workers, frees
    on time and late)."""
    import paddle as pd

    import memopt
    from memopt.paddle.pir import schedule as pir_schedule
    from memopt.paddle.flags import runtime_model

    model = models.build("mlp", "pir")
    old = pd.get_flags(["FLAGS_new_executor_sequential_run"])
    pd.set_flags({"FLAGS_new_executor_sequential_run": True})
    try:
        memopt.memory_optimize(model.main, level=1, skip_opt_set=model.fetch_list)
        runtime = runtime_model("pir")
        choice = pir_schedule.plan_order(model.main, model.batch_size, runtime)
        modes = pir_schedule.executor_modes(runtime)
    finally:
        pd.set_flags(old)
    assert choice.order is not None and len(modes) == 4
    n = len(model.main.global_block().ops)
    base = pir_schedule.mode_peaks(model.main, model.batch_size, modes, list(range(n)))
    new = pir_schedule.mode_peaks(model.main, model.batch_size, modes, choice.order)
    assert set(new) == set(base) and len(new) == 8
    assert all(new[m] <= base[m] for m in base)
    assert new["own"] < base["own"]


def test_concat_slices_found_and_undone(paddle):
    """plan_slices finds the DenseNet concats held again in the next one
    (each sliced from the smallest saved container, at zero offset along the
    channels); apply + undo gives back the very program."""
    from memopt.paddle.pir import program as pir
    from memopt.paddle.pir.concat_slices import apply_slices, plan_slices

    model = models.build("densenet", "pir")
    text = str(model.main)
    pg = pir.convert(model.main)
    slices = plan_slices(pg, model.batch_size)
    assert len(slices) >= 3
    assert all(s.axis == 1 and s.start == 0 and s.end > 0 for s in slices)
    names = {s.name for s in slices}
    assert any(s.source in names for s in slices)  # a chain: x_l from x_{l+1}'s slice
    applied = apply_slices(pg, slices)
    assert str(model.main) != text
    applied.undo()
    assert str(model.main) == text


def test_unet_skip_sliced_out_right_after_its_concat_is_done(paddle):
    """A U-Net decoder concat is read by its convolution's backward op early
    in the backward part, the skip it holds only at the end: sliced out
    right after that op (the op's readers gated on the slice), the concat
    dies there and the predicted peak falls below the late placement's under
    every executor mode; level 2 takes the early slices and trains
    bit-identical (test_level2_bit_identical_and_never_worse)."""
    from memopt.paddle.pir import program as pir, schedule as pir_schedule
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.concat_slices import apply_slices, plan_slices

    model = models.build("unet", "pir", batch_size=16)  # the bench's batch
    batch = model.batch_size
    pg = pir.convert(model.main)
    late, early = plan_slices(pg, batch), plan_slices(pg, batch, early=True)
    assert len(late) == len(early) == 3
    assert not any(s.gated for s in late) and all(s.gated for s in early)
    by_name = {s.name: s for s in late}
    assert all(s.before < by_name[s.name].before for s in early)
    modes = pir_schedule.executor_modes(runtime_model("pir"))
    peaks = []
    for slices in (late, early):
        applied = apply_slices(pg, slices)
        peaks.append(pir_schedule.mode_peaks(model.main, batch, modes))
        applied.undo()
    assert peaks[1]["own"] < 0.99 * peaks[0]["own"]
    assert all(peaks[1][m] <= peaks[0][m] for m in peaks[0] if not m.endswith("+lag"))
    import memopt

    report = memopt.memory_optimize(model.main, level=2, batch_size=batch,
                                    skip_opt_set=model.fetch_list)
    assert any("right after their concat's last backward reader" in n for n in report.notes)
    # the report's figure is the step's peak; its peak with frees on time is the mode's
    assert report.analyses[1].total_peak(batch) == peaks[1]["own"]
    assert report.peak_after == report.analyses[1].step_peak(batch)
    # and no order of the rewritten program's ops goes lower: the bound (the
    # top convolution's backward op with its im2col workspace) is reached
    bound, _ = pir_schedule.any_order_bound(model.main, batch)
    assert bound <= report.analyses[1].total_peak(batch) <= bound * 1.001


def test_level2_changes_nothing_the_model_does_not_predict_lower(paddle):
    """On the BERT-like encoder no order, slice or in-place variant lowers
    the predicted peak: level 2 leaves the program exactly as it was
    (level 1 would turn scale/softmax into in-place variants)."""
    import memopt

    model = models.build("bert", "pir")
    text = str(model.main)
    report = memopt.memory_optimize(model.main, level=2, batch_size=model.batch_size,
                                    skip_opt_set=model.fetch_list)
    assert str(model.main) == text
    assert any("in-place variants left out" in note for note in report.notes)
    assert report.peak_after == report.peak_before


@pytest.mark.parametrize("name", ["bert", "unet"])
def test_any_order_bound_holds_for_every_candidate_order(paddle, name):
    """No candidate order is predicted under the any-order bound, and the
    program's own order of the BERT-like encoder sits on it."""
    from memopt.paddle.pir import program as pir, schedule as pir_schedule
    from memopt.paddle.flags import runtime_model
    from memopt.schedule import candidate_orders

    model = models.build(name, "pir")
    batch = model.batch_size
    runtime = runtime_model("pir")
    bound, _ = pir_schedule.any_order_bound(model.main, batch, runtime)
    problem = pir_schedule.order_problem(pir.convert(model.main), batch)
    peaks = {label: pir_schedule.mode_peaks(model.main, batch, [("own", runtime)], order)["own"]
             for label, order in candidate_orders(problem)}
    assert len(peaks) >= 2
    assert all(peak >= bound for peak in peaks.values())
    if name == "bert":
        assert peaks["program"] <= bound * 1.001


def test_random_ops_keep_their_order(paddle):
    """Each dropout takes the generator's next numbers: an order that swaps
    two would give each the other's mask.  Four independent dropouts of
    different widths: the greedy order finishes the smallest branch first
    (it swapped them before random ops were chained), now every candidate
    keeps them in program order."""
    from paddle.utils import unique_name

    from memopt.paddle.pir import program as pir, schedule as pir_schedule

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        drops = [paddle.nn.functional.dropout(paddle.nn.Linear(16, w)(x), 0.5)
                 for w in (4096, 512, 2048, 1024)]
        out = paddle.add_n([paddle.mean(d) for d in drops])
    problem = pir_schedule.order_problem(pir.convert(main, [out]), 8)
    ops = list(main.global_block().ops)
    drop = [i for i, op in enumerate(ops) if pir.draws_random(op)]
    assert len(drop) == 4
    orders = candidate_orders(problem)
    assert [name for name, _ in orders][:2] == ["program", "greedy"]
    for name, order in orders:
        check_topological(problem, order)
        at = [order.index(i) for i in drop]
        assert at == sorted(at), name


def test_level2_counts_fetched_values_to_the_end_of_the_step(paddle):
    """A fetched value lives to the end of the step (the fetch reads it
    last).  The level-2 analyses (after-peak, candidate orders, in-place
    variants, slices) read the program without the fetch list, so a program
    level 2 left exactly as it was was reported lower (a bidirectional LSTM:
    1,395,212 -> 1,352,200 bytes) and orders were compared with the fetched
    values freed early."""
    from paddle.utils import unique_name

    import memopt
    from memopt.paddle.pir import program as pir, schedule as pir_schedule
    from memopt.paddle.flags import runtime_model

    main, startup = paddle.static.Program(), paddle.static.Program()
    with unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        wide = paddle.nn.Linear(16, 2048)(x)          # fetched, last read here
        small = paddle.tanh(paddle.nn.Linear(2048, 8)(wide))
        out = paddle.mean(paddle.nn.Linear(8, 8)(small))
    before = str(main)
    report = memopt.memory_optimize(main, level=2, fetch_list=[out, wide])
    assert str(main) == before  # nothing for level 2 to do here
    assert report.peak_after == report.peak_before
    runtime = runtime_model("pir")
    modes = pir_schedule.executor_modes(runtime)
    held = pir_schedule.mode_peaks(main, 8, modes, fetch=[out, wide])
    freed = pir_schedule.mode_peaks(main, 8, modes)
    assert held["own"] > freed["own"]  # the wide value counted while the rest runs
    n = len(main.global_block().ops)
    assert pir_schedule.mode_peaks(main, 8, modes, list(range(n)), [out, wide]) == held
    assert pir.value_name(wide) in pir.convert(main, [wide]).graph.fetch_names


def test_level2_steps_that_fail_leave_no_half_rewrite(paddle, monkeypatch):
    """If level 2's order step fails after the concat slices were applied
    (a fault injected into plan_order), the slices are undone: the program
    is exactly what level 2 makes without slices or a new order (level 1's
    in-place rewrite), and the report says what was left out and why."""
    import memopt
    from memopt.paddle.pir import concat_slices as pir_concat_slices, schedule as pir_schedule

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    sliced = []
    real_slices = pir_concat_slices.slice_if_lower

    def counting(*args, **kwargs):
        result = real_slices(*args, **kwargs)
        sliced.append(result[0])
        return result

    monkeypatch.setattr(pir_schedule, "plan_order", broken)
    monkeypatch.setattr(pir_concat_slices, "slice_if_lower", counting)
    failed = models.build("densenet", "pir")
    report = memopt.memory_optimize(failed.main, level=2, batch_size=failed.batch_size,
                                    skip_opt_set=failed.fetch_list)
    assert sliced and sliced[0] > 0  # the slices were applied before the failure
    assert any("left out: RuntimeError: injected failure" in n for n in report.notes)

    monkeypatch.setattr(pir_concat_slices, "slice_if_lower",
                        lambda *args, **kwargs: (0, "", None))
    plain = models.build("densenet", "pir")
    memopt.memory_optimize(plain.main, level=2, batch_size=plain.batch_size,
                           skip_opt_set=plain.fetch_list)
    assert [op.name() for op in failed.main.global_block().ops] == \
        [op.name() for op in plain.main.global_block().ops]
    assert "pd_op.slice" not in {op.name() for op in failed.main.global_block().ops} - \
        {op.name() for op in models.build("densenet", "pir").main.global_block().ops}
