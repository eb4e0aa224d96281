"""memopt on fleet's distributed programs.

Single-process tests build rank 0's legacy data-parallel program with
``paddle.distributed.fleet`` and check that memory_optimize / release_memory
leave every buffer a communication op touches alone.  Two real ranks
(``paddle.distributed.spawn``, gloo, CPU) check that a rewritten program
trains bit-identically on every rank.
"""
import tempfile

import numpy as np
import pytest

import memopt
from memopt.paddle import distributed


@pytest.fixture()
def rank0_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # fleet's sharding writes main_sharding_N files there
    for key, value in {"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "2",
                       "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:36170,127.0.0.1:36171",
                       "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:36170",
                       "PADDLE_RANK_IN_NODE": "0"}.items():
        monkeypatch.setenv(key, value)


def build(paddle, mode):
    from memopt.testing.models import ir_guard
    from memopt.testing import fleet_models

    with ir_guard("legacy"):
        return fleet_models.build(mode, features=16, hidden=32, layers=2)


def test_communication_op_names():
    """Both IRs' names, auto-parallel's dist_op dialect included."""
    for name in ("c_allreduce_sum", "pd_op.all_reduce_", "pd_op.all_reduce",
                 "pd_op.all_gather", "dist_op.reshard", "pd_op.reshard", "pd_op.reshard_v2",
                 "pd_op.c_identity", "p_send", "pd_op.p_recv", "dist_op.dtensor_to_local"):
        assert distributed.is_communication(name), name
    assert distributed.base_type("dist_op.reshard") == "reshard"
    assert distributed.base_type("pd_op.all_reduce_") == "all_reduce"
    for name in ("pd_op.relu", "pd_op.scatter", "pd_op.broadcast_tensors", "dist_op.xxx"):
        assert not distributed.is_communication(name), name


def touching(program, names):
    """Every op's (type, inputs and outputs among ``names``): unchanged when no
    other variable was renamed onto (or away from) those names."""
    return sorted((op.type, tuple(n for n in op.input_arg_names if n in names),
                   tuple(n for n in op.output_arg_names if n in names))
                  for block in program.blocks for op in block.ops)


def comm_names(program):
    return {name for block in program.blocks for op in block.ops
            if distributed.is_communication(op.type)
            for name in (*op.input_arg_names, *op.output_arg_names)}


@pytest.mark.parametrize("mode", ["dp", "sharding1", "gm"])
def test_memory_optimize_leaves_communication_buffers_alone(paddle, rank0_env, mode):
    main, _, _ = build(paddle, mode)
    before = comm_names(main)
    assert before, "fleet inserted no communication op"
    uses_before = touching(main, before)
    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0})
    try:
        report = memopt.memory_optimize(main, level=1, skip_grads=False)
    finally:
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0})
    assert report.merged_count > 0      # the rest of the program was optimized
    assert touching(main, before) == uses_before
    # the report says why, when some communication buffer is a temporary
    # (gradient merge all-reduces its persistable accumulators)
    temporaries = [n for n in before if not main.global_block()._find_var_recursive(n).persistable]
    assert any("communication" in reason for reason in report.not_merged) == bool(temporaries)


def test_release_memory_never_releases_a_communication_buffer(paddle, rank0_env):
    main, _, _ = build(paddle, "dp")
    before = comm_names(main)
    from memopt.testing.models import ir_guard

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0})
    try:
        # as a legacy program runs: OldIrGuard (FLAGS_enable_pir_in_executor
        # off; with it on release_memory refuses)
        with ir_guard("legacy"):
            memopt.memory_optimize(main, level=1, skip_grads=False)
            memopt.release_memory(main)
    finally:
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0})
    from memopt.release import RELEASED_VAR

    # a release is share_buffer(X=[memopt@released], Out=[v]) (release_memory)
    released = {name for op in main.global_block().ops
                if op.type == "share_buffer" and op.input_arg_names == [RELEASED_VAR]
                for name in op.output_arg_names if name != RELEASED_VAR}
    assert released, "release_memory released nothing at all"
    assert not (released & before)


def test_estimate_of_a_rank_program_and_of_the_one_device_program(paddle, rank0_env):
    single, _, loss = build(paddle, "single")
    one = memopt.estimate(single, batch_size=64)
    dp = memopt.estimate(single, dp=2, sharding_stage=1, batch_size=64)
    assert dp.micro_batch_size == 32 and not dp.distributed_program
    # whole parameters to owners: the worst rank holds at least half the state
    assert one.components["optimizer state"] / 2 <= dp.components["optimizer state"] \
        < one.components["optimizer state"]
    assert dp.total < one.total
    rank, _, _ = build(paddle, "dp")
    est = memopt.estimate(rank, dp=2, batch_size=64)
    assert est.distributed_program and "already one rank's program" in str(est)


