"""memopt.paddle.legacy.program: reading legacy Paddle programs, renaming all-or-nothing."""
import pytest

from memopt.testing import models
from memopt.errors import GraphError, UnsupportedProgramError
from memopt.graph import DENSE


@pytest.fixture(scope="module")
def legacy(paddle):
    from memopt.paddle.legacy import program as module

    return module


def serialized(program):
    return program.desc.serialize_to_string()


def fail_on_call(monkeypatch, module, name, at):
    """Fault injection: the ``at``-th call of ``module.name`` raises; returns
    the list of calls made."""
    real, calls = getattr(module, name), []

    def flaky(*args):
        calls.append(args)
        if len(calls) == at:
            raise RuntimeError("injected")
        return real(*args)

    monkeypatch.setattr(module, name, flaky)
    return calls


def test_reads_an_mlp(legacy):
    model = models.build("mlp", "legacy")
    before = serialized(model.main)
    graph = legacy.program_to_graph(model.main)
    assert serialized(model.main) == before, "reading does not touch the program"
    block = model.main.global_block()
    assert graph.num_ops() == len(block.ops)
    for gop, pop in zip(graph.global_block.ops, block.ops, strict=True):
        assert gop.type == pop.type
        assert set(gop.reads) == set(pop.input_arg_names)
        assert set(gop.writes) == set(pop.output_arg_names)
    x = graph.var("x")
    assert x.is_data and x.shape == (-1, 64) and x.dtype == "float32"
    assert graph.var("label").dtype == "int64"
    w = graph.var("linear_0.w_0")
    assert w.persistable and not w.size.symbolic
    roles = {op.type: op.role for op in graph.global_block.ops}
    assert roles["matmul_v2"] == "forward"
    assert roles["matmul_v2_grad"] == "backward"
    assert roles["momentum"] == "optimize"
    loss_ops = [op for op in graph.global_block.ops if op.facts.loss]
    assert loss_ops and model.loss.name in loss_ops[0].writes


def test_inplace_pairs_follow_paddle(legacy):
    graph = legacy.program_to_graph(models.build("mlp", "legacy").main)
    pairs = {op.type: op.facts.inplace for op in graph.global_block.ops}
    relu = next(op for op in graph.global_block.ops if op.type == "relu")
    assert relu.facts.inplace == (relu.reads[0], relu.writes[0])
    assert pairs["matmul_v2"] is None  # Paddle declares no in-place for matmul
    relu_grad = next(op for op in graph.global_block.ops if op.type == "relu_grad")
    src, dst = relu_grad.facts.inplace
    assert src.endswith("@GRAD") and dst.endswith("@GRAD")


def test_broadcasting_grad_loses_its_inplace_pair(legacy):
    """A conv bias grad (Y [1, C, 1, 1]) is not bit-exact in place."""
    graph = legacy.program_to_graph(models.build("cnn", "legacy").main)
    bias_grads = [op for op in graph.global_block.ops
                  if op.type == "elementwise_add_grad" and "conv2d" in op.reads[0]]
    assert len(bias_grads) == 2
    assert all(op.facts.inplace is None for op in bias_grads)
    # the linear layer's bias (Y [classes], a trailing suffix) keeps its pair
    linear = [op for op in graph.global_block.ops
              if op.type == "elementwise_add_grad" and "linear" in op.reads[0]]
    assert linear and all(op.facts.inplace is not None for op in linear)


def test_reads_nested_control_flow(legacy):
    model = models.build("nested_cond", "legacy")
    graph = legacy.program_to_graph(model.main)
    assert len(graph.blocks) == model.main.num_blocks
    for gblock, pblock in zip(graph.blocks, model.main.blocks, strict=True):
        assert gblock.parent == pblock.parent_idx
    owners = [op for _, op in graph.walk_ops() if op.sub_blocks]
    types = {op.type for op in owners}
    assert types == {"conditional_block", "conditional_block_grad"}
    assert not any(op.loop for op in owners)
    depth2 = [b for b in graph.blocks if b.parent > 0]
    assert depth2, "a conditional inside a conditional"
    scope_vars = [v for _, v in graph.all_vars() if v.kind != DENSE]
    assert scope_vars, "conditional_block's Scope output is not a dense tensor"
    graph.validate()


