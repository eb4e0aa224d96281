"""memopt.paddle.pir.program: PIR programs as graphs, and memory_optimize on PIR.

Real PIR programs, real executor.  memory_optimize must leave every
result bit-identical: losses, fetched outputs and every parameter after
three training steps (parameters compared by position: PIR names are not
stable across builds).
"""
import re

import numpy as np
import pytest

import memopt
from memopt.errors import MergedVariableError, UnsupportedProgramError
from memopt.candidates import variant_inplace
from memopt.plan import InplaceRewrite, Options


@pytest.fixture(scope="module")
def pir(paddle):
    from memopt.paddle.pir import program as module

    return module


@pytest.fixture(scope="module")
def inplace(paddle):
    from memopt.paddle.pir import inplace as pir_inplace

    return pir_inplace


@pytest.fixture(scope="module")
def rewrite(paddle):
    from memopt.paddle.pir import rewrite as pir_rewrite

    return pir_rewrite


def _control_flow_program(paddle):
    """fc -> cond (relu*2 | h-1) -> while (3 x tanh) -> split/concat -> mean."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 8], "float32")
        h = paddle.static.nn.fc(x, 8)
        s = paddle.mean(h)
        out = paddle.static.nn.cond(s > 0, lambda: paddle.nn.functional.relu(h) * 2,
                                    lambda: h - 1)
        i = paddle.full([1], 0, "int64")
        n = paddle.full([1], 3, "int64")
        _, v = paddle.static.nn.while_loop(lambda i, v: i < n,
                                           lambda i, v: (i + 1, paddle.tanh(v)), [i, out])
        a, b = paddle.split(v, 2, axis=1)
        loss = paddle.mean(paddle.concat([b, a], axis=1))
    return main, loss


def test_graph_of_control_flow_program(paddle, pir):
    main, loss = _control_flow_program(paddle)
    pg = pir.convert(main, [loss])
    g = pg.graph
    g.validate()
    ops = [op for _, op in g.walk_ops()]
    assert len(pg.ops) == len(ops)
    # names: attributes for parameters and data, the printer's %N otherwise
    assert g.var("x").is_data and g.var("x").shape == (-1, 8) and g.var("x").dtype == "float32"
    params = [v for _, v in g.all_vars() if v.persistable]
    # the fc's own names (its number depends on what the process built before)
    layer = main.global_block().ops[0].attrs()["parameter_name"].split(".")[0]
    assert sorted(v.name for v in params) == [f"{layer}.b_0", f"{layer}.w_0"]
    assert layer.startswith("fc_")
    text = str(main)
    for name, value in pg.values.items():
        if name.startswith("%") and not name.startswith("%arg"):
            assert re.search(rf"[(,] ?{re.escape(name)}[,)]", text), name
    # the if: a branch op with two sub-blocks, its result written after it
    (if_op,) = [op for op in ops if op.type == "pd_op.if"]
    assert len(if_op.sub_blocks) == 2 and not if_op.loop
    # the while: a loop whose body's yield writes the carried values
    (while_op,) = [op for op in ops if op.type == "pd_op.while"]
    assert while_op.loop and len(while_op.sub_blocks) == 1
    body = g.blocks[while_op.sub_blocks[0]]
    assert body.ops[-1].type == "cf.yield" and body.ops[-1].writes == while_op.writes
    assert all(n.startswith("%arg_") for n in while_op.writes)
    # split/concat: the split op writes the vector's elements; concat reads them
    (split,) = [op for op in ops if op.type == "pd_op.split_with_num"]
    (concat,) = [op for op in ops if op.type == "pd_op.concat"]
    assert len(split.writes) == 2 and set(split.writes) <= set(concat.reads)
    assert g.fetch_names == (pg.name(loss),)


def test_training_loop_names_match_the_printed_program(paddle, pir):
    from memopt.testing import models

    model = models.build("while_loop", ir="pir")
    pg = pir.convert(model.main, model.fetch_list)
    text = str(model.main)
    names = [n for n in pg.values if n.startswith("%")]
    assert any(n.startswith("%stack_") for n in names)
    for name in names:
        assert re.search(rf"[(, ]{re.escape(name)}[,)]", text), name


def test_program_to_graph_rejects_other_objects(pir):
    with pytest.raises(UnsupportedProgramError):
        pir.program_to_graph(object())


def _mlp(paddle, optimizer="sgd"):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        h = paddle.static.nn.fc(x, 32)
        r = paddle.nn.functional.relu(h)
        y = paddle.scale(r, 3.0)
        loss = paddle.mean(paddle.static.nn.fc(y, 1))
        opt = paddle.optimizer.SGD(0.1) if optimizer == "sgd" else paddle.optimizer.Adam(0.01)
        opt.minimize(loss)
    return main, startup, {"x": x, "h": h, "r": r, "y": y, "loss": loss}


def test_roles_and_gradients(paddle, pir):
    main, _, _ = _mlp(paddle, "adam")
    g = pir.program_to_graph(main)
    roles = [op.role for _, op in g.walk_ops()]
    types = [op.type for _, op in g.walk_ops()]
    first_back = roles.index("backward")
    assert types[first_back] in ("pd_op.full", "pd_op.full_like")  # the loss-gradient seed
    assert all(r == "backward" for r, t in zip(roles, types, strict=True) if t.endswith("_grad"))
    assert {t for r, t in zip(roles, types, strict=True) if r == "optimize"} == {"pd_op.adam_"}
    assert all(r == "forward" for r in roles[:first_back])


def test_executor_inplace_follows_paddles_rules(paddle, pir, inplace):
    main, _, v = _mlp(paddle)
    pg = pir.convert(main, [v["loss"]])
    pairs = inplace.executor_inplace(pg)
    chosen = {pg.ops[pos].name(): (src, dst) for pos, src, dst in pairs}
    # relu's input (fc's add) dies there; scale's input r is still read by relu_grad
    assert chosen["pd_op.relu"] == (pg.name(v["h"]), pg.name(v["r"]))
    assert all(dst != pg.name(v["y"]) for _, _, dst in pairs)
    assert "pd_op.add_grad" not in chosen  # its CPU kernel cannot run in place
    assert "pd_op.relu_grad" in chosen


def test_value_name_matches_the_graph(paddle, pir):
    main, _, v = _mlp(paddle)
    pg = pir.convert(main)
    for key in ("x", "h", "r", "y", "loss"):
        assert pir.value_name(v[key]) == pg.name(v[key])
    assert pir.value_name(v["x"]) == "x"


def _run(paddle, main, startup, fetch, steps=3, seed=7):
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    out = []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(seed)
        exe.run(startup)
        for _ in range(steps):
            out.append([np.array(a) for a in exe.run(
                main, feed={"x": rng.standard_normal((4, 16)).astype("float32")},
                fetch_list=fetch)])
        params = [np.array(scope.find_var(op.attrs()["parameter_name"]).get_tensor())
                  for op in main.global_block().ops if op.name() == "builtin.parameter"]
    return out, params


def _same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


def test_fetching_a_replaced_value_fetches_its_replacement(paddle, pir):
    main0, startup0, v0 = _mlp(paddle)
    main1, startup1, v1 = _mlp(paddle)
    r_name = pir.value_name(v1["r"])  # (r's op is replaced below: its Value dies)
    report = memopt.memory_optimize(main1, skip_opt_set=[pir.value_name(v1["loss"])])
    assert report.program_type == "pir"
    relu = [r for r in report.reuses if r.op.startswith("pd_op.relu ")]
    assert relu and relu[0].var == r_name and relu[0].how == "in-place"
    assert any(op.name() == "pd_op.relu_" for op in main1.global_block().ops)
    # r's op was replaced: fetching the old Value gives the new op's result
    ref = _run(paddle, main0, startup0, [v0["loss"], v0["r"]])
    got = _run(paddle, main1, startup1, [v1["loss"], v1["r"]])
    assert _same(ref[0], got[0]) and _same([ref[1]], [got[1]])
    # h is now overwritten by relu_: fetching it would return relu(h)
    with pytest.raises(MergedVariableError, match="skip_opt_set"):
        _run(paddle, main1, startup1, [v1["h"]], steps=1)


def test_skip_opt_set_by_name_keeps_the_op(paddle, pir):
    main, _, v = _mlp(paddle)
    name = pir.value_name(v["h"])
    report = memopt.memory_optimize(main, skip_opt_set={name})
    assert all(r.takes != name for r in report.reuses)
    assert any(op.name() == "pd_op.relu" for op in main.global_block().ops)
    assert report.not_merged


def _plan(rewrite, pg, options):
    """The in-place plan memory_optimize makes for a read PIR program: the
    adapter states its ops' variants, the core decides."""
    rewrite.state_inplace_facts(pg)
    return variant_inplace(pg.graph, options)


