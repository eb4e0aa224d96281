"""One model of the step's peak behind analyze, the report, budget= and max_batch_size.

``Analysis.step_peak`` is the one figure: ``str(analyze(...))``,
``memory_optimize``'s report, ``budget=`` (and ``BudgetError``'s figures)
and ``max_batch_size`` (with and without recompute) all give it or plan by
it.  A budget the unchanged program meets by it is never refused; the
recompute batch is never below the plain one.  Argument types get named
errors; strings are accepted wherever bytes are.  Promises on measured
peaks run with the garbage collector off (deterministic: no collector
thread's late frees).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memopt.testing import models

SMALL = {"mlp": {"hidden": 256}, "cnn": {"image_size": 16}, "bert": {"seq_len": 16},
         "gpt": {"seq_len": 16}}


def _cnn(batch=64):
    return models.build("cnn", "pir", batch, optimizer="adam", image_size=16)


def test_analyze_report_and_budget_give_one_figure(paddle):
    import memopt

    m = _cnn()
    an = memopt.analyze(m.main, 64, fetch_list=m.fetch_list)
    peak = an.step_peak()
    assert peak > an.total_peak()  # frees late, other thread counts, carried fetches
    assert f"peak of the step      {memopt.report.format_bytes(peak)}" in str(an)
    assert an.to_json()["step_peak_bytes"] == peak
    report = memopt.memory_optimize(m.main, level=1, batch_size=64, fetch_list=m.fetch_list)
    assert report.peak_before == peak
    text = str(report)
    assert f"peak of the step at batch 64: {memopt.report.format_bytes(peak)}" in text
    assert "estimated peak" not in text and "(not a peak)" in text
    # the largest batch in a budget is where that figure crosses it
    fits = an.max_batch_size(peak)
    assert fits >= 64 and an.step_peak(fits) <= peak < an.step_peak(fits + 1)


def test_a_budget_the_unchanged_step_meets_is_never_refused(paddle):
    import memopt

    m = _cnn()
    peak = memopt.analyze(m.main, 64, fetch_list=m.fetch_list).step_peak()
    ops = [op.name() for op in m.main.global_block().ops]
    report = memopt.memory_optimize(m.main, level=2, budget=peak, batch_size=64,
                                    fetch_list=m.fetch_list)
    assert not report.recomputed and report.peak_after <= peak == report.budget
    assert any("recompute: none needed: the step's peak" in n for n in report.notes)
    assert "budget: " in str(report) and "(met" in str(report)
    # the program keeps its ops (level 2 may reorder them, never add one)
    assert sorted(op.name() for op in m.main.global_block().ops) == sorted(ops)


def test_budget_error_figures_agree_with_max_batch_size(paddle):
    import memopt

    m = _cnn()
    an = memopt.analyze(m.main, 64, fetch_list=m.fetch_list)
    budget = an.step_peak(40)
    plain = an.max_batch_size(budget)
    assert 40 <= plain < 64
    with pytest.raises(memopt.BudgetError) as info:
        memopt.memory_optimize(m.main, budget=budget, batch_size=64, fetch_list=m.fetch_list)
    err = info.value
    assert err.largest_batch >= plain
    assert err.smallest_budget <= an.step_peak(64)
    assert an.max_batch_size(budget, recompute=True) >= plain


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SMALL)), fraction=st.sampled_from([0.3, 0.6, 1.0, 1.5]))
def test_recompute_batch_is_never_below_the_plain_one(paddle, name, fraction):
    """max_batch_size(recompute=True) >= max_batch_size() on the model
    programs, for budgets around the unchanged step's peak."""
    import memopt

    m = models.build(name, "pir", 8, **SMALL[name])
    an = memopt.analyze(m.main, 8, fetch_list=[m.loss])
    budget = int(an.step_peak(8) * fraction)
    plain = an.max_batch_size(budget, limit=256)
    assert an.max_batch_size(budget, limit=256, recompute=True) >= (plain or 0)


