"""Each internal of Paddle that memory_optimize on a to_static step relies on,
checked: present on this Paddle, and a named error (with Paddle's version,
before anything changes) when it differs."""
import pytest

from tests.conftest import need


@pytest.fixture
def dy():
    paddle = need("paddle")
    was_static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    yield paddle
    if was_static:
        paddle.enable_static()


@pytest.fixture(autouse=True)
def _memopt_off_after_each_test():
    """A test that fails before its handle's remove() leaves memopt installed:
    take every handle off so the next test starts from Paddle as shipped."""
    yield
    import sys

    ts = sys.modules.get("memopt.paddle.dygraph.to_static")
    if ts is not None:
        for handle in list(ts._live):
            handle.remove()


def _break_build_once(monkeypatch):
    from paddle.jit.dy2static.program_translator import ProgramCache

    monkeypatch.setattr(ProgramCache, "_build_once", lambda self, key, extra=None: None)


def _break_partial_program(monkeypatch):
    from paddle.jit.dy2static.pir_partial_program import PartialProgramLayer

    def append_backward(self, program):  # a Paddle that no longer calls the hookers
        return program

    monkeypatch.setattr(PartialProgramLayer, "_append_backward", append_backward)


def _break_hook_class(monkeypatch):
    from paddle.jit.dy2static.pir_partial_program import PartialProgramLayerHook

    monkeypatch.setattr(PartialProgramLayerHook, "after_append_backward",
                        lambda self, whole_program, inputs: (whole_program, 0, inputs))


def _break_static_functions(monkeypatch):
    from paddle.jit.dy2static.program_translator import SymbolicStaticFunction

    monkeypatch.delattr(SymbolicStaticFunction, "_perform_call")


def _break_sot(monkeypatch):
    from paddle.jit.sot.symbolic.compile_cache import CompileSIRCache

    monkeypatch.setattr(CompileSIRCache, "value_fn", lambda self, *a, **k: None)


BREAKS = {
    "ProgramCache._build_once registers hookers": _break_build_once,
    "PartialProgramLayer.add_hooker, cached train_program, the hook before the split":
        _break_partial_program,
    "PartialProgramLayerHook.after_append_backward's parameters": _break_hook_class,
    "StaticFunction._perform_call, _program_cache, last_call_input_spec":
        _break_static_functions,
    "SOT subgraphs built by paddle.jit.to_static(full_graph=True)": _break_sot,
}


def test_every_internal_has_a_breaking_test():
    from memopt.paddle.dygraph.hook import INTERNALS

    assert sorted(BREAKS) == sorted(INTERNALS)


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_internal_present_on_this_paddle(dy, name):
    from memopt.paddle.dygraph.hook import INTERNALS

    assert INTERNALS[name]() is None


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_internal_changed_is_a_named_error_before_any_change(dy, name, monkeypatch):
    import memopt
    from memopt.paddle.dygraph import to_static as ts
    from memopt.testing import dygraph_models

    step, _, opt = dygraph_models.build("mlp", batch=8, width=16, depth=2)
    step = dy.jit.to_static(step)
    BREAKS[name](monkeypatch)
    with pytest.raises(memopt.PaddleInternalsError) as info:
        memopt.memory_optimize(step, level=2, optimizer=opt)
    message = str(info.value)
    assert f"paddle {dy.__version__}" in message and name in message
    assert not ts.installed()
    assert "_perform_call" not in ts.static_function_of(step).__dict__


def test_pir_off_is_named(dy, monkeypatch):
    import memopt
    import paddle.framework

    from memopt.paddle.dygraph import to_static as ts
    from memopt.testing import dygraph_models

    step, _, opt = dygraph_models.build("mlp", batch=8, width=16, depth=2)
    step = dy.jit.to_static(step)
    monkeypatch.setattr(paddle.framework, "use_pir_api", lambda: False)
    with pytest.raises(memopt.PaddleInternalsError, match="PIR is off"):
        memopt.memory_optimize(step, level=2, optimizer=opt)
    assert not ts.installed()


def test_the_hook_runs_before_the_split_and_its_order_is_run(dy):
    """What the hook returns is what Paddle splits and runs: a rewrite that
    adds ops (recomputation) and moves the seeding ops is run as rewritten
    (the forward program holds the forward ops, the numbers are Paddle's)."""
    from memopt.testing.to_static_runs import train

    size = dict(batch=1024, width=128, depth=6)
    base = train("mlp", mode="full_graph", steps=1, **size)
    options = {"level": 2, "skip_grads": False}
    got = train("mlp", mode="full_graph", steps=1,
                memopt=dict(options, budget=int(0.9 * base.max)), **size)
    if got.error:  # the default's peak varies: the least budget memopt plans
        got = train("mlp", mode="full_graph", steps=1,
                    memopt=dict(options, budget=got.smallest_budget), **size)
    assert got.programs == 1 and "recompute" in got.reports[0]
    assert got.same_numbers(base)


def test_train_program_is_built_once_per_partial_program(dy):
    """Paddle builds a partial program's training program once and caches it
    (so memopt must be there before the first call)."""
    from memopt.testing import dygraph_models

    step, inputs, opt = dygraph_models.build("mlp", batch=8, width=16, depth=2)
    step = dy.jit.to_static(step, full_graph=True)
    step(*inputs).backward()
    _, partial = step.forward.get_concrete_program(*inputs)
    first = partial.train_program
    step(*inputs).backward()
    assert partial.train_program is first
