"""Training set-ups of scripts/sweep_training_setups.py that found bugs.

- Legacy, memory_optimize on the forward program before minimize, then
  Paddle's RecomputeOptimizer with its checkpoint named (what fleet's
  ``recompute_configs={"checkpoints": [name]}`` passes): ``minimize`` failed
  inside Paddle with ``ValueError: var fc_0.tmp_2 not in this block`` (the
  rewrite had removed the name).  Now the rewrite declares such names
  again (:mod:`memopt.paddle.kept_declarations`): ``minimize`` builds its
  backward and ``Executor.run`` refuses the program with memopt's message,
  while a fetch of a kept name is refused as for any merged name.
"""
import numpy as np
import pytest

import memopt
from memopt import models
from memopt.errors import MergedVariableError, UnsupportedProgramError

BATCH = 4


def _mlp(paddle):
    """x -> fc relu (``h``, the checkpoint) -> fc relu -> fc: mean."""
    x = paddle.static.data("x", [-1, 16], "float32")
    h = paddle.static.nn.fc(x, 32, activation="relu")
    h2 = paddle.static.nn.fc(h, 32, activation="relu")
    return h, paddle.mean(paddle.static.nn.fc(h2, 4))


def _feed():
    return {"x": np.random.default_rng(0).standard_normal((BATCH, 16)).astype("float32")}


@pytest.mark.parametrize("level", [0, 1])
def test_legacy_recompute_checkpoint_by_name_after_forward_rewrite(level):
    import paddle

    paddle.enable_static()
    with models.ir_guard("legacy"), paddle.utils.unique_name.guard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            h, loss = _mlp(paddle)
            report = memopt.memory_optimize(main, level=level)
            assert report.merged_count > 0 and h.name not in memopt.paddle.legacy.known_names(
                main), "the checkpoint must be one of the merged names"
            opt = paddle.incubate.optimizer.RecomputeOptimizer(paddle.optimizer.SGD(0.1))
            opt._set_checkpoints([h.name])
            opt.minimize(loss)  # was: ValueError: var fc_0.tmp_2 not in this block
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            exe.run(startup)
            with pytest.raises(UnsupportedProgramError, match="after optimizer.minimize"):
                exe.run(main, feed=_feed(), fetch_list=[loss])


def test_legacy_kept_name_is_refused_like_a_merged_one():
    """Forward only (inference): the kept name is declared again but never
    written -- a fetch of it, of a clone's or of a parsed copy's, raises
    MergedVariableError; memory_optimize again with it in fetch_list says
    the program does not have it and leaves the program as it was."""
    import paddle

    paddle.enable_static()
    with models.ir_guard("legacy"), paddle.utils.unique_name.guard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            h, loss = _mlp(paddle)
        memopt.memory_optimize(main, level=1, fetch_list=[loss])
        assert main.global_block().has_var(h.name)  # declared again
        parsed = paddle.static.Program.parse_from_string(main.desc.serialize_to_string())
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            exe.run(startup)
            want = exe.run(main, feed=_feed(), fetch_list=[loss])[0]
            for program in (main, main.clone(for_test=True), parsed):
                with pytest.raises(MergedVariableError, match=h.name):
                    exe.run(program, feed=_feed(), fetch_list=[loss, h.name])
            assert np.array_equal(exe.run(parsed, feed=_feed(), fetch_list=[loss])[0], want)
        before = main.desc.serialize_to_string()
        with pytest.raises(ValueError, match="fetch_list"):
            memopt.memory_optimize(main, level=1, fetch_list=[h.name])
        assert main.desc.serialize_to_string() == before
