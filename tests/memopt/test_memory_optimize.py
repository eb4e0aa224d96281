"""memory_optimize on real legacy Paddle training programs: same numbers, less memory.

Every model of memopt.testing.models is trained for three steps unoptimized and
optimized; losses, fetched outputs and every parameter must be bit-identical
(np.array_equal), at level 0 and 1, with Paddle's garbage collector on and
off.  The fetched logits are kept with skip_opt_set (fetching a merged
variable raises, see test_fetch_of_merged_variable_raises).
"""
import numpy as np
import pytest

import memopt
from memopt.testing import models
from memopt.errors import MergedVariableError
from runs import STEPS, after_one_step, assert_same, reference


#: (level, gc, skip_grads): each level in each GC mode, gradients in and out
CONFIGS = [
    (0, "on", True),
    (1, "on", False),
    (0, "off", False),
    (1, "off", False),
    (1, "off", True),
]

def gc_flag(gc: str) -> dict:
    return {"eager_delete_tensor_gb": 0.0 if gc == "on" else -1.0}


def optimize(model, **kwargs):
    kwargs.setdefault("skip_opt_set", [model.fetch_list[1]])
    with model.guard():
        return memopt.memory_optimize(model.main, **kwargs)


@pytest.mark.parametrize("level,gc,skip_grads", CONFIGS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_bit_identical(paddle, name, level, gc, skip_grads):
    expected = reference(name)
    model = models.build(name, "legacy")
    with models.flags(**gc_flag(gc)):
        report = optimize(model, level=level, skip_grads=skip_grads)
        actual = models.run_steps(model, STEPS)
    assert_same(expected, actual)
    assert report.gc is (gc == "on")
    if gc == "off" and not skip_grads:
        assert report.merged_count > 0, "every model has something to share"
    if gc == "on":
        assert all(r.how == "in-place" for r in report.reuses)
        assert report.peak_after <= report.peak_before


def test_gc_off_saves_memory_in_the_estimate(paddle):
    model = models.build("mlp", "legacy")
    with models.flags(**gc_flag("off")):
        report = optimize(model, level=1, skip_grads=False)
    assert report.peak_after < report.peak_before
    assert report.temporaries_after.at(32) < report.temporaries_before.at(32)


# -- the arguments -------------------------------------------------------------

def merged_names(report):
    return {r.var for r in report.reuses} | {r.takes for r in report.reuses}


def used_names(program):
    return {n for block in program.blocks for op in block.ops
            for n in (*op.input_arg_names, *op.output_arg_names)}


@pytest.mark.parametrize("as_variable", [False, True])
def test_skip_opt_set_keeps_a_variable(paddle, as_variable):
    with models.flags(**gc_flag("off")):
        probe = optimize(models.build("mlp", "legacy"), level=1, skip_grads=False)
        victim = probe.reuses[0].takes
        model = models.build("mlp", "legacy")
        item = model.main.global_block().var(victim) if as_variable else victim
        report = optimize(model, level=1, skip_grads=False,
                          skip_opt_set=[model.fetch_list[1], item])
    assert victim not in merged_names(report)
    assert victim in used_names(model.main)
    assert report.not_merged["skip_opt_set"] == 2


def test_skip_grads(paddle):
    with models.flags(**gc_flag("off")):
        kept = optimize(models.build("transformer", "legacy"), level=1, skip_grads=True)
        free = optimize(models.build("transformer", "legacy"), level=1, skip_grads=False)
    assert not any("@GRAD" in n for n in merged_names(kept))
    assert any("@GRAD" in n for n in merged_names(free))
    assert free.merged_count > kept.merged_count


def test_levels(paddle):
    """Level 0 shares only between equal shapes and dtypes; level 1 also
    across shapes, never into memory that may be smaller for some batch."""
    with models.flags(**gc_flag("off")):
        model0 = models.build("transformer", "legacy")
        level0 = optimize(model0, level=0, skip_grads=False)
        model1 = models.build("transformer", "legacy")
        level1 = optimize(model1, level=1, skip_grads=False)
    # merged names leave the rewritten program: look them up in a fresh build
    original = models.build("transformer", "legacy").main
    for r in level0.reuses:
        taken = original.block(r.block).var(r.takes)
        assert (tuple(taken.shape), str(taken.dtype)) == (r.shape, "paddle." + r.dtype)
    assert any(r.shape != tuple(original.block(r.block).var(r.takes).shape)
               for r in level1.reuses)
    for r in level1.reuses:
        group_first = model1.main.block(r.block).var(r.renamed_to)
        assert r.size.provably_le(_size(group_first))
    assert level1.merged_count >= level0.merged_count


def _size(var):
    from memopt.graph import size_of
    from paddle.base.data_feeder import convert_dtype

    return size_of(tuple(var.shape), convert_dtype(var.dtype))


def test_print_log(paddle, capsys):
    with models.flags(**gc_flag("off")):
        report = optimize(models.build("mlp", "legacy"), level=1, skip_grads=False,
                          print_log=True)
    out = capsys.readouterr().out
    assert out.strip() == str(report)
    assert f"merged variables: {report.merged_count}" in out
    first = report.reuses[0]
    # summary first, then one line per shared memory naming each variable
    assert out.startswith("memopt: ") and f"{first.var} ({first.how}" in out
    assert f"    {first.renamed_to} " in out
    # print_log only prints: the quiet call plans what the printing one does
    loud = optimize(models.build("mlp", "legacy"), print_log=True)
    assert capsys.readouterr().out.strip() == str(loud)
    quiet = optimize(models.build("mlp", "legacy"))
    assert capsys.readouterr().out == ""
    assert quiet.reuses == loud.reuses and quiet.merged_count == loud.merged_count > 0


def test_default_program(paddle):
    model = models.build("mlp", "legacy")
    with model.guard(), paddle.static.program_guard(model.main, model.startup):
        report = memopt.memory_optimize(skip_opt_set=[model.fetch_list[1]], skip_grads=False)
    assert report.merged_count > 0
    assert report.program_type == "legacy"


# -- errors ----------------------------------------------------------------------

def test_bare_string_skip_opt_set(paddle):
    model = models.build("mlp", "legacy")
    with pytest.raises(TypeError, match="not a tuple") as info:
        memopt.memory_optimize(model.main, skip_opt_set=("fc"))
    assert "'fc'" in str(info.value)


@pytest.mark.parametrize("level", [3, -1, True, "1", 0.5])
def test_bad_level(paddle, level):
    with pytest.raises(ValueError, match="level must be 0"):
        memopt.memory_optimize(models.build("mlp", "legacy").main, level=level)


@pytest.mark.parametrize("bad", [3, {"a": 1}.keys(), b"fc"])
def test_bad_skip_opt_set_type(paddle, bad):
    with pytest.raises(TypeError, match="skip_opt_set"):
        memopt.memory_optimize(models.build("mlp", "legacy").main, skip_opt_set=bad)


def test_bad_skip_opt_set_item(paddle):
    with pytest.raises(TypeError, match=r"skip_opt_set\[1\]"):
        memopt.memory_optimize(models.build("mlp", "legacy").main, skip_opt_set=["x", 3])


def test_bad_flags(paddle):
    with pytest.raises(TypeError, match="skip_grads"):
        memopt.memory_optimize(models.build("mlp", "legacy").main, skip_grads="no")
    with pytest.raises(TypeError, match="print_log"):
        memopt.memory_optimize(models.build("mlp", "legacy").main, print_log=1)


def test_not_a_program(paddle):
    with pytest.raises(memopt.UnsupportedProgramError, match="dict"):
        memopt.memory_optimize({"ops": []})



@pytest.mark.parametrize("ir", ["legacy", "pir"])
def test_report_at_the_given_batch_size(paddle, ir):
    """``batch_size=`` at level 0/1 gives the report's figures at that batch
    (they were at 32 whatever was passed); the unchanged program's peak at
    that batch is the report's "before"."""
    model = models.build("mlp", ir)
    before = memopt.analyze(model.main, 8, fetch_list=model.fetch_list).total_peak(8)
    report = memopt.memory_optimize(model.main, level=1, batch_size=8,
                                    fetch_list=model.fetch_list)
    assert report.batch_size == 8 and report.peak_before == before
    assert "at batch 8" in str(report)



def test_legacy_report_figures_never_fail_the_rewrite(paddle, monkeypatch, caplog):
    """The legacy report's peaks are analyze()'s; should the analysis fail
    on a program, the rewrite (checked on its own) still lands, with the
    plan's own estimate in the report and a warning naming the failure."""
    from memopt.pipeline import legacy as legacy_pipeline

    model = models.build("mlp", "legacy")
    want = memopt.memory_optimize(models.build("mlp", "legacy").main, level=1,
                                  fetch_list=model.fetch_list)

    def broken(*args, **kwargs):
        raise KeyError("a bug in the analysis")

    monkeypatch.setattr(legacy_pipeline, "analyze_program", broken)
    with caplog.at_level("WARNING", logger="memopt.pipeline.legacy"):
        report = memopt.memory_optimize(model.main, level=1, fetch_list=model.fetch_list)
    assert report.merged_count == want.merged_count > 0
    assert report.peak_before > 0 and report.peak_before != want.peak_before
    assert "analyze failed on this legacy program (KeyError" in caplog.text

@pytest.mark.parametrize("bad", [0, -2, True, "8", 2.0])
def test_bad_batch_size(paddle, bad):
    model = models.build("mlp", "legacy")
    before = model.main.desc.serialize_to_string()
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        memopt.memory_optimize(model.main, level=1, batch_size=bad)
    assert model.main.desc.serialize_to_string() == before

# -- fetches of merged variables -------------------------------------------------------

def test_fetch_of_merged_variable_raises(paddle):
    model = models.build("mlp", "legacy")
    held = dict(model.main.global_block().vars)  # the Variables user code holds
    with models.flags(**gc_flag("off")):
        report = optimize(model, level=1, skip_grads=False)
        gone = report.reuses[0].var
        first = report.reuses[0].takes  # the group's first member: gone too
        assert report.reuses[0].renamed_to.startswith("memopt@buf_")
        with after_one_step(model) as run:
            for item in (gone, held[gone], first):
                with pytest.raises(MergedVariableError) as info:
                    run([model.loss, item])
                text = str(info.value)
                assert repr(item if isinstance(item, str) else item.name) in text
                assert "skip_opt_set" in text


def test_fetch_kept_intermediate_is_correct(paddle):
    """The fetched logits (kept by skip_opt_set) match the unoptimized run."""
    expected = reference("cnn")
    model = models.build("cnn", "legacy")
    with models.flags(**gc_flag("off")):
        optimize(model, level=1, skip_grads=False)
        actual = models.run_steps(model, STEPS)
    for want, got in zip(expected.fetches, actual.fetches, strict=True):
        assert np.array_equal(want[1], got[1])


# -- all or nothing --------------------------------------------------------------------

def serialized(program):
    return program.desc.serialize_to_string()


def test_program_unchanged_when_rewrite_fails_midway(paddle, monkeypatch):
    from memopt.paddle.legacy import program as legacy

    model = models.build("resnet50", "legacy")
    before = serialized(model.main)
    real = legacy._set_slot
    calls = {"n": 0}

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 40:  # fault injection: the 40th slot edit fails
            raise RuntimeError("injected failure")
        real(*args)

    monkeypatch.setattr(legacy, "_set_slot", failing)
    with models.flags(**gc_flag("off")), pytest.raises(RuntimeError, match="injected"):
        optimize(model, level=1, skip_grads=False)
    assert calls["n"] > 40, "the failure happened midway, then edits were undone"
    assert serialized(model.main) == before
    assert not legacy.merged_record(model.main)


def test_program_unchanged_when_plan_fails_check(paddle, monkeypatch):
    from memopt.pipeline import legacy as legacy_pipeline

    model = models.build("mlp", "legacy")
    before = serialized(model.main)
    real = legacy_pipeline.plan_memory

    def corrupt(graph, options, gc, **kw):
        plan = real(graph, options, gc, **kw)
        # merge the input of the first matmul into its output: both live there
        op = graph.blocks[0].ops[0]
        plan.renames.setdefault(0, {})[op.writes[0]] = op.reads[0]
        return plan

    monkeypatch.setattr(legacy_pipeline, "plan_memory", corrupt)
    with pytest.raises(memopt.PlanError):
        optimize(model, level=1, skip_grads=False)
    assert serialized(model.main) == before


def test_dispatches_pir_programs(paddle):
    """A PIR program goes to memopt.paddle.pir.program (its own helper's tests check
    the rewrite); the arguments are validated here first."""
    model = models.build("mlp", "pir")
    with pytest.raises(TypeError, match="not a tuple"):
        memopt.memory_optimize(model.main, skip_opt_set="fc")
    report = memopt.memory_optimize(model.main, skip_grads=False,
                                    skip_opt_set=[model.fetch_list[1]])
    assert report.program_type == "pir"


def test_gc_off_reads_dims_from_the_gradient(paddle):
    """With GC off, bias-add grads read X's dims from Out@GRAD, so X can die
    at its last real use; the numbers stay the same (test_bit_identical)."""
    model = models.build("mlp", "legacy")
    with models.flags(**gc_flag("off")):
        optimize(model, level=1, skip_grads=False)
    for op in model.main.global_block().ops:
        if op.type == "elementwise_add_grad":
            assert op.input("X") == op.input("Out@GRAD")


def test_gc_on_runs_the_conv_bias_add_in_place(paddle):
    """With GC on, the bias add after a conv runs in place on the conv's
    output (as PIR's add_ does): its grad reads the dims from Out@GRAD, so
    the conv output dies at the add; the numbers stay the same."""
    expected = reference("cnn")
    model = models.build("cnn", "legacy")
    with models.flags(**gc_flag("on")):
        report = optimize(model, level=0, skip_grads=False)
        actual = models.run_steps(model, STEPS)
    assert_same(expected, actual)
    from memopt.paddle.legacy import program as legacy

    # the conv output and the add's output now live under one fresh name
    held = {}
    for user, buf in legacy.merged_record(model.main).items():
        held.setdefault(buf, set()).add(user)
    adds = {op.output("Out")[0]: op.input("X")[0] for op in model.main.global_block().ops
            if op.type == "elementwise_add"
            and any(n.startswith("conv2d") for n in held.get(op.input("X")[0], ()))}
    assert adds and all(out == x for out, x in adds.items()), adds
    assert {r.op for r in report.reuses if r.how == "in-place"} >= {"elementwise_add", "relu"}
    assert report.peak_after < report.peak_before


def test_optimizing_twice_is_safe(paddle):
    expected = reference("transformer")
    model = models.build("transformer", "legacy")
    with models.flags(**gc_flag("off")):
        first = optimize(model, level=1, skip_grads=False)
        second = optimize(model, level=1, skip_grads=False)
        actual = models.run_steps(model, STEPS)
    assert_same(expected, actual)
    assert first.merged_count > 0
    assert second.peak_after <= second.peak_before


# -- control flow at depth 2: a while loop inside a conditional branch -------------------

def while_in_cond():
    """A legacy training program whose true branch runs a ``while`` loop
    (depth 2: block 0 -> branch -> loop body), with backward and SGD; the
    feed alternates the branch taken (+1, -1, +1 offsets)."""
    import itertools

    import paddle

    width, batch, classes = 16, 8, 4
    with models.ir_guard("legacy"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, width], "float32")
            y = paddle.static.data("label", [-1, 1], "int64")
            h = paddle.nn.Linear(width, width)(x)
            cell = paddle.nn.Linear(width, width)
            trips = paddle.full([1], 2, "int64")

            def looped():
                def body(i, s):
                    t = paddle.nn.functional.relu(cell(s))
                    return [i + 1, (t * 0.5 + 1.0) + s * 0.25]

                start = paddle.nn.functional.relu(h) * 1.0
                return paddle.static.nn.while_loop(
                    lambda i, s: i < trips, body, [paddle.full([1], 0, "int64"), start])[1]

            def plain():
                return paddle.nn.functional.relu(h * 2.0) + 1.0

            out = models._cond("legacy", paddle.mean(x), 0.0, looped, plain)
            logits = paddle.nn.Linear(width, classes)(out)
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
            paddle.optimizer.SGD(0.1).minimize(loss)
    offsets = itertools.cycle([1.0, -1.0])

    def feed(rng):
        return {"x": (rng.standard_normal((batch, width)) + next(offsets)).astype("float32"),
                "label": rng.integers(0, classes, (batch, 1)).astype("int64")}

    return models.BuiltModel("while_in_cond", "legacy", main, startup, feed, [loss, logits],
                             batch)


