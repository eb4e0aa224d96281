"""The per-rank estimate's arithmetic (memopt.parallel) and the
communication facts on hand-made graphs (memopt.paddle.distributed reads op
type names only; Paddle is not imported here)."""
import json

import pytest

from memopt.graph import Graph, Op, Var
from memopt.refusals import Refusal
from memopt.plan import Options
from memopt.planner import plan_memory
from memopt.paddle import distributed
from memopt.parallel import ProgramFacts, Strategy, estimate_rank, fleet_sharding_owners
from memopt.release import plan_releases

MiB = 1 << 20


def facts(distributed_program=False):
    # P = 8 MiB parameters, O = 16 MiB (Adam: two moments), activations and
    # gradients at the peak grow with the micro-batch b
    return ProgramFacts(parameters=8 * MiB, optimizer_state=16 * MiB, other_persistable=0,
                        gradient_bytes=8 * MiB,
                        step_peak=lambda b: (4 * MiB, b * MiB),
                        boundary=lambda b: b * MiB // 4,
                        distributed=distributed_program)


def test_one_rank_is_the_program_itself():
    est = estimate_rank(facts(), Strategy(), 32)
    assert est.micro_batch_size == 32
    assert est.total == 8 * MiB + 16 * MiB + 4 * MiB + 32 * MiB
    assert est.components["communication buffers"] == 0


def test_data_parallel_splits_the_batch_only():
    est = estimate_rank(facts(), Strategy(dp=4), 32)
    assert est.micro_batch_size == 8
    assert est.components["parameters"] == 8 * MiB
    assert est.components["optimizer state"] == 16 * MiB
    assert est.components["activations"] == 8 * MiB


@pytest.mark.parametrize("stage,p,o,g", [(1, 8, 4, 4), (2, 8, 4, 1), (3, 2, 4, 1)])
def test_sharding_stages(stage, p, o, g):
    est = estimate_rank(facts(), Strategy(dp=4, sharding_stage=stage), 32)
    assert est.components["parameters"] == p * MiB
    assert est.components["optimizer state"] == o * MiB
    assert est.components["gradients"] == g * MiB


def test_gradient_merge_adds_accumulators_and_shrinks_the_micro_batch():
    est = estimate_rank(facts(), Strategy(dp=2, gradient_merge_steps=4), 64)
    assert est.micro_batch_size == 8
    assert est.components["gradient merge"] == 2 * 8 * MiB
    assert est.components["activations"] == 8 * MiB


def test_fleet_sharding_owners_whole_parameters_in_order():
    # the bench MLP's parameters (bytes): fc_0.w, fc_0.b, fc_1.w, fc_1.b, ...
    sizes = [512 * 1024, 2048, MiB, 2048, MiB, 2048, 2048, 4]
    assert fleet_sharding_owners(sizes, 2) == [0, 0, 0, 1, 1, 1, 1, 1]
    # strictly more than the share before moving on: rank 3 owns nothing
    assert fleet_sharding_owners([1, 1, 1, 1], 4) == [0, 0, 1, 2]
    assert fleet_sharding_owners([10], 2) == [0]           # rank 1 owns nothing


def test_sharding_per_rank_from_owners_and_rank_views():
    f = facts()
    f.param_order = (("a", 6 * MiB), ("b", 2 * MiB))
    f.state_of = {"a": 12 * MiB, "b": 4 * MiB}
    est = estimate_rank(f, Strategy(dp=2, sharding_stage=1), 32)
    # rank 0 owns a (12 MiB of state), rank 1 owns b (4 MiB)
    assert est.per_rank[0] - est.per_rank[1] == 8 * MiB
    assert est.components["optimizer state"] == 12 * MiB and est.total == est.per_rank[0]
    # a rank view: the parameters others own are temporaries there, in the
    # view's step peak (not counted twice)
    seen = []

    def view(owned):
        seen.append(owned)
        other = 8 * MiB - sum(size for n, size in f.param_order if n in owned)
        return ProgramFacts(0, 0, 0, 0, step_peak=lambda b: (4 * MiB, b * MiB + other))

    f.rank_view = view
    viewed = estimate_rank(f, Strategy(dp=2, sharding_stage=1), 32)
    assert seen == [frozenset({"a"}), frozenset({"b"})]
    assert viewed.per_rank == est.per_rank
    assert viewed.components["parameters"] == 6 * MiB   # rank 0 owns a
    # fleet's static sharding (the rank views) has no stage 2: stage 1's program
    stage2 = estimate_rank(f, Strategy(dp=2, sharding_stage=2), 32)
    assert stage2.per_rank == viewed.per_rank and "no stage 2" in str(stage2)
    assert "each rank" in str(viewed) and json.loads(viewed.dumps())["per_rank"] == est.per_rank


