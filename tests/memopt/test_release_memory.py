"""release_memory: free each temporary right after its last use when Paddle's
garbage collector is off.

Hand-made graphs check where releases go and that the independent checker
rejects a wrong one; real legacy programs on Paddle's executor check that the
numbers stay bit-identical, that the allocator's peak really drops, that a
fetch of a released variable raises, and that a failed insert leaves the
program exactly as it was.
"""
import re

import numpy as np
import pytest

import memopt
from memopt.testing import models
from memopt.errors import MergedVariableError, PlanError
from memopt.graph import Graph, Op, OpFacts, Var
from memopt.release import plan_releases, verify_releases
from memopt.reporting import peak_holding
from runs import STEPS, after_one_step, assert_same, reference

GC_OFF = {"eager_delete_tensor_gb": -1.0}
GC_ON = {"eager_delete_tensor_gb": 0.0}
#: For the measured peaks: ops in program order.  Paddle's multi-thread
#: executor may run a release a little after ops that allocate (measured on
#: the CNN below: 4.5-5.8 MiB from run to run, 4.5 MiB always in order).
MEASURED = dict(GC_OFF, new_executor_sequential_run=True)


# -- hand-made graphs --------------------------------------------------------------------------

def chain(n=4):
    """x -> t0 -> ... -> t{n-1} -> loss -> loss@GRAD (fetched: loss)."""
    g = Graph(fetch_names=("loss",))
    b = g.global_block
    b.add_var(Var("x", (-1, 8), is_data=True))
    for i in range(n):
        b.add_var(Var(f"t{i}", (-1, 8)))
    b.add_var(Var("loss", ()))
    prev = "x"
    for i in range(n):
        b.add_op(Op("relu", (prev,), (f"t{i}",)))
        prev = f"t{i}"
    b.add_op(Op("mean", (prev,), ("loss",), facts=OpFacts(loss=True)))
    return g


def test_each_temporary_released_after_its_last_read():
    g = chain(4)
    plan = plan_releases(g)
    # t3's last reader is the last op: nothing runs after it to gain memory
    assert plan.after == {1: ("t0",), 2: ("t1",), 3: ("t2",)}
    verify_releases(g, plan.after)
    assert plan.released == ["t0", "t1", "t2"]


def test_skip_opt_set_and_the_last_op_are_kept():
    g = chain(4)
    plan = plan_releases(g, skip_opt_set={"t1"})
    assert "t1" not in plan.released and plan.reasons.get("skip_opt_set") == 1
    g.global_block.add_op(Op("scale", ("t3",), ("loss",)))  # t3 now read by the last op
    assert "t3" not in plan_releases(g).released


def test_already_released_is_not_released_again():
    g = chain(3)
    b = g.global_block
    b.add_var(Var("memopt@released", (0,)))
    ops = list(b.ops)
    b.ops.clear()
    for op in ops[:2]:
        b.add_op(op)
    # t0 released right after its last read, as an earlier call would have
    b.add_op(Op("share_buffer", ("memopt@released",), ("t0", "memopt@released"),
                facts=OpFacts(release=("t0",))))
    for op in ops[2:]:
        b.add_op(op)
    plan = plan_releases(g)
    assert plan.already == ("t0",)
    assert "t0" not in plan.released and "memopt@released" not in plan.released


def test_control_flow_variables_are_not_released():
    g = chain(3)
    b = g.global_block
    body = g.new_block(0)
    body.add_var(Var("inner", (-1, 8)))
    body.add_op(Op("relu", ("t0",), ("inner",)))
    b.ops.insert(1, Op("conditional_block", ("t0",), (), sub_blocks=(body.idx,)))
    plan = plan_releases(g)
    assert "t0" not in plan.released and "inner" not in plan.released
    verify_releases(g, plan.after)


