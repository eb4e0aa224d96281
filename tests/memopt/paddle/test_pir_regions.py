"""budget= and level=2 on PIR training programs whose top-level block runs
an if / a while (memopt.paddle.pir.regions: region ops opaque).

Real programs (memopt.testing.models "cond_mlp": a static.nn.cond on a fed flag
between ReLU layers; "while_mlp": a static.nn.while_loop of a shared tanh
layer; "dense_cond": DenseNet-style concat features, then a cond), real
executor, three training steps compared bit for bit with the
unchanged program (losses, logits, every parameter).
"""
import numpy as np
import pytest

from memopt.testing import models
from runs import assert_same

REGION_MODELS = ("cond_mlp", "while_mlp", "dense_cond")


def _guarded(program, batch):
    """The predicted peak budgets are checked against (frees GC_LAG_OPS
    late), the loops' trip counts read from the program."""
    import memopt
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.budget import guarded_peak
    from memopt.paddle.pir.loops import runtime_for

    runtime = runtime_for(program, runtime_model("pir"), budget=True)
    return guarded_peak(memopt.analyze(program, batch, runtime=runtime), batch)


def _region_external_ids(program) -> set:
    """Value ids the region ops of ``program``'s top-level block read from
    outside (Paddle's own get_used_external_value) and take as operands."""
    from paddle.base import core

    out = set()
    for op in program.global_block().ops:
        if op.num_regions():
            out |= {v.id for v in core.pir.get_used_external_value(op)}
            out |= {v.id for v in op.operands_source() if v.initialized()}
    return out


@pytest.mark.parametrize("name", REGION_MODELS)
def test_budget_recomputes_around_regions_bit_identically(paddle, name):
    import memopt
    from memopt import recompute as rc
    from memopt.paddle.pir import program as pir
    from memopt.paddle.pir import recompute as pir_recompute

    reference = models.run_steps(models.build(name, "pir"), steps=3)
    model = models.build(name, "pir")
    batch = model.batch_size
    pg = pir.convert(model.main, model.fetch_list)
    problem = pir_recompute.problem_of(pg, batch)
    region_names = {n for n, v in pg.values.items()
                    if v.id in _region_external_ids(model.main)}
    saved = rc.saved_values(problem)
    # cond_mlp: the ReLU output feeding the cond is saved (relu_grad reads
    # it) and read in both branches and in both backward branches: pinned,
    # never a candidate; values the regions read always are
    assert region_names & set(saved) or name != "cond_mlp"
    assert region_names <= problem.pinned
    assert not region_names & set(rc.candidates(problem))

    before_ops = [op.name() for op in model.main.global_block().ops]
    before = str(model.main)
    with pytest.raises(memopt.BudgetError) as info:
        memopt.memory_optimize(model.main, budget="1MiB", batch_size=batch,
                               fetch_list=model.fetch_list)
    assert str(model.main) == before
    assert [op.name() for op in model.main.global_block().ops] == before_ops

    default = _guarded(model.main, batch)
    budget = info.value.smallest_budget
    assert budget < default  # recomputation lowers the peak
    # the recomputation alone: the regions still read the very values they
    # read (no clone is read inside a region), and it undoes to the program
    from memopt.paddle.pir import budget as pir_budget
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.loops import runtime_for

    runtime = runtime_for(model.main, runtime_model("pir"), budget=True)
    choice, applied = pir_budget.choose_plan(pg, sorted(pg.name(v) for v in model.fetch_list),
                                             batch, budget, runtime)
    assert choice.plan.dropped and not set(choice.plan.dropped) & region_names
    assert {pg.values[n].id for n in region_names} <= _region_external_ids(model.main)
    applied.undo()
    assert str(model.main) == before

    report = memopt.memory_optimize(model.main, budget=budget, batch_size=batch,
                                    fetch_list=model.fetch_list)
    assert sorted(report.recomputed) == sorted(choice.plan.dropped)
    assert report.added_compute_percent > 0
    assert report.peak_after <= budget and _guarded(model.main, batch) <= budget
    ops = [op.name() for op in model.main.global_block().ops]
    assert ops.count("pd_op.if") == before_ops.count("pd_op.if")
    assert ops.count("pd_op.while") == before_ops.count("pd_op.while")
    assert_same(reference, models.run_steps(model, steps=3))
    # a clone of the rewritten program trains alike (PIR's static.save aborts
    # on training programs with cond/while in Paddle 3.3.1, rewritten or not)
    import paddle as pd
    from memopt.paddle.pir.rewrite import resolve_fetch_list

    mapping = pd.pir.IrMapping()
    twin = models.build(name, "pir")
    twin.main = model.main.clone(mapping)  # twin's own program is freed here:
    # fetch the clone's Values (the freed program's would dangle: a segfault
    # in one run of this file after others)
    twin.fetch_list = [mapping.look_up(v)
                       for v in resolve_fetch_list(model.main, model.fetch_list)]
    assert_same(reference, models.run_steps(twin, steps=3))