def loop_carried(program):
    """Names every ``while`` op both reads and writes: carried from one
    iteration to the next."""
    out = set()
    for block in program.blocks:
        for op in block.ops:
            if op.type == "while":
                out |= set(op.input("X")) & set(op.output("Out"))
    return out


@pytest.mark.parametrize("level,gc", [(0, "off"), (1, "off"), (0, "on"), (1, "on")])
def test_while_inside_a_branch_is_bit_identical(paddle, level, gc):
    expected = models.run_steps(while_in_cond(), STEPS)
    model = while_in_cond()
    loop_body = next(op.attr("sub_block").id for block in model.main.blocks
                     for op in block.ops if op.type == "while")
    carried = loop_carried(model.main)
    grad_outputs = {n for op in model.main.global_block().ops
                    if op.type == "conditional_block_grad" for n in op.output("Input@GRAD")}
    with models.flags(**gc_flag(gc)):
        report = optimize(model, level=level, skip_grads=False)
        actual = models.run_steps(model, STEPS)
    assert_same(expected, actual)
    assert carried, "the loop carries its state"
    touched = {r.var for r in report.reuses} | {r.renamed_to for r in report.reuses}
    assert not carried & touched, "a value read in the next iteration is never merged"
    if gc == "off":
        assert any(r.block == loop_body for r in report.reuses), "locals of the loop body share"
        assert grad_outputs & touched, "a conditional_block_grad output takes memory"