def test_sharding_owners_and_gradient_merge_as_fleet_builds_them(paddle, rank0_env):
    """The estimate's model of fleet's programs, checked on fleet's own:
    rank 0's sharding program keeps exactly the parameters (and optimizer
    state) the ownership rule gives it; gradient merge's rank program holds
    the gradients besides the accumulators."""
    from memopt.parallel import fleet_sharding_owners

    single, _, loss = build(paddle, "single")
    params = single.global_block().all_parameters()
    owners = fleet_sharding_owners([int(np.prod(p.shape)) * 4 for p in params], 2)
    rank0, _, _ = build(paddle, "sharding1")
    kept = {v.name for v in rank0.list_vars() if v.persistable}
    assert {p.name for p, o in zip(params, owners, strict=True) if o == 0} == \
        {p.name for p in params} & kept
    est = memopt.estimate(single, dp=2, sharding_stage=1, batch_size=64, fetch_list=[loss])
    state0 = sum(int(np.prod(v.shape)) * 4 for v in rank0.list_vars()
                 if v.persistable and v.name.endswith("_velocity_0"))
    assert len(est.per_rank) == 2 and est.total == max(est.per_rank)
    one = memopt.estimate(single, dp=2, batch_size=64, fetch_list=[loss])
    # rank 0's state; the rank view may only lower the rest
    assert est.components["optimizer state"] in (state0, one.components["optimizer state"]
                                                 - state0)
    assert max(est.per_rank) <= one.total

    dp, _, dp_loss = build(paddle, "dp")
    gm, _, gm_loss = build(paddle, "gm")
    grads = sum(int(np.prod(p.shape)) * 4 for p in params)
    a_dp = memopt.analyze(dp, fetch_list=[dp_loss], batch_size=32)
    a_gm = memopt.analyze(gm, fetch_list=[gm_loss], batch_size=32)
    # accumulators (persistable) + the update's zeroed copies: 2 G more,
    # the gradients themselves still held (GC off)
    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0})
    try:
        off_dp = memopt.analyze(dp, fetch_list=[dp_loss], batch_size=32).total_peak()
        off_gm = memopt.analyze(gm, fetch_list=[gm_loss], batch_size=32).total_peak()
    finally:
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0})
    assert off_gm - off_dp >= 2 * grads
    assert a_gm.total_peak() > a_dp.total_peak()


def test_two_ranks_bit_identical_after_memory_optimize():
    """Real run: fleet data parallel on two spawned CPU ranks (gloo)."""
    from conftest import need

    need("paddle")
    from memopt.testing.dist_runs import RunConfig, launch, same_results

    small = dict(batch=16, steps=2, features=16, hidden=32, layers=2, gc=False)
    base = launch(RunConfig(mode="dp", **small), tempfile.mkdtemp())
    opt = launch(RunConfig(mode="dp", level=1, **small), tempfile.mkdtemp())
    for a, b in zip(base, opt, strict=True):
        assert same_results(a, b)
        assert b["peak"] > 0 and b["estimate"] > 0
    # data parallel: both ranks end with the same parameters, from different data
    assert not np.array_equal(base[0]["losses"], base[1]["losses"])
    for name, value in opt[0]["params"].items():
        assert np.array_equal(value, opt[1]["params"][name]), name


def test_sequential_run_flag_selects_program_order(paddle):
    """FLAGS_new_executor_sequential_run (the two-rank runs set it): the
    executor runs the ops in program order, the runtime model follows."""
    from memopt.paddle.flags import runtime_model

    old = paddle.get_flags(["FLAGS_new_executor_sequential_run"])
    try:
        paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
        assert runtime_model("pir").schedule == "program"
        paddle.set_flags({"FLAGS_new_executor_sequential_run": False})
        assert runtime_model("pir").schedule == "dataflow"
    finally:
        paddle.set_flags(old)


@pytest.mark.parametrize("mode", ["mp", "dp", "pir_dp"])
def test_auto_parallel_two_ranks_bit_identical_after_memory_optimize(mode):
    """Real run: paddle.distributed.to_static (auto-parallel PIR) on two
    spawned CPU ranks (gloo; Paddle patched where it wants a GPU, see
    memopt.testing.auto_parallel_models).  The rank's program after the
    parallel passes holds pd_op.all_reduce (and all_gather), the one before
    the reshard pass dist_op.reshard: memopt reads both, leaves every buffer
    of a communication op alone, and the rewritten program trains
    bit-identically on every rank.  ``pir_dp``: a plain PIR data-parallel
    program (paddle.distributed.all_reduce on each gradient:
    pd_op.all_reduce_), the same checks; at level 2 (the memory-aware order)
    too."""
    from conftest import need

    need("paddle")
    from memopt.testing.dist_runs import AutoParallelConfig, launch_auto_parallel, same_results

    base = launch_auto_parallel(AutoParallelConfig(mode=mode, gc=False), tempfile.mkdtemp())
    runs = [launch_auto_parallel(AutoParallelConfig(mode=mode, level=level, gc=gc),
                                 tempfile.mkdtemp())
            for level, gc in ((1, False), (0, True), (2, True))]
    for rank, a in enumerate(base):
        if mode == "pir_dp":
            assert a["comm_ops"] == ["pd_op.all_reduce_"] * 4, a["comm_ops"]
        else:
            assert "pd_op.all_reduce" in a["comm_ops"], a["comm_ops"]
            assert "dist_op.reshard" in a["before_reshard_comm_ops"]
            assert "before_reshard_error" not in a, a.get("before_reshard_error")
            assert a["before_reshard_comm_ops_after"] == a["before_reshard_comm_ops"]
        assert a["predicted_peak"] > 0 and a["params"]
        for opt in runs:
            b = opt[rank]
            assert same_results(a, b), (mode, b["config"])
            assert b["comm_ops_after"] == b["comm_ops"]
            assert b["inplace_on_communication"] == []
            assert not b["release_changed"]
            assert b["not_merged"].get(
                "communication buffer (in flight until the end of the step)", 0) > 0
    # GC off: memopt made ops in place (the rest of the program was optimized)
    assert runs[0][0]["merged"] > 0 and runs[0][0]["program_changed"]
    if mode != "mp":  # each rank its own data, the same parameters
        assert not np.array_equal(base[0]["losses"], base[1]["losses"])
    for name, value in base[0]["params"].items():
        if mode != "mp" or not name.endswith(".dist"):  # tensor parallel: shards differ
            assert np.array_equal(value, base[1]["params"][name]), name