@pytest.mark.parametrize("name", REGION_MODELS)
def test_level2_orders_region_programs_bit_identically(paddle, name):
    import memopt

    reference = models.run_steps(models.build(name, "pir"), steps=3)
    model = models.build(name, "pir")
    report = memopt.memory_optimize(model.main, level=2, batch_size=model.batch_size,
                                    fetch_list=model.fetch_list)
    assert report.peak_after <= report.peak_before
    assert not any("left out" in n and "order" in n for n in report.notes), report.notes
    if name == "dense_cond":  # the concat slices too (the last concat: read in the branches)
        assert any("are sliced out" in n for n in report.notes), report.notes
        assert report.peak_after < 0.9 * report.peak_before
    assert_same(reference, models.run_steps(model, steps=3))


def _random_order(problem, rng) -> list:
    """A random topological order of ``problem`` (pinned ops first, as
    written)."""
    n = len(problem.ops)
    waiting = [set(op.after) for op in problem.ops]
    order = [i for i, op in enumerate(problem.ops) if op.pinned]
    done = set(order)
    for i in order:
        assert not waiting[i] - done
    while len(order) < n:
        ready = [i for i in range(n) if i not in done and waiting[i] <= done]
        pick = ready[int(rng.integers(len(ready)))]
        order.append(pick)
        done.add(pick)
    return order


@pytest.mark.parametrize("name", REGION_MODELS)
def test_every_order_the_region_rule_allows_is_bit_identical(paddle, name):
    """The dependencies of a region op (pir_schedule.order_problem): random
    orders that keep them move the region op across other ops and train
    exactly as the program does; none is predicted under any_order_bound."""
    import memopt
    from memopt.paddle.pir import program as pir
    from memopt.paddle.pir import regions as pir_regions
    from memopt.paddle.pir import schedule as pir_schedule
    from memopt.schedule import check_topological

    reference = models.run_steps(models.build(name, "pir"), steps=3)
    rng = np.random.default_rng(5)
    moved = False
    for _ in range(2):
        model = models.build(name, "pir")
        pg = pir.convert(model.main, model.fetch_list)
        problem = pir_schedule.order_problem(pg, model.batch_size)
        grouped = pir_regions.graph_ops_of(pg)
        assert len(problem.ops) == len(model.main.global_block().ops) == len(grouped)
        regions = [i for i, (op, _) in enumerate(grouped) if op.num_regions()]
        # the forward region follows the maker of what only its regions read
        first = problem.ops[regions[0]]
        facts = pir_regions.regions_of(pg)
        (head,) = [k for k in grouped[regions[0]][1] if k in facts]
        inner_only = [pg.values[n] for n in facts[head][0]
                      if n in pg.values and pg.values[n].get_defining_op() is not None]
        assert len(inner_only) > 1
        makers = {op.id(): i for i, (op, _) in enumerate(grouped)}
        assert {makers[v.get_defining_op().id()] for v in inner_only
                if v.get_defining_op().id() in makers} <= set(first.after)
        order = _random_order(problem, rng)
        check_topological(problem, order)
        position = {op: k for k, op in enumerate(order)}
        moved |= any((position[r] < position[j]) != (r < j)
                     for r in regions for j in range(len(order)))
        bound, _ = pir_schedule.any_order_bound(model.main, model.batch_size)
        pir_schedule.apply_order(model.main, order)
        assert memopt.analyze(model.main, model.batch_size).total_peak() >= bound
        assert_same(reference, models.run_steps(model, steps=3))
    assert moved, "no random order moved a region op across another op"


