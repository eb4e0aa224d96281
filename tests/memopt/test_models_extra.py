"""The further real-world models of memopt.testing.models (EXTRA_MODEL_NAMES) build
and train in both IRs (amp_bf16: legacy only), deterministically."""
import numpy as np
import pytest

from memopt.testing import models


@pytest.mark.parametrize("name", models.EXTRA_MODEL_NAMES)
@pytest.mark.parametrize("ir", models.IRS)
def test_extra_model_trains(paddle, name, ir):
    if name == "amp_bf16" and ir == "pir":
        with pytest.raises(ValueError, match="legacy IR only"):
            models.build(name, ir)
        return
    first = models.run_steps(models.build(name, ir), 2)
    again = models.run_steps(models.build(name, ir), 2)
    losses = [f[0] for f in first.fetches]
    assert all(np.isfinite(x).all() for x in losses)
    assert not np.array_equal(first.params[0], models.run_steps(models.build(name, ir), 0).params[0])
    for a, b in zip(first.fetches, again.fetches, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_rnn_models_agree_across_irs(paddle):
    """The same LSTM/GRU in both IRs: the same losses (same initial values)."""
    for name in ("lstm", "gru"):
        legacy = models.run_steps(models.build(name, "legacy"), 2)
        pir = models.run_steps(models.build(name, "pir"), 2)
        for a, b in zip(legacy.fetches, pir.fetches, strict=True):
            np.testing.assert_allclose(a[0], b[0], rtol=1e-5)