# -- einsum's cache may be its operand's own buffer --------------------------------------

def einsum_on_a_dead_operand():
    """``einsum('bij,jk->bik', a, w)`` where ``a`` is already in the kernel's
    order, so its ``InnerCache`` (read by ``einsum_grad``) is ``a``'s own
    buffer; ``a`` has no other reader, and ``v``, born after the einsum,
    has ``a``'s shape: merging ``v`` into ``a`` would overwrite the cache."""
    import paddle

    batch, rows, width = 4, 8, 16
    with models.ir_guard("legacy"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, rows, width], "float32")
            w = paddle.create_parameter([width, width], "float32")
            a = x * 2.0
            y = paddle.einsum("bij,jk->bik", a, w)
            v = x * 3.0 + 1.0
            loss = paddle.mean(y) + paddle.mean(v)
            out = paddle.mean(v, axis=1)
            paddle.optimizer.SGD(0.1).minimize(loss)

    def feed(rng):
        return {"x": rng.standard_normal((batch, rows, width)).astype("float32")}

    return models.BuiltModel("einsum_alias", "legacy", main, startup, feed, [loss, out], batch)


def test_einsum_cache_that_may_alias_keeps_its_operand(paddle):
    from memopt.paddle.legacy.program import einsum_cache_copies

    assert einsum_cache_copies("bij,jk->bik", [(-1, 8, 16), (16, 16)]) == [False, False]
    assert einsum_cache_copies("bqhd,bkhd->bhqk", [(-1, 8, 2, 4)] * 2) == [True, True]
    assert einsum_cache_copies("bhqk,bkhd->bqhd", [(-1, 2, 8, 8), (-1, 8, 2, 4)]) == [False, True]
    assert einsum_cache_copies("ij,kj->ik", [(3, 4), (5, 4)]) == [False, True]
    assert einsum_cache_copies("ij,jk->ik", [(3, 1), (4, 5)]) == [False, False]  # may tile
    expected = models.run_steps(einsum_on_a_dead_operand(), STEPS)
    for level in (0, 1):
        model = einsum_on_a_dead_operand()
        operand = next(op for op in model.main.global_block().ops
                       if op.type == "einsum").input("Operands")[0]
        with models.flags(**gc_flag("off")):
            report = optimize(model, level=level, skip_grads=False)
            actual = models.run_steps(model, STEPS)
        assert_same(expected, actual)
        assert report.reuses, "other variables still share"
        assert operand not in {n for r in report.reuses for n in (r.var, r.takes, r.renamed_to)}