def test_loop_trip_counts_and_unknown_counts(paddle):
    import memopt
    from memopt.errors import UnsupportedProgramError
    from memopt.paddle.pir import loops as pir_loops

    assert pir_loops.loop_iterations(models.build("while_mlp", "pir", steps=5).main) == 5
    assert pir_loops.loop_iterations(models.build("cond_mlp", "pir").main) == 1
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, 8], "float32")
        n = paddle.static.data("n", [1], "int64")  # the trip count is fed
        h = paddle.nn.Linear(8, 8)(x)
        _, h = paddle.static.nn.while_loop(
            lambda i, v: i < n, lambda i, v: [i + 1, paddle.tanh(v)],
            [paddle.full([1], 0, "int64"), h])
        loss = paddle.mean(h)
        paddle.optimizer.SGD(0.1).minimize(loss)
    assert pir_loops.loop_iterations(main) is None
    before = str(main)
    with pytest.raises(UnsupportedProgramError, match="trip count"):
        memopt.memory_optimize(main, budget="1GiB", batch_size=4, fetch_list=[loss])
    assert str(main) == before
    report = memopt.memory_optimize(main, level=2, batch_size=4, fetch_list=[loss])
    assert report.peak_after <= report.peak_before


def test_level2_on_a_region_program_with_gc_off(paddle):
    """GC off (FLAGS_eager_delete_tensor_gb=-1): nothing is freed during a
    step, the order is chosen for that runtime and the run stays
    bit-identical."""
    import memopt

    with models.flags(eager_delete_tensor_gb=-1.0):
        reference = models.run_steps(models.build("while_mlp", "pir"), steps=3)
        model = models.build("while_mlp", "pir")
        report = memopt.memory_optimize(model.main, level=2, batch_size=model.batch_size,
                                        fetch_list=model.fetch_list)
        assert report.peak_after <= report.peak_before
        assert not any("left out" in n and "order" in n for n in report.notes), report.notes
        assert_same(reference, models.run_steps(model, steps=3))


def _branch_writes_outer(paddle):
    """A cond whose true branch writes over an outer value ``buf``
    (``paddle.assign(..., output=buf)``: ``assign_out_``) that a layer
    reads before the cond and another after it, and whose backward reads
    it again.  Returns ``(build, run)``."""
    def build():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, 64], "float32")
            flag = paddle.static.data("flag", [1], "float32")
            h = paddle.nn.functional.relu(paddle.nn.Linear(64, 64)(x))
            buf = paddle.scale(h, 1.0)
            before = paddle.nn.functional.relu(paddle.nn.Linear(64, 64)(buf))

            def write():
                paddle.assign(h * 3.0, output=buf)
                return h + 1.0

            out = paddle.static.nn.cond(paddle.mean(flag) > 0, write, lambda: h - 1.0)
            after = paddle.nn.functional.relu(paddle.nn.Linear(64, 64)(buf + out + before))
            loss = paddle.mean(paddle.square(paddle.nn.Linear(64, 1)(after)))
            paddle.optimizer.SGD(0.01).minimize(loss)
        return main, startup, loss, buf

    def run(main, startup, loss):
        scope, rng, out = paddle.static.Scope(), np.random.default_rng(0), []
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(3)
            exe.run(startup)
            for step in range(3):
                feed = {"x": rng.standard_normal((256, 64)).astype("float32"),
                        "flag": np.array([-1.0 if step == 1 else 1.0], "float32")}
                out.append(exe.run(main, feed=feed, fetch_list=[loss])[0])
            params = [np.array(scope.find_var(op.attrs()["parameter_name"]).get_tensor())
                      for op in main.global_block().ops if op.name() == "builtin.parameter"]
        return out + params

    return build, run


