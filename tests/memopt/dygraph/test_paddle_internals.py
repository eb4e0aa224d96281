"""Each Paddle internal memopt.paddle.dygraph relies on, checked directly: these fail
loudly (with what changed) when a Paddle release changes them."""
import inspect

import pytest

from tests.conftest import need

paddle = need("paddle")

from memopt.testing import dygraph_models as dm  # noqa: E402


def test_get_concrete_program_gives_train_program_with_ranges_and_grads():
    step = dm.step_layer("mlp")
    fn = paddle.jit.to_static(step.forward, full_graph=True, backend=None)
    _, partial = fn.get_concrete_program(*dm.spec("mlp"))
    assert callable(getattr(partial, "_set_grad_type", None)), \
        "PartialProgramLayer._set_grad_type gone: capture() replaces it on its own partial program"
    partial._set_grad_type = lambda params, program: None
    runnable = partial.train_program
    for attr in ("program", "forward_range", "backward_range", "param_names",
                 "param_grad_values", "out_values", "x_names"):
        assert hasattr(runnable, attr), f"RunnableProgram.{attr} gone"
    assert runnable.forward_range[1] <= runnable.backward_range[0] < runnable.backward_range[1]
    assert len(runnable.param_names) == len(runnable.param_grad_values) == len(
        step.parameters())
    assert runnable.x_names == ["x", "label"]


def test_train_program_building_resets_parameter_gradients():
    """Why capture() stubs _set_grad_type: Paddle's drops a kept gradient."""
    step, inputs, opt = dm.build("mlp", 4)
    loss = step(*inputs)
    loss.backward()
    opt.step()
    opt.clear_grad()
    p = step.parameters()[0]
    assert p.grad is not None
    fn = paddle.jit.to_static(step.forward, full_graph=True, backend=None)
    _, partial = fn.get_concrete_program(*dm.spec("mlp"))
    partial.train_program
    assert p.grad is None, "Paddle no longer resets gradients: the stub may go"


def test_static_function_keeps_method_in_original_funcs():
    step = dm.step_layer("mlp")
    assert step._original_funcs == {}
    paddle.jit.to_static(step.forward, full_graph=True, backend=None)
    assert "forward" in step._original_funcs, "StaticFunction no longer writes _original_funcs"


def test_input_spec_default_stop_gradient_is_false():
    assert paddle.static.InputSpec([None, 4], "float32").stop_gradient is False


def test_optimizer_accumulator_hooks():
    opt = paddle.optimizer.Adam(parameters=dm.step_layer("mlp").parameters())
    sig = inspect.signature(type(opt)._add_accumulator)
    assert list(sig.parameters)[:7] == ["self", "name", "param", "dtype", "fill_value", "shape",
                                        "type"], sig
    assert list(inspect.signature(type(opt)._create_accumulators).parameters) == [
        "self", "block", "parameters"]
    assert list(inspect.signature(type(opt)._create_master_weight).parameters) == [
        "self", "param"]
    for attr in ("_accumulators", "_master_weights", "_already_create_accumulator", "_name",
                 "_parameter_list", "_grad_clip"):
        assert hasattr(opt, attr), f"Optimizer.{attr} gone"


def test_host_allocator_stats():
    from paddle.base import core

    core.host_memory_stat_reset_peak_value("Allocated", 0)
    before = core.host_memory_stat_current_value("Allocated", 0)
    x = paddle.zeros([1024, 256], "float32")
    assert core.host_memory_stat_peak_value("Allocated", 0) >= before + 1024 * 256 * 4
    del x


def test_stride_views_allocate_nothing():
    from memopt.testing.dygraph_runs import allocated, peak, reset_peak

    x = paddle.randn([256, 512])
    for name, f in [("reshape", lambda: x.reshape([-1, 64])), ("transpose", lambda: x.t()),
                    ("slice", lambda: x[:, :100]), ("unsqueeze", lambda: x.unsqueeze(0))]:
        base = allocated()
        reset_peak()
        y = f()
        assert peak() - base == 0, f"eager {name} allocates now: EAGER_VIEWS is stale"
        del y


def test_layer_hooks_run_while_to_static_traces():
    step = dm.step_layer("mlp")
    seen = []
    handle = step.model.layers[1].register_forward_post_hook(
        lambda layer, i, o: seen.append(len(paddle.static.default_main_program()
                                            .global_block().ops)))
    try:
        fn = paddle.jit.to_static(step.forward, full_graph=True, backend=None)
        fn.get_concrete_program(*dm.spec("mlp"))
    finally:
        handle.remove()
    assert seen and seen[0] > 0, "sublayer hooks no longer run (or see the program) in dy2st"


def test_fleet_recompute_signature():
    from paddle.distributed.fleet.utils import recompute

    src = inspect.getsource(recompute)
    assert "preserve_rng_state" in src and "use_reentrant" in src


@pytest.mark.parametrize("clip,extra", [("ClipGradByGlobalNorm", False), ("ClipGradByNorm", True)])
def test_gradient_clip_copies(clip, extra):
    """estimate.step_extras: global-norm clipping makes no second gradient, by-norm does."""
    from memopt.testing.dygraph_runs import allocated, peak, reset_peak

    step, inputs, _ = dm.build("mlp", 8, width=256)
    opt = paddle.optimizer.Adam(parameters=step.parameters(),
                                grad_clip=getattr(paddle.nn, clip)(1.0))
    grads = sum(int(p.numel()) * 4 for p in step.parameters())
    for _ in range(2):
        loss = step(*inputs)
        loss.backward()
        base = allocated()
        reset_peak()
        opt.step()
        over = peak() - base
        opt.clear_grad()
    assert (over >= grads) == extra, (clip, over, grads)