def test_apply_is_all_or_nothing(paddle, pir, rewrite):
    main, _, v = _mlp(paddle)
    before = str(main)
    pg = pir.convert(main)
    rewrites, _ = _plan(rewrite, pg, Options(skip_grads=False))
    assert rewrites
    # pd_op.full has a full_ whose builder takes other arguments: it cannot be built
    full = next(i for i, op in enumerate(pg.ops) if op is not None and op.name() == "pd_op.full")
    bad = InplaceRewrite(full, "pd_op.full", ())
    with pytest.raises(Exception):
        rewrite.apply_inplace(pg, list(rewrites) + [bad])
    assert str(main) == before


MODELS = ["mlp", "cnn", "transformer", "nested_cond", "while_loop"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("level", [0, 1])
def test_models_bit_identical_after_memory_optimize(paddle, pir, name, level):
    from memopt.testing import models

    ref = models.build(name, ir="pir")
    opt = models.build(name, ir="pir")
    report = memopt.memory_optimize(opt.main, level=level, skip_grads=False,
                                    skip_opt_set=[pir.value_name(v) for v in opt.fetch_list])
    assert report.program_type == "pir" and report.level == level
    assert report.peak_after <= report.peak_before
    a, b = models.run_steps(ref, 3), models.run_steps(opt, 3)
    assert _same(a.fetches, b.fetches)
    assert len(a.params) == len(b.params) and all(
        np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))