def test_reads_a_while_loop(legacy):
    model = models.build("while_loop", "legacy")
    graph = legacy.program_to_graph(model.main)
    loops = {op.type for _, op in graph.walk_ops() if op.loop}
    assert loops == {"while", "while_grad"}
    # the while_grad body reads the forward body's variables from the step
    # scopes: they are declared in the grad body too
    grad_owner = next(op for _, op in graph.walk_ops() if op.type == "while_grad")
    body = graph.blocks[grad_owner.sub_blocks[0]]
    forward_names = set(graph.blocks[1].vars)
    assert forward_names & set(body.vars)
    graph.validate()


def test_not_a_legacy_program(legacy, paddle):
    with pytest.raises(UnsupportedProgramError, match="legacy"):
        legacy.program_to_graph(models.build("mlp", "pir").main)
    with pytest.raises(UnsupportedProgramError):
        legacy.program_to_graph("main")


def test_apply_renames(legacy):
    model = models.build("mlp", "legacy")
    block = model.main.global_block()
    relu = next(op for op in block.ops if op.type == "relu")
    src, dst = relu.input("X")[0], relu.output("Out")[0]
    users = [op for op in block.ops if dst in op.input_arg_names + op.output_arg_names]
    changed = legacy.apply_renames(model.main, {0: {dst: src}})
    assert changed >= len(users)
    assert relu.output("Out") == [src]
    assert all(dst not in op.input_arg_names + op.output_arg_names for op in block.ops)
    assert block.has_var(dst), "declarations are kept"


@pytest.mark.parametrize("plan,match", [
    ({0: {"nope": "x"}}, "does not declare"),
    ({0: {"x": "nope"}}, "does not declare"),
    ({7: {"x": "label"}}, "block 7"),
    ({0: {"relu_0.tmp_0": "linear_0.tmp_1", "linear_0.tmp_1": "x"}}, "itself renamed"),
])
def test_bad_rename_plans_change_nothing(legacy, plan, match):
    model = models.build("mlp", "legacy")
    before = serialized(model.main)
    with pytest.raises(GraphError, match=match):
        legacy.apply_renames(model.main, plan)
    assert serialized(model.main) == before


def test_failure_midway_is_undone(legacy, monkeypatch):
    model = models.build("transformer", "legacy")
    graph = legacy.program_to_graph(model.main)
    # rename a dozen temporaries to one name: many slots to edit
    temps = [n for n, v in graph.global_block.vars.items()
             if v.kind == DENSE and not v.persistable and not v.is_data][:12]
    before = serialized(model.main)
    calls = fail_on_call(monkeypatch, legacy, "_set_slot", 10)
    with pytest.raises(RuntimeError, match="injected"):
        legacy.apply_renames(model.main, {0: {n: temps[0] for n in temps[1:]}})
    assert len(calls) > 10
    assert serialized(model.main) == before


def test_merged_record_and_fetch_check(legacy):
    from memopt.errors import MergedVariableError
    from memopt.paddle.legacy import merge_record

    model = models.build("mlp", "legacy")
    assert legacy.merged_record(model.main) == {}
    legacy.check_fetch(model.main, ["relu_0.tmp_0"])  # nothing merged: no error
    home = {n: 0 for n in ("relu_0.tmp_0", "linear_1.tmp_0")}
    # (not a sound plan -- the two live at once -- but the record is what is tested)
    buffers = merge_record.apply_merges(model.main, [["relu_0.tmp_0", "linear_1.tmp_0"]],
                                        home, legacy.rewrite)
    buf = buffers["relu_0.tmp_0"]
    assert buf.startswith(merge_record.BUFFER_PREFIX) and buffers["linear_1.tmp_0"] == buf
    assert legacy.merged_record(model.main) == {"relu_0.tmp_0": buf, "linear_1.tmp_0": buf}
    block = model.main.global_block()
    assert not block.has_var("relu_0.tmp_0") and block.has_var(buf)
    with pytest.raises(MergedVariableError, match="relu_0.tmp_0.*linear_1.tmp_0.*fetch_list"):
        legacy.check_fetch(model.main, [model.loss, "relu_0.tmp_0"])
    legacy.check_fetch(model.main, [model.loss])
    # the record is in the desc: a clone and a parsed copy say the same
    for copy in (model.main.clone(), model.main.clone(for_test=True)):
        assert legacy.merged_record(copy) == legacy.merged_record(model.main)