def test_string_budgets_wherever_bytes_are_taken(paddle):
    import memopt

    m = _cnn()
    an = memopt.analyze(m.main, 64, fetch_list=m.fetch_list)
    assert an.max_batch_size("8MiB") == an.max_batch_size(8 << 20)
    assert an.max_batch_size(" 1GB ") == an.max_batch_size(10 ** 9)
    assert "largest batch in 8MiB" in an.report(budget_bytes="8MiB")
    with pytest.raises(memopt.ArgumentTypeError, match="budget_bytes must be bytes"):
        an.max_batch_size([8 << 20])
    with pytest.raises(ValueError, match="budget_bytes: cannot read '8 parsecs'"):
        an.max_batch_size("8 parsecs")


def test_batch_sizes_must_be_ints(paddle):
    import memopt

    m = _cnn()
    ops = [op.name() for op in m.main.global_block().ops]
    for call in (lambda: memopt.analyze(m.main, 64.0),
                 lambda: memopt.analyze(m.main, 64).step_peak(64.0),
                 lambda: memopt.memory_optimize(m.main, level=1, batch_size=64.0),
                 lambda: memopt.memory_optimize(m.main, budget="8MiB", batch_size=64.0)):
        with pytest.raises(memopt.ArgumentTypeError, match=r"batch_size must be an int.*"
                                                             r"got 64\.0 \(float\) \(write 64\)"):
            call()
    with pytest.raises(TypeError, match="batch_size must be an int"):  # a TypeError too
        memopt.analyze(m.main, "64")
    with pytest.raises(ValueError, match="positive"):
        memopt.analyze(m.main, 0)
    assert [op.name() for op in m.main.global_block().ops] == ops


def test_one_default_batch_everywhere(paddle):
    import memopt
    from memopt.report import REFERENCE_BATCH

    m = _cnn()
    an = memopt.analyze(m.main)
    assert an.batch_for() == REFERENCE_BATCH == 32
    assert str(an).startswith("memory analysis at batch size 32 (the default")
    report = memopt.memory_optimize(m.main, level=1)
    assert report.batch_size == 32
    assert "peak of the step at batch 32 (the default: pass batch_size for yours)" in str(report)
    assert report.peak_before == memopt.analyze(_cnn().main).step_peak()


def test_gc_off_budget_at_the_unchanged_peak_holds_when_measured(paddle):
    """GC off: the step's figure (the next feed included) is met by every
    measured step of the unchanged program that budget= returns."""
    import memopt
    from paddle.base import core

    with models.flags(eager_delete_tensor_gb=-1.0):
        m = _cnn(32)
        an = memopt.analyze(m.main, 32, fetch_list=[m.loss])
        budget = an.step_peak()
        assert budget == an.total_peak() + an.fed_again_bytes()
        report = memopt.memory_optimize(m.main, budget=budget, batch_size=32,
                                        fetch_list=[m.loss])
        assert not report.recomputed
        rng = np.random.default_rng(0)
        with paddle.static.scope_guard(paddle.static.Scope()):
            exe = paddle.static.Executor(paddle.CPUPlace())
            base = core.host_memory_stat_current_value("Allocated", 0)
            m.initialize(exe)
            peaks = []
            for _ in range(3):
                feed = m.feed(rng)
                core.host_memory_stat_reset_peak_value("Allocated", 0)
                exe.run(m.main, feed=feed, fetch_list=[m.loss])
                peaks.append(core.host_memory_stat_peak_value("Allocated", 0) - base)
    assert an.total_peak() * 0.9 < max(peaks) <= budget, (peaks, budget)


def test_arena_and_problem_capacities_take_strings(tmp_path):
    import memopt
    from memopt.arena import plan_arena
    from memopt.problems import Buffer, read_csv, write_csv

    buffers = [Buffer(0, 0, 2, 1024), Buffer(1, 1, 3, 1024), Buffer(2, 3, 4, 2048)]
    assert plan_arena(buffers, capacity="2KiB").height == plan_arena(buffers, capacity=2048).height
    with pytest.raises(memopt.PlanError):
        plan_arena(buffers, capacity="1KiB")
    with pytest.raises(memopt.ArgumentTypeError, match="capacity must be bytes"):
        plan_arena(buffers, capacity=[2048])
    path = tmp_path / "p.csv"
    write_csv(memopt.Problem(buffers), path)
    assert read_csv(path, capacity="4KiB").capacity == 4096
