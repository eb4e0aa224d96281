"""memopt.testing.models builds real Paddle training programs that run."""
import numpy as np
import pytest

from memopt.testing import models


@pytest.mark.parametrize("ir", models.IRS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_model_builds_and_trains_one_step(paddle, name, ir):
    model = models.build(name, ir)
    result = models.run_steps(model, steps=1)
    loss = result.fetches[0][0]
    assert loss.shape == () and np.isfinite(loss)
    assert result.params, "a training program has parameters"
    if ir == "legacy":
        assert isinstance(model.main, paddle.base.framework.Program)
        ops = {op.type for block in model.main.blocks for op in block.ops}
        assert any(t.endswith("_grad") for t in ops), "backward ops present"
    else:
        assert isinstance(model.main, paddle.pir.Program)


def test_same_arguments_same_numbers(paddle):
    """Two builds see the same parameters and data: the base of every
    bit-identical comparison in the suite."""
    a = models.run_steps(models.build("mlp", "legacy"), steps=2)
    b = models.run_steps(models.build("mlp", "legacy"), steps=2)
    for fa, fb in zip(a.fetches, b.fetches, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(fa, fb, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    # and a different seed gives different parameters
    c = models.run_steps(models.build("mlp", "legacy", seed=7), steps=1)
    assert not np.array_equal(a.params[-1], c.params[-1])


def test_control_flow_models_hold_sub_blocks(paddle):
    loop = models.build("while_loop", "legacy").main
    assert "while" in {op.type for op in loop.global_block().ops}
    cond = models.build("nested_cond", "legacy").main
    # two outer branches, two inner ones, and their grad blocks
    assert cond.num_blocks >= 5
    nested = [b for b in cond.blocks if b.parent_idx > 0]
    assert nested, "a conditional inside a conditional"


def test_nested_cond_takes_both_branches(paddle):
    """Feeds alternate the sign of the input, so both outer branches run."""
    model = models.build("nested_cond", "legacy")
    rng = np.random.default_rng(3)
    signs = {float(np.sign(model.feed(rng)["x"].mean())) for _ in range(8)}
    assert signs == {-1.0, 1.0}


def test_bad_arguments(paddle):
    with pytest.raises(ValueError, match="unknown model 'alexnet'"):
        models.build("alexnet")
    with pytest.raises(ValueError, match="ir must be"):
        models.build("mlp", ir="tf")
    with pytest.raises(ValueError, match="optimizer must be"):
        models.build("mlp", optimizer="lbfgs")