def test_auto_parallel_cross_mesh_program_send_recv():
    """The pipeline cut (two one-rank meshes, dist.reshard between them):
    each rank's program holds pd_op.send_v2 / recv_v2 (dist_op.reshard
    before the reshard pass).  Built on two spawned ranks, not run (Paddle
    3.3.1's parameter initialisation segfaults on a CPU here); memopt reads
    both programs, changes no communication op and makes nothing in place
    on their buffers."""
    from conftest import need

    need("paddle")
    from memopt.testing.dist_runs import AutoParallelConfig, launch_auto_parallel

    records = launch_auto_parallel(AutoParallelConfig(mode="pp", level=1, gc=False),
                                   tempfile.mkdtemp())
    for r in records:
        assert sorted(r["comm_ops"]) == ["pd_op.recv_v2", "pd_op.send_v2"], r["comm_ops"]
        assert r["comm_ops_after"] == r["comm_ops"]
        assert r["inplace_on_communication"] == []
        assert "dist_op.reshard" in r["before_reshard_comm_ops"]
        assert "before_reshard_error" not in r, r.get("before_reshard_error")
        assert r["predicted_peak"] > 0
    # rank 0 sends the activation and receives its gradient: both held
    assert records[0]["not_merged"][
        "communication buffer (in flight until the end of the step)"] > 0


def _program_with_forward_all_reduce(paddle):
    """A PIR training program whose forward part all-reduces an activation
    (as tensor parallelism does after a row-parallel matmul; Paddle builds
    no gradient through it, so the first Linear is not trained)."""
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        x = paddle.static.data("x", [-1, 64], "float32")
        h = paddle._C_ops.all_reduce(paddle.nn.Linear(64, 256)(x), 0, 0)
        h = paddle.tanh(paddle.nn.functional.relu(h))
        loss = paddle.mean(paddle.nn.Linear(256, 1)(h))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main, loss


def test_budget_never_runs_a_collective_twice(paddle):
    """A clone of an all_reduce would be one more collective on this rank's
    schedule: communication ops may not run twice (the relu / tanh after it
    may, reading the all-reduced value held alive)."""
    from memopt import recompute
    from memopt.paddle.pir import program as pir, recompute as pir_recompute

    main, loss = _program_with_forward_all_reduce(paddle)
    problem = pir_recompute.problem_of(pir.convert(main, [loss]), 16)
    reasons = {op.type: r for op, r in zip(problem.ops, problem.reusable, strict=True)}
    assert reasons["pd_op.all_reduce"] == "communication"
    assert reasons["pd_op.tanh"] is None
    made_by = {name: op.type for op in problem.ops for name in op.writes}
    for name in recompute.candidates(problem):
        plan = recompute.make_plan(problem, [name])
        assert all(problem.ops[c.op].type != "pd_op.all_reduce" for c in plan.clones), name
        assert made_by[name] != "pd_op.all_reduce"


def test_level2_order_keeps_communication_ops_in_their_order(paddle):
    """Each rank runs its collectives in the program's order, which the
    peers' programs match: level 2's order problem chains them (each after
    the one before), as it chains random ops."""
    from memopt.paddle.pir import program as pir, schedule as pir_schedule

    main, loss = _program_with_forward_all_reduce(paddle)
    block = main.global_block()
    matmul_grad = next(op for op in block.ops if op.name() == "pd_op.matmul_grad")
    with paddle.static.program_guard(main):
        for g in matmul_grad.results():  # two independent collectives, backward part
            paddle._C_ops.all_reduce(g, 0, 0)
    problem = pir_schedule.order_problem(pir.convert(main, [loss]), 16)
    comm = [i for i, op in enumerate(block.ops) if distributed.is_communication(op.name())]
    assert len(comm) == 3
    for before, later in zip(comm, comm[1:]):
        assert before in problem.ops[later].after, (before, later)