@pytest.mark.parametrize("after,message", [
    ({0: ("t0",)}, "op 1 (relu) uses it later"),           # t0 is read by op 1
    ({1: ("t0",), 2: ("t0",)}, "released twice"),
    ({1: ("x",)}, "not a temporary"),                       # data
    ({4: ("loss",)}, "not a temporary"),                    # fetched
    ({9: ("t0",)}, "block 0 has 5 ops"),
])
def test_checker_rejects_wrong_releases(after, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        verify_releases(chain(4), after)


def test_checker_sees_uses_inside_sub_blocks():
    g = chain(3)
    body = g.new_block(0)
    body.add_op(Op("relu", ("t0",), ("t2",)))
    g.global_block.add_op(Op("while", (), (), sub_blocks=(body.idx,)))
    with pytest.raises(PlanError, match="'t0' is released after op 1"):
        verify_releases(g, {1: ("t0",)})


def test_estimated_peak_drops_to_the_live_set():
    g = chain(4)
    plan = plan_releases(g)
    held, _ = peak_holding(plan.buffers, (), [], batch_size=2)
    freed, holders = peak_holding(plan.buffers, plan.released, [], batch_size=2)
    per = 2 * 8 * 4
    # the fed x, every t and the loss held to the end
    assert held == 5 * per + 4
    # x, and the one an op reads and the next it writes
    assert freed == 3 * per
    assert holders and holders[0].bytes == per


def test_analysis_ends_a_released_variable_at_its_release():
    from memopt import analyze
    from memopt.analysis import RuntimeModel

    off = RuntimeModel(gc=False, inplace=False, schedule="program")
    per = 2 * 8 * 4
    held = analyze(chain(4), 2, runtime=off).peak()
    g = chain(4)
    b = g.global_block
    b.add_var(Var("memopt@released", (0,)))
    # release t0 right after t1 is written (its last reader)
    b.ops.insert(2, Op("share_buffer", ("memopt@released",), ("t0", "memopt@released"),
                       facts=OpFacts(release=("t0",))))
    released = analyze(g, 2, runtime=off).peak()
    assert held - released == per


# -- real programs on Paddle's executor ------------------------------------------------------

def release(model, optimize_first=True):
    keep = [model.fetch_list[1]]
    with model.guard():
        if optimize_first:
            memopt.memory_optimize(model.main, skip_opt_set=keep, level=1, skip_grads=False)
        return memopt.release_memory(model.main, skip_opt_set=keep)


def release_ops(program):
    return [op for op in program.global_block().ops if op.type == "share_buffer"]


@pytest.mark.parametrize("optimize_first", [True, False])
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_bit_identical_with_gc_off(paddle, name, optimize_first):
    model = models.build(name, "legacy")
    with models.flags(**GC_OFF):
        report = release(model, optimize_first)
        actual = models.run_steps(model, STEPS)
    assert_same(reference(name), actual)
    assert report.released and len(release_ops(model.main)) == len(report.released)
    assert report.peak_after < report.peak_before
    assert "freed right after their last use" in report.release


@pytest.mark.parametrize("name", ["cnn", "while_loop"])
def test_memory_optimize_after_release_memory(paddle, name):
    """The other order works too: the planner reads release ops like any op
    (a released name's memory may go to a later variable, which then
    allocates afresh)."""
    model = models.build(name, "legacy")
    keep = [model.fetch_list[1]]
    with models.flags(**GC_OFF):
        with model.guard():
            released = memopt.release_memory(model.main, skip_opt_set=keep)
            optimized = memopt.memory_optimize(model.main, skip_opt_set=keep, level=1,
                                               skip_grads=False)
        actual = models.run_steps(model, STEPS)
    assert_same(reference(name), actual)
    assert released.released and optimized.merged_count > 0


def test_gc_on_leaves_the_program(paddle):
    model = models.build("mlp", "legacy")
    before = model.main.desc.serialize_to_string()
    with models.flags(**GC_ON):
        report = release(model, optimize_first=False)
    assert model.main.desc.serialize_to_string() == before
    assert report.released == [] and report.peak_after == report.peak_before
    assert "garbage collector frees" in report.release


def test_released_program_runs_with_gc_on_too(paddle):
    """A program released for a GC-off run, run with the collector on: the
    releases free what the collector would have, the numbers are the same."""
    model = models.build("transformer", "legacy")
    with models.flags(**GC_OFF):
        report = release(model)
    with models.flags(**GC_ON):
        actual = models.run_steps(model, STEPS)
    assert report.released
    assert_same(reference("transformer"), actual)


def _peak_bytes(paddle, model):
    """Peak of Paddle's host allocator over two training steps, above what
    was allocated before them."""
    from paddle.base import core

    core.host_memory_stat_reset_peak_value("Allocated", 0)
    start = core.host_memory_stat_current_value("Allocated", 0)
    models.run_steps(model, 2)
    return core.host_memory_stat_peak_value("Allocated", 0) - start


def test_allocator_peak_drops(paddle):
    """Measured, not estimated: the same CNN (batch 32, 32x32 images) with GC
    off, memory_optimize(level=1) alone and followed by release_memory."""
    peaks = {}
    with models.flags(**MEASURED):
        for with_release in (False, True):
            model = models.build("cnn", "legacy", 32, image_size=32)
            with model.guard():
                memopt.memory_optimize(model.main, skip_opt_set=[model.fetch_list[1]],
                                       level=1, skip_grads=False)
                if with_release:
                    memopt.release_memory(model.main, skip_opt_set=[model.fetch_list[1]])
            peaks[with_release] = _peak_bytes(paddle, model)
    # measured 6.6 MiB -> 4.5 MiB: three 1 MiB and three 512 KiB buffers are
    # no longer all held at the end of the backward pass
    assert peaks[True] < peaks[False] - 1.5 * 2 ** 20, peaks


def test_analysis_predicts_the_measured_peak(paddle):
    """memopt.analyze on the rewritten legacy program (GC off) follows the
    renames (one buffer per variable, however often written) and the
    releases: predicted within 10% of the allocator's measured peak."""
    from memopt import analyze

    with models.flags(**MEASURED):
        model = models.build("cnn", "legacy", 32, image_size=32)
        keep = [model.fetch_list[1]]
        with model.guard():
            before = analyze(model.main, 32, fetch_list=[model.loss]).peak()
            memopt.memory_optimize(model.main, skip_opt_set=keep, level=1, skip_grads=False)
            optimized = analyze(model.main, 32, fetch_list=[model.loss]).peak()
            memopt.release_memory(model.main, skip_opt_set=keep)
            released = analyze(model.main, 32, fetch_list=[model.loss]).peak()
        measured = _peak_bytes(paddle, model)
    assert released < optimized < 0.5 * before
    assert 0.9 <= released / measured <= 1.1, (released, measured)


def test_second_call_releases_nothing_new(paddle):
    model = models.build("cnn", "legacy")
    with models.flags(**GC_OFF):
        first = release(model)
        program = model.main.desc.serialize_to_string()
        second = memopt.release_memory(model.main, skip_opt_set=[model.fetch_list[1]])
    assert second.released == [] and "were released before" in second.release
    assert model.main.desc.serialize_to_string() == program
    assert len(first.released) > 0


def test_fetch_of_released_variable_raises(paddle):
    model = models.build("mlp", "legacy")
    with models.flags(**GC_OFF):
        report = release(model, optimize_first=False)
        gone = report.released[0]
        with after_one_step(model) as run, pytest.raises(MergedVariableError) as info:
            run([model.loss, gone])
    text = str(info.value)
    assert repr(gone) in text and "release_memory" in text and "skip_opt_set" in text


def test_skip_opt_set_keeps_a_variable_fetchable(paddle):
    model = models.build("mlp", "legacy")
    with models.flags(**GC_OFF):
        first = release(models.build("mlp", "legacy"), optimize_first=False)
        keep = first.released[0]
        with model.guard():
            report = memopt.release_memory(model.main, skip_opt_set=[keep])
        assert keep not in report.released
        expected = models.run_steps(models.build("mlp", "legacy"), 1, fetch_list=None)
        out = models.run_steps(model, 1, fetch_list=[model.loss, keep])
    assert np.array_equal(out.fetches[0][0], expected.fetches[0][0])
    assert out.fetches[0][1].size > 0


def test_program_unchanged_when_insert_fails_midway(paddle, monkeypatch):
    from paddle.base import framework

    model = models.build("resnet50", "legacy")
    before = model.main.desc.serialize_to_string()
    ops_before = [op.type for op in model.main.global_block().ops]
    calls = {"n": 0}

    class Failing(framework.Operator):
        def __init__(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 30:  # fault injection: the 30th release op fails
                raise RuntimeError("injected failure")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(framework, "Operator", Failing)
    with models.flags(**GC_OFF), pytest.raises(RuntimeError, match="injected"):
        release(model, optimize_first=False)
    assert calls["n"] == 30
    assert model.main.desc.serialize_to_string() == before
    assert [op.type for op in model.main.global_block().ops] == ops_before
    assert not model.main.global_block().has_var("memopt@released")


def test_wrong_plan_is_caught_before_the_program_changes(paddle, monkeypatch):
    from memopt.pipeline import legacy as legacy_pipeline

    model = models.build("mlp", "legacy")
    before = model.main.desc.serialize_to_string()
    real = legacy_pipeline.plan_releases

    def early(graph, skip_opt_set=()):
        plan = real(graph, skip_opt_set)
        first = min(plan.after)
        name = plan.after[first][0]
        plan.after = {first - 1: (name,)}  # one op too early: its last reader follows
        return plan

    monkeypatch.setattr(legacy_pipeline, "plan_releases", early)
    with models.flags(**GC_OFF), pytest.raises(PlanError, match="uses it later"):
        release(model, optimize_first=False)
    assert model.main.desc.serialize_to_string() == before