def test_a_value_a_branch_writes_over_is_never_recomputed_nor_crossed(paddle):
    """``buf``, written in place inside the true branch, is barred: no
    clone reads or remakes it (measured: with the bar left out the
    smallest budget's plan recomputes ``buf``'s reader from ``buf`` and
    losses 2 and 3 differ); the order keeps every reader of it on its side
    of the cond (with that rule left out, one random order in six differed);
    budget= and random orders train bit-identically."""
    import memopt
    from memopt.paddle.pir import program as pir
    from memopt.paddle.pir import recompute as pir_recompute
    from memopt.paddle.pir import regions as pir_regions
    from memopt.paddle.pir import schedule as pir_schedule

    build, run = _branch_writes_outer(paddle)
    main, startup, loss, buf = build()
    reference = run(main, startup, loss)
    main, startup, loss, buf = build()
    pg = pir.convert(main, [loss])
    assert pg.name(buf) in pir_recompute.problem_of(pg, 256).barred
    problem = pir_schedule.order_problem(pg, 256)
    ops = list(main.global_block().ops)
    cond = [i for i, op in enumerate(ops) if op.name() == "pd_op.if"][0]  # the forward one
    for i, op in enumerate(ops):
        if i != cond and any(v.is_same(buf) for v in op.operands_source()):
            assert (i in problem.ops[cond].after) if i < cond else (cond in problem.ops[i].after)
    rng = np.random.default_rng(1)
    for _ in range(3):
        m, s, l, _ = build()
        order = _random_order(pir_schedule.order_problem(pir.convert(m, [l]), 256), rng)
        pir_schedule.apply_order(m, order)
        assert all(np.array_equal(a, b) for a, b in zip(reference, run(m, s, l), strict=True))
    with pytest.raises(memopt.BudgetError) as info:
        memopt.memory_optimize(main, budget=1, batch_size=256, fetch_list=[loss])
    report = memopt.memory_optimize(main, budget=info.value.smallest_budget, batch_size=256,
                                    fetch_list=[loss])
    # at the smallest budget a plan (or, when none lowers the step's peak,
    # the program as it is) fits; the region's buffer is never dropped
    assert pg.name(buf) not in report.recomputed
    assert report.peak_after <= info.value.smallest_budget
    assert all(np.array_equal(a, b) for a, b in zip(reference, run(main, startup, loss), strict=True))
    assert pir_regions.region_writes(pg) >= {pg.name(buf)}


@pytest.mark.parametrize("name", ("cond_mlp", "while_mlp"))
def test_grid_predicts_region_programs_to_the_byte(paddle, name):
    """The rewritten graph of every offered plan (block 0 rewritten, the
    region blocks kept, the executor's in-place options keyed by flat
    position) predicts its applied program, read back, to the byte."""
    from memopt.paddle import flags
    from memopt.paddle.pir import program as pir
    from memopt.paddle.pir import budget as pir_budget
    from memopt.paddle.pir.loops import runtime_for

    model = models.build(name, "pir")
    runtime = runtime_for(model.main, flags.runtime_model("pir"), budget=True)
    pg = pir.convert(model.main)
    _, choices = pir_budget.recompute_choices(pg, model.batch_size, runtime, offered_only=True)
    plans = [c for c in choices if c.k]
    assert len(plans) >= 5
    for c in plans:
        actual, applied = pir_budget.rewritten_peak(pg, c.plan, sorted(pg.graph.fetch_names),
                                                    model.batch_size, runtime)
        applied.undo()
        assert actual == c.peak, (c.label, c.peak, actual)


def test_largest_batch_of_a_loop_program_is_kept_and_analyze_agrees(paddle):
    """BudgetError's largest_batch on a while program (its trip count read
    from the program) plans with memory_optimize, and
    ``analyze(...).max_batch_size(recompute=True)`` gives the same figure."""
    import memopt

    model = models.build("while_mlp", "pir")
    with pytest.raises(memopt.BudgetError) as info:
        memopt.memory_optimize(model.main, budget=1, batch_size=512)
    budget = int(info.value.smallest_budget * 0.9)
    with pytest.raises(memopt.BudgetError) as info:
        memopt.memory_optimize(model.main, budget=budget, batch_size=512)
    n = info.value.largest_batch
    assert 0 < n < 512
    assert memopt.analyze(model.main, 512).max_batch_size(budget, recompute=True) == n
    report = memopt.memory_optimize(models.build("while_mlp", "pir", batch_size=n).main,
                                    budget=budget, batch_size=n)
    assert report.peak_after <= budget