def test_rewrite_moves_ops_and_undoes_on_failure(legacy, monkeypatch):
    model = models.build("mlp", "legacy")
    block = model.main.global_block()
    types = [op.type for op in block.ops]
    n = len(types)
    order = list(range(n))
    order.insert(3, order.pop(n - 1))      # last op (an optimizer op) to index 3
    order.insert(10, order.pop(n - 2))     # and another one lower down
    before = serialized(model.main)
    legacy.rewrite(model.main, {}, order)
    assert [op.type for op in block.ops] == [types[i] for i in order]
    assert [op.desc.type() for op in block.ops] == [types[i] for i in order]
    # put it back with the inverse permutation: byte-identical again
    inverse = sorted(range(n), key=lambda k: order[k])
    legacy.rewrite(model.main, {}, inverse)
    assert serialized(model.main) == before

    fail_on_call(monkeypatch, legacy, "_move_op", 2)
    with pytest.raises(RuntimeError, match="injected"):
        legacy.rewrite(model.main, {0: {"relu_1.tmp_0": "linear_1.tmp_1"}}, order)
    assert serialized(model.main) == before
    with pytest.raises(GraphError, match="permutation"):
        legacy.rewrite(model.main, {}, order[:-1])


def test_dims_only_reads(legacy):
    """elementwise_add_grad reads X for its dims only; Out@GRAD has them."""
    graph = legacy.program_to_graph(models.build("mlp", "legacy").main)
    grads = [op for op in graph.global_block.ops if op.type == "elementwise_add_grad"]
    assert grads
    for op in grads:
        found = op.facts.dims_only
        assert set(found) == {"X"}, "Y is the bias (a parameter): left alone"
        var, sub = found["X"]
        assert sub == op.reads[0] and var in op.reads
        assert graph.var(var).shape == graph.var(sub).shape


def test_einsum_cache_is_not_sized(legacy):
    """einsum's InnerCache is declared as a scalar but holds operands at run
    time: its size is unknown, so it is never a candidate."""
    graph = legacy.program_to_graph(models.build("transformer", "legacy").main)
    einsum = next(op for op in graph.global_block.ops if op.type == "einsum")
    caches = [graph.var(n) for n in einsum.writes if graph.var(n).kind == legacy.UNSIZED]
    assert len(caches) == 2 and all(not v.is_dense for v in caches)


def test_einsum_xshape_holds_no_bytes(legacy):
    """einsum's XShape is declared with its operand's full shape, but the
    kernel never allocates it (dims only): no bytes, never a candidate, so
    it does not hold a shared buffer from the forward pass to the backward."""
    graph = legacy.program_to_graph(models.build("transformer", "legacy").main)
    einsum = next(op for op in graph.global_block.ops if op.type == "einsum")
    shapes = [graph.var(n) for n in einsum.writes if graph.var(n).kind == legacy.META]
    assert len(shapes) == 2
    assert all(v.size.coefficient == 0 and -1 in v.shape for v in shapes)


