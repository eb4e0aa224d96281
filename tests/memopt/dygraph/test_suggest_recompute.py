"""memopt.suggest_recompute: the advised sublayers, wrapped in fleet's recompute, fit the budget
with bit-identical training, and undo() restores the model."""
import numpy as np
import pytest

from tests.conftest import need

paddle = need("paddle")

import memopt  # noqa: E402
from memopt.errors import BudgetError  # noqa: E402
from memopt.testing import dygraph_models as dm  # noqa: E402
from memopt.testing.dygraph_runs import measure  # noqa: E402

CASES = [("gpt", 32, {"layers": 4}, 0.6), ("bert", 32, {"layers": 4}, 0.6)]


@pytest.mark.parametrize("kind,batch,size,fraction", CASES, ids=[c[0] for c in CASES])
def test_apply_fits_budget_bit_identical(kind, batch, size, fraction):
    step, inputs, opt = dm.build(kind, batch, **size)
    spec = dm.spec(kind, **size)
    an = memopt.analyze(step, batch, input_spec=spec, optimizer=opt)
    fixed = an.persistable_bytes(batch)
    budget = int(fixed + fraction * (an.total_peak(batch) - fixed))
    advice = memopt.suggest_recompute(step, spec, opt, budget=budget, batch_size=batch)
    assert advice.layers and advice.peak_after <= budget < advice.peak_before
    assert 0 < advice.added_compute < 1
    assert all(p.startswith("model.") for p in advice.layers), advice.layers
    del step, inputs, opt
    plain = measure(lambda: dm.build(kind, batch, **size), steps=2, warmup=2, keep_params=True)

    handles = []

    def wrapped():
        s, i, o = dm.build(kind, batch, **size)
        handles.append(advice.apply(s))
        return s, i, o

    run = measure(wrapped, steps=2, warmup=2, keep_params=True)
    assert run.max <= budget, (run.peaks, budget)
    assert abs(advice.peak_after / run.median - 1) <= 0.05
    assert run.losses == plain.losses
    for name in plain.params:
        assert np.array_equal(plain.params[name], run.params[name]), name
    assert plain.max > budget   # the budget needed the recompute


def test_undo_restores_forward_and_results():
    step, inputs, opt = dm.build("gpt", 8, layers=3)
    originals = {path: ("forward" in layer.__dict__, layer.forward.__func__)
                 for path, layer in step.named_sublayers()}
    an = memopt.analyze(step, 8, input_spec=dm.spec("gpt", layers=3), optimizer=opt)
    fixed = an.persistable_bytes(8)
    advice = memopt.suggest_recompute(step, dm.spec("gpt", layers=3), opt,
                                      budget=int(fixed + 0.7 * (an.total_peak(8) - fixed)),
                                      batch_size=8)
    applied = advice.apply(step)
    for path in advice.layers:
        assert "forward" in dict(step.named_sublayers())[path].__dict__
    applied.undo()
    for path, layer in step.named_sublayers():
        had, func = originals[path]
        assert ("forward" in layer.__dict__) == had
        assert layer.forward.__func__ is func
    with pytest.raises(ValueError, match="no sublayer"):
        advice.apply(dm.step_layer("mlp"))


def test_fits_without_recompute_and_impossible_budget():
    step, inputs, opt = dm.build("gpt", 8)
    an = memopt.analyze(step, 8, input_spec=dm.spec("gpt"), optimizer=opt)
    roomy = memopt.suggest_recompute(step, dm.spec("gpt"), opt, budget=an.total_peak(8),
                                     batch_size=8)
    assert roomy.layers == [] and roomy.peak_after == roomy.peak_before
    with pytest.raises(BudgetError) as err:
        memopt.suggest_recompute(step, dm.spec("gpt"), opt, budget=an.persistable_bytes(8),
                                 batch_size=8)
    assert err.value.smallest_budget > an.persistable_bytes(8)
    with pytest.raises(TypeError, match="nn.Layer"):
        memopt.suggest_recompute(lambda x, y: x, dm.spec("gpt"), opt, budget="1GiB",
                                 batch_size=8)


def test_op_flops():
    from memopt.paddle.dygraph.recompute_advice import op_flops

    step, inputs, opt = dm.build("mlp", 8, width=32, depth=1, inputs=16)
    an = memopt.analyze(step, 8, input_spec=dm.spec("mlp", inputs=16), optimizer=opt)
    matmuls = [op for _, op in an.graph.walk_ops() if op.type == "pd_op.matmul"]
    # x [B, 16] @ w [16, 32]: 2 * B * 16 * 32; the head [B, 32] @ [32, 10]: 2 * B * 32 * 10
    assert [op_flops(op, an.graph, 8) for op in matmuls] == [2 * 8 * 16 * 32, 2 * 8 * 32 * 10]