@pytest.mark.parametrize("variant", ["scale", "add", "less_equal", "increment", "increment_by_3"])
def test_trip_count_read_from_the_program_is_the_count_it_runs(paddle, variant):
    """pir_loops.loop_iterations against the loop's own count of its
    iterations (a carried ``c + 1``), for the counters while_loop builds:
    ``i + 1`` (scale), ``i + full(2)`` (add), ``i <= n``, and
    ``paddle.increment(i, k)`` (the counter not carried: written in place)."""
    from memopt.paddle.pir import loops as pir_loops

    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, 8], "float32")
        h = paddle.nn.Linear(8, 8)(x)
        n = paddle.full([1], 7, "int64")
        step = {"scale": lambda i: i + 1, "add": lambda i: i + paddle.full([1], 2, "int64"),
                "less_equal": lambda i: i + 1, "increment": paddle.increment,
                "increment_by_3": lambda i: paddle.increment(i, 3)}[variant]
        cond = (lambda i, v, c: i <= n) if variant == "less_equal" else (lambda i, v, c: i < n)
        _, h, count = paddle.static.nn.while_loop(
            cond, lambda i, v, c: [step(i), paddle.tanh(v), c + 1.0],
            [paddle.full([1], 1, "int64"), h, paddle.full([1], 0.0, "float32")])
        paddle.optimizer.SGD(0.1).minimize(paddle.mean(h))
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(startup)
        ran = exe.run(main, feed={"x": np.ones((2, 8), "float32")}, fetch_list=[count])[0]
    assert pir_loops.loop_iterations(main) == int(ran[0]) > 1


@pytest.mark.parametrize("stop_at", [1e9, 0.5])
def test_trip_count_of_a_loop_that_may_stop_early_is_its_bound(paddle, stop_at):
    """A decoder-like loop ``i < n and mean(|v|) < stop_at`` (a data-dependent
    break) runs at most n times: loop_iterations reads n (before: None, and
    budget= refused the program), the count it runs is never above it, and
    budget= plans and trains bit-identically."""
    import memopt
    from memopt.paddle.pir import loops as pir_loops

    def build():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [-1, 8], "float32")
            h = paddle.nn.Linear(8, 8)(x)
            cell = paddle.nn.Linear(8, 8)
            n = paddle.full([1], 5, "int64")
            _, h, count = paddle.static.nn.while_loop(
                lambda i, v, c: paddle.logical_and(i < n, paddle.mean(paddle.abs(v)) < stop_at),
                lambda i, v, c: [i + 1, paddle.tanh(cell(v)) + v, c + 1.0],
                [paddle.full([1], 0, "int64"), h, paddle.full([1], 0.0, "float32")])
            loss = paddle.mean(h * h)
            paddle.optimizer.SGD(0.1).minimize(loss)
        return main, startup, [loss, count]

    main, startup, fetch = build()
    assert pir_loops.loop_iterations(main) == 5
    feed = {"x": np.full((4, 8), 0.3, "float32")}

    def run(program, start, fetch_list):
        exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            paddle.seed(0)
            exe.run(start)
            fetches = [exe.run(program, feed=feed, fetch_list=fetch_list) for _ in range(2)]
        return models.RunResult(fetches, [np.array(scope.find_var(n).get_tensor())
                                          for n in models.parameter_names(program)])

    reference = run(main, startup, fetch)
    ran = int(reference.fetches[0][1][0])
    assert 1 <= ran <= 5 and (ran == 5) == (stop_at > 1)
    main, startup, fetch = build()
    report = memopt.memory_optimize(main, budget="1GiB", batch_size=4, fetch_list=fetch)
    assert report.peak_after <= 1 << 30
    assert_same(reference, run(main, startup, fetch))