def test_tensor_and_pipeline_parallel_and_recompute():
    s = Strategy(tp=2, pp=2, micro_batch_size=4)
    est = estimate_rank(facts(), s, 32)  # 8 micro-batches, 2 in flight on stage 0
    assert est.components["parameters"] == 2 * MiB
    assert est.components["activations"] == 4 * MiB // 4 * 2
    assert est.components["communication buffers"] == 2 * (4 * MiB // 4)
    rec = estimate_rank(facts(), Strategy(tp=2, pp=2, micro_batch_size=4, recompute=True,
                                          recompute_segments=8), 32)
    assert rec.components["activations"] == est.components["activations"] // 4


def test_fused_gradients_hold_one_buffer():
    est = estimate_rank(facts(), Strategy(dp=2, fused_gradients=True), 32)
    assert est.components["communication buffers"] == 8 * MiB


def test_a_rank_program_is_not_divided_again():
    est = estimate_rank(facts(True), Strategy(dp=2, sharding_stage=1), 32)
    assert est.distributed_program
    assert est.components["optimizer state"] == 16 * MiB
    assert est.components["activations"] == 16 * MiB


def test_text_and_json():
    est = estimate_rank(facts(), Strategy(dp=2, sharding_stage=1), 32)
    text = str(est)
    assert "dp=2" in text and "peak per rank" in text and "O / (tp*pp) / dp" in text
    doc = json.loads(est.dumps())
    assert doc["peak_per_rank"] == est.total and doc["strategy"]["sharding_stage"] == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(dp=0), "dp"), (dict(sharding_stage=4), "sharding_stage"),
    (dict(micro_batch_size=0), "micro_batch_size"), (dict(gradient_merge_steps=True), "gradient"),
])
def test_bad_strategy_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Strategy(**kwargs)


def test_batch_that_does_not_divide():
    with pytest.raises(ValueError, match="multiple of dp"):
        estimate_rank(facts(), Strategy(dp=3), 32)


# -- communication ops on hand-made graphs -------------------------------------------

def dp_graph(comm_type="all_reduce"):
    """fwd -> grad g0 (all-reduced) -> dead temporaries after it.

    Without the communication fact, t1 (written after the all-reduce) could
    take g0's memory at level 0 (same shape), and g0 would be released.
    """
    g = Graph(fetch_names=("loss",))
    b = g.global_block
    b.add_var(Var("x", (-1, 8), is_data=True))
    b.add_var(Var("w", (8, 8), persistable=True))
    for name in ("t0", "g0", "t1", "t2"):
        b.add_var(Var(name, (8, 8)))
    b.add_var(Var("loss", ()))
    b.add_op(Op("scale", ("w",), ("t0",)))
    b.add_op(Op("mean", ("t0",), ("loss",), attrs={"loss": True}))
    b.add_op(Op("scale", ("t0",), ("g0",), role="backward"))
    b.add_op(Op(comm_type, ("g0",), ("g0",), role="backward"))
    b.add_op(Op("scale", ("g0",), ("t1",), role="backward"))
    b.add_op(Op("scale", ("t1",), ("t2",), role="backward"))
    b.add_op(Op("sgd", ("w", "t2"), ("w",), role="optimize"))
    return g


@pytest.mark.parametrize("op_type", ["all_reduce", "c_allreduce_sum", "pd_op.all_reduce_",
                                     "c_broadcast", "pd_op.reduce_scatter", "send_v2"])
def test_communication_buffers_are_never_shared_or_released(op_type):
    plain = dp_graph("scale")
    merged = plan_memory(plain, Options(skip_grads=False, level=0), gc=False).merged()
    assert "g0" in merged                               # shared when not communicated
    assert "g0" in plan_releases(plain).released

    g = distributed.mark_in_flight(dp_graph(op_type))
    assert distributed.in_flight_names(g) == {"g0"}
    plan = plan_memory(g, Options(skip_grads=False, level=1), gc=False)
    assert "g0" not in plan.merged()
    assert plan.reasons.get(Refusal.COMM) == 1
    assert "g0" not in plan_releases(g).released


def test_op_names():
    assert distributed.base_type("pd_op.all_reduce_") == "all_reduce"
    assert distributed.base_type("pd_op.relu_") == "pd_op.relu_"[6:]
    assert distributed.is_communication("c_sync_comm_stream")
    assert distributed.is_communication("coalesce_tensor")
    assert not distributed.is_communication("pd_op.matmul")