def test_conditional_block_grad_full_writes(legacy):
    """conditional_block_grad writes its parent-side gradients whole (a copy
    of the body's, or zeros of the input's dims) only where the input surely
    holds a tensor: a value only a branch writes may hold none."""
    program = models.build("nested_cond", "legacy").main
    graph = legacy.program_to_graph(program)
    block0 = program.global_block()
    grads = [(i, op) for i, op in enumerate(block0.ops) if op.type == "conditional_block_grad"]
    assert len(grads) == 2
    for index, pop in grads:
        gop = graph.global_block.ops[index]
        assert set(gop.facts.full_writes) == set(pop.output("Input@GRAD")) - {"@EMPTY@"}
        assert set(gop.facts.sub_outputs) == {n + "@GRAD" for n in pop.input("Input")}
    surely = legacy._surely_written(program, block0, grads[0][0])
    branch_out = next(op for op in block0.ops if op.type == "conditional_block").output("Out")[0]
    assert surely("linear_0.tmp_1") and surely("x") and surely("linear_1.w_0")
    assert not surely(branch_out), "written only inside a branch"
    # in a grad body, what the forward body wrote holds a tensor
    inner = [(i, op) for i, op in enumerate(program.block(6).ops)
             if op.type == "conditional_block_grad"]
    assert inner and legacy._surely_written(program, program.block(6), inner[0][0])(
        "relu_0.tmp_0")


def test_unary_einsum_output_is_never_merged(legacy, paddle):
    """A one-operand einsum may hand back its operand's own buffer: its
    output and its operand (whose cache may be that buffer too) are marked
    ``aliases`` and never share memory."""
    from memopt.plan import Options
    from memopt.planner import plan_memory

    with models.ir_guard("legacy"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 8], "float32")
            e = paddle.einsum("ij->ij", paddle.nn.functional.relu(x * 2.0))
            paddle.mean(e + 1.0)
    graph = legacy.program_to_graph(main)
    einsum = next(op for op in graph.global_block.ops if op.type == "einsum")
    operand, out = einsum.facts.aliases
    assert graph.var(out).is_dense and out in einsum.writes and operand in einsum.reads
    plan = plan_memory(graph, Options(skip_grads=False, level=1), gc=False)
    assert plan.groups, "the other temporaries share"
    assert all(out not in group and operand not in group for group in plan.groups)