def test_level_1_runs_reshape_in_place(paddle):
    """At level 1 a reshape2 whose input dies there writes its output into
    the input's memory (same bytes, other dims); level 0 keeps shapes apart."""
    def reshapes_in_place(level):
        model = models.build("transformer", "legacy")
        with models.flags(**gc_flag("off")):
            report = optimize(model, level=level, skip_grads=False)
        return [r for r in report.reuses if r.how == "in-place" and r.op == "reshape2"]

    assert reshapes_in_place(1)
    assert not reshapes_in_place(0)


def test_add_writes_into_its_dying_second_operand(paddle):
    """The loop body's ``relu(cell(h)) + h * 0.5``: X (the relu) is kept for
    the backward, Y (``h * 0.5``) dies at the add, so the sum takes Y's
    memory; the numbers stay bit-identical."""
    expected = reference("while_loop")
    model = models.build("while_loop", "legacy")
    body = next(op.attr("sub_block").id for op in model.main.global_block().ops
                if op.type == "while")
    adds = {op.output("Out")[0]: op.input("Y")[0] for op in model.main.block(body).ops
            if op.type == "elementwise_add"}
    with models.flags(**gc_flag("off")):
        report = optimize(model, level=1, skip_grads=False)
        actual = models.run_steps(model, STEPS)
    assert_same(expected, actual)
    assert any(r.how == "in-place" and adds.get(r.var) == r.takes for r in report.reuses)