def test_sub_block_ops_run_in_place(paddle, pir, rewrite):
    """The executor's own pass never touches if/while regions; memopt does:
    in an inference program's branch, and in training programs' backward
    regions (forward regions push their values for the backward)."""
    from memopt.testing import models

    main, loss = _control_flow_program(paddle)
    pg = pir.convert(main, [loss])
    rewrites, _ = _plan(rewrite, pg, Options())
    assert [rw.op_name for rw in rewrites if rw.block != 0] == ["pd_op.scale"]
    for name in ("nested_cond", "while_loop"):
        model = models.build(name, ir="pir")
        pg = pir.convert(model.main, model.fetch_list)
        rewrites, _ = _plan(rewrite, pg, Options(skip_grads=False))
        assert any(rw.block != 0 and rw.op_name == "pd_op.relu_grad" for rw in rewrites)
        assert not [rw for rw in _plan(rewrite, pg, Options())[0] if rw.block != 0]


def test_gc_off_rewrite_is_bit_identical_and_lowers_the_estimate(paddle, pir):
    """With GC off and the executor's in-place pass off, every in-place op
    saves a buffer for the whole step."""
    from memopt.testing import models

    with models.flags(eager_delete_tensor_gb=-1.0, pir_apply_inplace_pass=False):
        ref = models.build("mlp", ir="pir")
        opt = models.build("mlp", ir="pir")
        report = memopt.memory_optimize(
            opt.main, skip_opt_set=[pir.value_name(v) for v in opt.fetch_list])
        assert not report.gc and report.peak_after < report.peak_before
        a, b = models.run_steps(ref, 3), models.run_steps(opt, 3)
    assert _same(a.fetches, b.fetches)
    assert all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))


def test_release_memory_leaves_the_program(paddle, pir):
    main, _, _ = _mlp(paddle)
    before = str(main)
    report = memopt.release_memory(main)
    assert str(main) == before and report.program_type == "pir"
    assert "garbage collector" in report.release


def _read_summary(pg):
    """What a read says about the program: ops (type, reads, writes, facts)
    in walk order and the variables (name, shape, label)."""
    ops = [(op.type, op.reads, op.writes, op.facts) for _, op in pg.graph.walk_ops()]
    variables = sorted((v.name, v.shape, v.label) for _, v in pg.graph.all_vars())
    return ops, variables, pg.graph.fetch_names


def test_one_read_per_program_state(pir, paddle):
    """Inside pir_convert_cache.shared() a state read again is a copy of the
    first read (equal to a fresh read, sharing no op or variable with it);
    a moved op is a new state, read afresh; outside, nothing is kept."""
    from memopt.testing import models
    from memopt.paddle.pir import convert_cache as pir_convert_cache

    model = models.build("mlp", "pir")
    program, fetch = model.main, model.fetch_list
    fresh = _read_summary(pir.convert(program, fetch))
    with pir_convert_cache.shared():
        first = pir.convert(program, fetch)
        first.graph.blocks[0].ops[0].facts.view = True   # a caller's mark on its read
        second = pir.convert(program, fetch)
        assert len(pir_convert_cache._active) == 1
        assert _read_summary(second) == fresh
        assert second.graph.blocks[0].ops[0] is not first.graph.blocks[0].ops[0]
        block = program.global_block()
        ops = list(block.ops)
        last_update = max(k for k, op in enumerate(ops) if op.name().endswith("_"))
        ops[last_update].move_before(ops[last_update - 1])   # the last update one op up
        moved = pir.convert(program, fetch)
        assert len(pir_convert_cache._active) == 2
        assert _read_summary(moved) != fresh
    assert pir_convert_cache._active is None
    assert _read_summary(moved) == _read_summary(pir.convert(program, fetch))