def _train_legacy(paddle, build, feed, optimize=None, steps=3, fetch=(), optimizer=None):
    """``steps`` steps of a legacy program from ``build()`` (returning the
    loss; SGD unless ``optimizer()`` makes another), rewritten first by
    ``optimize(main, loss)`` if given: the fetches of every step and every
    parameter afterwards."""
    import numpy as np

    with models.ir_guard("legacy"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            loss = build()
            (optimizer or (lambda: paddle.optimizer.SGD(0.1)))().minimize(loss)
        if optimize is not None:
            optimize(main, loss)
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(startup)
            out = [[np.array(a) for a in exe.run(main, feed=feed, fetch_list=[loss, *fetch])]
                   for _ in range(steps)]
            params = [np.array(scope.find_var(p.name).get_tensor())
                      for p in main.all_parameters()]
    return out, params


def test_flatten_is_not_made_in_place(legacy, paddle):
    """flatten_contiguous_range's shape inference resizes Out before it reads
    X's dims into XShape: with X and Out one variable, flatten's grad gave
    X@GRAD the flattened shape, and a conv bias grad reading it failed
    (conv2d_grad: end row index out of bound).  Its pair is not in place;
    reshape2's (which reads X's dims first) still is."""
    import numpy as np

    import memopt

    def build():
        x = paddle.static.data("x", [-1, 2, 3, 3], "float32")
        h = paddle.nn.Conv2D(2, 4, 1)(x)
        flat = paddle.flatten(paddle.nn.Conv2D(4, 4, 1)(h), 1)
        return paddle.mean(flat * paddle.reshape(h * 2.0, [-1, 36]))

    feed = {"x": np.random.default_rng(0).random((2, 2, 3, 3), dtype=np.float32)}
    fetch = ["conv2d_1.tmp_1@GRAD"]  # flatten's X@GRAD
    want = _train_legacy(paddle, build, feed, fetch=fetch)
    reports = []
    for skip_grads in (True, False):
        got = _train_legacy(paddle, build, feed, lambda main, loss: reports.append(
            memopt.memory_optimize(main, level=1, skip_grads=skip_grads,
                                   fetch_list=[loss, *fetch])), fetch=fetch)
        for a, b in zip([*sum(want[0], []), *want[1]], [*sum(got[0], []), *got[1]], strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)
    ops = {r.op for rep in reports for r in rep.reuses if r.how == "in-place"}
    assert "reshape2" in ops and "flatten_contiguous_range" not in ops


def test_amp_scaled_loss_is_kept(legacy, paddle):
    """Under AMP loss scaling Paddle gives the Loss role to the op scaling
    the loss; the user's loss (its input) is kept like the loss all the same:
    it was merged with a gradient and its fetch refused."""
    import numpy as np

    import memopt

    def build():
        x = paddle.static.data("x", [-1, 8], "float32")
        y = paddle.static.data("y", [-1, 1], "int64")
        h = paddle.nn.functional.relu(paddle.nn.Linear(8, 16)(x))
        return paddle.mean(paddle.mean(paddle.nn.functional.cross_entropy(
            paddle.nn.Linear(16, 4)(h), y)))

    def amp():
        return paddle.static.amp.decorate(paddle.optimizer.SGD(0.1), level="O1",
                                          dtype="float16", use_dynamic_loss_scaling=False)

    rng = np.random.default_rng(0)
    feed = {"x": rng.random((4, 8), dtype=np.float32),
            "y": rng.integers(0, 4, (4, 1)).astype("int64")}
    want = _train_legacy(paddle, build, feed, optimizer=amp)
    reports = []
    with models.flags(eager_delete_tensor_gb=-1.0):  # GC off: the loss was merged
        got = _train_legacy(paddle, build, feed, optimizer=amp, optimize=lambda main, loss: (
            reports.append(memopt.memory_optimize(main, level=1, skip_grads=False))))
    assert reports[0].reuses, "the rest is merged"
    for a, b in zip([*sum(want[0], []), *want[1]], [*sum(got[0], []), *got[1]], strict=True):
        assert np.array_equal(a, b)


def test_lod_tensors_are_never_merged(legacy, paddle):
    """A kernel that does not set its output's LoD leaves the LoD its buffer
    last held: a tensor that took a sequence_conv output's memory came back
    with its sequence lengths ([[0, 3, 7]]), so its fetch failed
    (return_numpy=True refuses a LoD).  LoD tensors share no memory."""
    import numpy as np

    import memopt
    from paddle.base import core

    def build():
        x = paddle.static.data("words", [-1, 8], "float32", lod_level=1)
        conv = paddle.static.nn.sequence_conv(x, num_filters=8, filter_size=3)
        pooled = paddle.static.nn.sequence_pool(conv, "sum")
        outs = [paddle.mean(pooled, axis=1, keepdim=True) * paddle.ones([1, 8])]
        outs.append(paddle.transpose(paddle.transpose(pooled, [1, 0]), [1, 0]))
        outs.append(paddle.concat([pooled[:, :4], pooled[:, 4:]], axis=1))
        return [paddle.mean(paddle.add_n(outs)), *outs]

    words = core.DenseTensor()
    words.set(np.random.default_rng(0).random((7, 8), dtype=np.float32), core.CPUPlace())
    words.set_recursive_sequence_lengths([[3, 4]])
    runs = []
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=-1.0):
        for level in (None, 0, 1):
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
                fetch = build()
            if level is not None:
                report = memopt.memory_optimize(main, level=level, fetch_list=fetch)
                assert report.reuses, "the tensors without a LoD still share"
                lod = legacy._lod_names(main)
                assert lod and not {n for r in report.reuses for n in (r.var, r.takes)} & lod
            with paddle.static.scope_guard(paddle.static.Scope()):
                exe = paddle.static.Executor(paddle.CPUPlace())
                paddle.seed(1)
                exe.run(startup)
                runs.append(exe.run(main, feed={"words": words}, fetch_list=fetch))
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], run, strict=True))
