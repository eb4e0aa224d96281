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
    from memopt.models import ir_guard
    from memopt.paddle import fleet_models

    with ir_guard("legacy"):
        return fleet_models.build(mode, features=16, hidden=32, layers=2)


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
    from memopt.models import ir_guard

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
    assert dp.components["optimizer state"] * 2 == pytest.approx(
        one.components["optimizer state"], abs=2)
    assert dp.total < one.total
    rank, _, _ = build(paddle, "dp")
    est = memopt.estimate(rank, dp=2, batch_size=64)
    assert est.distributed_program and "already one rank's program" in str(est)


def test_two_ranks_bit_identical_after_memory_optimize():
    """Real run: fleet data parallel on two spawned CPU ranks (gloo)."""
    from conftest import need

    need("paddle")
    from memopt.dist_runs import RunConfig, launch, same_results

    small = dict(batch=16, steps=2, features=16, hidden=32, layers=2, gc=False)
    base = launch(RunConfig(mode="dp", **small), tempfile.mkdtemp())
    opt = launch(RunConfig(mode="dp", level=1, **small), tempfile.mkdtemp())
    for a, b in zip(base, opt):
        assert same_results(a, b)
        assert b["peak"] > 0 and b["estimate"] > 0
    # data parallel: both ranks end with the same parameters, from different data
    assert not np.array_equal(base[0]["losses"], base[1]["losses"])
    for name, value in opt[0]["params"].items():
        assert np.array_equal(value, opt[1]["params"][name]), name
