"""A legacy inference model read back, rewritten and saved again for
``paddle.inference``'s predictor (:mod:`memopt.paddle.legacy.deploy`).

Level 1 writes the flatten before the classifier over its 4-D input's
buffer: the program records that buffer as holding variables of different
shapes, and ``save_inference_model`` warns (the predictor's oneDNN passes
fail on such a model in Paddle 3.3.1).  Level 0 shares only equal shapes:
no warning, and the predictor under its defaults gives the unchanged
model's bytes."""
import warnings

import numpy as np

import memopt
from memopt.paddle.legacy import merge_record
from runs import save_legacy_cnn


def _rewrite_and_save(paddle, exe, src, dst, level):
    """Read ``src`` back, memory_optimize at ``level``, save at ``dst``;
    the memopt warnings raised by the save."""
    program, feeds, fetches = paddle.static.load_inference_model(src, exe)
    memopt.memory_optimize(program, level=level, fetch_list=fetches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paddle.static.save_inference_model(
            dst, [program.global_block().var(n) for n in feeds], fetches, exe, program=program)
    return program, [str(w.message) for w in caught if str(w.message).startswith("memopt:")]


def _predict(prefix):
    from paddle import inference

    config = inference.Config(prefix + ".pdmodel", prefix + ".pdiparams")
    config.disable_gpu()
    predictor = inference.create_predictor(config)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")
    predictor.get_input_handle(predictor.get_input_names()[0]).copy_from_cpu(x)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def test_save_warns_for_buffers_across_shapes_and_level0_deploys_bit_identically(paddle, tmp_path):
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        exe = save_legacy_cnn(paddle, str(tmp_path / "ref"))
        level1, said1 = _rewrite_and_save(paddle, exe, str(tmp_path / "ref"),
                                          str(tmp_path / "l1"), level=1)
        level0, said0 = _rewrite_and_save(paddle, exe, str(tmp_path / "ref"),
                                          str(tmp_path / "l0"), level=0)
    mixed = merge_record.mixed_shape_buffers(level1)
    assert mixed and len(said1) == 1 and mixed[0] in said1[0]
    assert "level 0" in said1[0] and "switch_ir_optim(False)" in said1[0]
    assert merge_record.mixed_shape_buffers(level0) == [] and said0 == []
    assert merge_record.record_of(level0)  # level 0 did merge (equal shapes)
    want = _predict(str(tmp_path / "ref"))
    got = _predict(str(tmp_path / "l0"))
    assert want.dtype == got.dtype and np.array_equal(want, got)
