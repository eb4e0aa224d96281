"""memory_optimize on paddle.jit.to_static steps, on real Paddle, SOT and full graph.

Bit-identity: losses, every gradient of every step and every parameter after
the last step equal to the byte to the same model trained without memopt
(several Adam steps).  Budgets: the allocator peak of every steady step,
measured in a fresh process, within the budget.
"""
import pytest

from tests.conftest import need

MODES = ("sot", "full_graph")


@pytest.fixture
def dy():
    """Paddle in dynamic mode for the test (the session fixture turns static on)."""
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


def _train(kind, mode, memopt=None, **kw):
    from memopt.testing.to_static_runs import train

    return train(kind, mode=mode, memopt=memopt, **kw)


# -- bit-identical over several Adam steps -------------------------------------------

#: small configs whose programs hold the constructs users train: dropout (the
#: RNG), batch norm (buffers written in place), attention masks, recurrence,
#: transposed convolutions and skip concats.
KINDS = {
    "mlp": dict(batch=64, width=128, depth=3, dropout=0.1),
    "bert": dict(batch=8, seq=16, width=32, ffn=64, layers=2),
    "gpt": dict(batch=4, seq=16, width=32, layers=2, vocab=200),
    "resnet": dict(batch=4, depth=18, image=32),
    "lstm": dict(batch=8, seq=8, inputs=16, hidden=32, layers=1),
    "unet": dict(batch=2, image=16, width=4),
    "vit": dict(batch=4, image=16, patch=4, width=32, layers=1),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_level2_is_bit_identical(dy, kind, mode):
    size = dict(KINDS[kind])
    batch = size.pop("batch")
    base = _train(kind, mode, batch=batch, steps=2, **size)
    got = _train(kind, mode, {"level": 2, "skip_grads": False}, batch=batch, steps=2, **size)
    assert got.programs >= 1, "no training program was rewritten"
    assert got.losses == base.losses
    for step, (a, b) in enumerate(zip(got.grads, base.grads, strict=True)):
        assert a == b, f"gradients differ at step {step}"
    assert got.params == base.params and got.params


@pytest.mark.parametrize("mode", MODES)
def test_budget_holds_measured_and_bit_identical(dy, mode):
    """A budget at 75% of the step's measured peak: every steady step of a
    fresh process within it, numbers unchanged, the report says what was
    recomputed."""
    from memopt.testing.to_static_runs import train_fresh

    size = dict(kind="bert", batch=64, seq=32, width=64, ffn=256, layers=2)
    base = train_fresh(mode=mode, steps=4, **size)
    budget = int(0.75 * base.max)
    options = {"level": 2, "skip_grads": False}
    got = train_fresh(mode=mode, steps=4, memopt=dict(options, budget=budget), **size)
    if got.error:   # the default's peak varies between processes: the least budget memopt plans
        assert "smallest step budget" in got.error
        budget = got.smallest_budget
        assert budget <= 0.9 * base.max, (budget, base.peaks)
        got = train_fresh(mode=mode, steps=4, memopt=dict(options, budget=budget), **size)
    assert got.programs >= 1
    assert got.same_numbers(base)
    over = [p for p in got.peaks if p > budget]
    assert not over, f"steps over the budget {budget}: {over} (default {base.peaks})"
    assert "recompute" in "\n".join(got.reports)


# -- what the user sees --------------------------------------------------------------

def _mlp(dy, mode="full_graph"):
    from memopt.testing import dygraph_models

    step, inputs, opt = dygraph_models.build("mlp", batch=32, width=64, depth=3)
    return dy.jit.to_static(step, full_graph=(mode == "full_graph")), inputs, opt


def _one_step(step, inputs, opt):
    loss = step(*inputs)
    loss.backward()
    opt.step()
    opt.clear_grad()
    return float(loss)


@pytest.mark.parametrize("mode", MODES)
def test_reports_per_program_and_print_log(dy, mode, capsys):
    import memopt

    step, inputs, opt = _mlp(dy, mode)
    handle = memopt.memory_optimize(step, level=2, skip_grads=False, optimizer=opt,
                                    print_log=True)
    assert handle.records == []
    _one_step(step, inputs, opt)
    _one_step(step, inputs, opt)
    assert len(handle.records) == 1   # built once, then cached by Paddle
    assert handle.reports[0].level == 2
    out = capsys.readouterr().out
    assert "to_static program 1" in out and "memopt: pir program, level 2" in out
    assert "to_static program 1" in str(handle)
    handle.remove()


def test_each_input_signature_gets_its_program(dy):
    import memopt
    from memopt.testing import dygraph_models

    step, _, opt = _mlp(dy)
    handle = memopt.memory_optimize(step, level=2, skip_grads=False, optimizer=opt)
    for batch in (8, 16):
        _one_step(step, dygraph_models.inputs("mlp", batch, width=64, depth=3), opt)
    assert len(handle.records) == 2
    handle.remove()


def test_built_but_not_run_is_still_rewritten(dy):
    """get_concrete_program builds a program without running it: memopt
    takes it on."""
    import memopt

    step, inputs, opt = _mlp(dy)
    step.forward.get_concrete_program(*inputs)
    handle = memopt.memory_optimize(step, level=2, skip_grads=False, optimizer=opt)
    _one_step(step, inputs, opt)
    assert len(handle.records) == 1
    handle.remove()


def test_sot_graph_break_rewrites_each_subgraph(dy):
    """A Python-side break (reading a value) splits SOT's trace: each
    subgraph's training program is rewritten; numbers unchanged."""
    import numpy as np

    import memopt
    from memopt.testing.graph_break import GraphBreak

    def run(optimize):
        dy.seed(1)
        model = GraphBreak()
        opt = dy.optimizer.Adam(parameters=model.parameters())
        step = dy.jit.to_static(model)
        handle = memopt.memory_optimize(step, level=2, skip_grads=False,
                                        optimizer=opt) if optimize else None
        x = dy.to_tensor(np.random.default_rng(0).standard_normal((32, 64)).astype("float32"))
        losses = [_one_step(step, [x], opt) for _ in range(3)]
        return losses, [p.numpy() for p in model.parameters()], handle

    want, want_params, _ = run(False)
    got, got_params, handle = run(True)
    assert len(handle.records) >= 2
    assert got == want
    for a, b in zip(got_params, want_params, strict=True):
        assert np.array_equal(a, b)
    handle.remove()


# -- errors: named, and nothing changed ---------------------------------------------

def _untouched(step):
    from memopt.paddle.dygraph import to_static as ts

    function = ts.static_function_of(step)
    return "_perform_call" not in function.__dict__ and not ts.installed()


@pytest.mark.parametrize("mode", MODES)
def test_after_the_first_call_is_a_named_error(dy, mode):
    import memopt

    step, inputs, opt = _mlp(dy, mode)
    _one_step(step, inputs, opt)
    with pytest.raises(memopt.StepAlreadyRunError, match="before its first call"):
        memopt.memory_optimize(step, level=2, optimizer=opt)
    assert _untouched(step)


def test_installing_twice_is_a_named_error(dy):
    import memopt

    step, _, opt = _mlp(dy)
    handle = memopt.memory_optimize(step, level=2, optimizer=opt)
    with pytest.raises(memopt.StepAlreadyRunError, match="already installed"):
        memopt.memory_optimize(step, level=2, optimizer=opt)
    handle.remove()
    assert _untouched(step)


def test_budget_below_the_optimizer_step_is_refused_before_any_change(dy):
    import memopt

    step, _, opt = _mlp(dy)
    with pytest.raises(memopt.BudgetError, match="eager optimizer step alone") as info:
        memopt.memory_optimize(step, level=2, optimizer=opt, budget=10_000, batch_size=32)
    assert info.value.smallest_budget > 10_000
    assert _untouched(step)


def test_budget_too_small_for_the_program_names_the_step_budget(dy):
    """The program's BudgetError comes out of the step's call in the step's
    terms (optimizer state and kept gradients added back)."""
    import memopt

    step, inputs, opt = _mlp(dy)
    params = sum(int(dy.numel(p)) * 4 for p in step.parameters())
    budget = 4 * params + 1000   # the update fits, the program cannot
    handle = memopt.memory_optimize(step, level=2, optimizer=opt, budget=budget,
                                    batch_size=32)
    with pytest.raises(memopt.BudgetError, match="smallest step budget") as info:
        step(*inputs)
    assert info.value.smallest_budget > budget
    handle.remove()


def test_bad_arguments(dy):
    import memopt

    step, _, opt = _mlp(dy)
    with pytest.raises(ValueError, match="skip_opt_set and fetch_list"):
        memopt.memory_optimize(step, skip_opt_set={"x"})
    with pytest.raises(ValueError, match="batch_size"):
        memopt.memory_optimize(step, budget="1GiB", optimizer=opt)
    with pytest.raises(ValueError, match="level"):
        memopt.memory_optimize(step, level=3)
    assert _untouched(step)


def test_a_layer_not_converted_is_named(dy):
    import memopt

    with pytest.raises(memopt.UnsupportedProgramError, match="Linear"):
        memopt.memory_optimize(dy.nn.Linear(2, 2))


# -- taking memopt off ----------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_remove_takes_memopt_off(dy, mode):
    import memopt
    from paddle.jit.dy2static.program_translator import ProgramCache

    original = ProgramCache._build_once
    step, inputs, opt = _mlp(dy, mode)
    handle = memopt.memory_optimize(step, level=2, skip_grads=False, optimizer=opt)
    assert ProgramCache._build_once is not original
    _one_step(step, inputs, opt)
    assert len(handle.records) == 1
    handle.remove()
    assert ProgramCache._build_once is original
    assert _untouched(step)
    _one_step(step, inputs, opt)   # built again, as Paddle makes it
    assert len(handle.records) == 1
    handle.remove()  # a second call does nothing
    # and memopt can go on again only through a new step (this one has run)
    with pytest.raises(memopt.StepAlreadyRunError):
        memopt.memory_optimize(step, level=2, optimizer=opt)


# -- what to_static returned: a converted Layer, a Layer's forward, a function -------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", ["forward", "function"])
def test_forward_and_functions_are_steps_too(dy, mode, what):
    """``to_static(model.forward)`` and ``to_static(fn)`` of a function
    closing over the model: rewritten, numbers unchanged."""
    import numpy as np

    import memopt
    from memopt.testing import dygraph_models

    def run(optimize):
        model, inputs, opt = dygraph_models.build("mlp", batch=64, width=64, depth=3)
        if what == "forward":
            step = dy.jit.to_static(model.forward, full_graph=(mode == "full_graph"))
        else:
            def train_step(x, label):
                return model(x, label)

            step = dy.jit.to_static(train_step, full_graph=(mode == "full_graph"))
        handle = memopt.memory_optimize(step, level=2, skip_grads=False,
                                        optimizer=opt) if optimize else None
        losses = [_one_step(step, inputs, opt) for _ in range(3)]
        return losses, [p.numpy() for p in model.parameters()], handle

    want, want_params, _ = run(False)
    got, got_params, handle = run(True)
    assert len(handle.records) == 1
    assert got == want
    for a, b in zip(got_params, want_params, strict=True):
        assert np.array_equal(a, b)
    handle.remove()


def test_sot_subgraphs_share_the_step_budget(dy):
    """Each SOT subgraph is planned for the step's budget less what lives
    outside the programs and what the subgraphs before it in the same call
    hold for their backward; the measured steps stay within the budget."""
    import numpy as np

    import memopt
    from memopt.testing.dygraph_runs import allocated, peak, reset_peak
    from memopt.testing.graph_break import GraphBreak

    def run(budget):
        base = allocated()
        dy.seed(1)
        model = GraphBreak(256)
        opt = dy.optimizer.Adam(parameters=model.parameters())
        step = dy.jit.to_static(model)
        handle = memopt.memory_optimize(step, level=2, skip_grads=False, optimizer=opt,
                                        budget=budget, batch_size=1024) if budget else None
        x = dy.to_tensor(np.random.default_rng(0).standard_normal((1024, 256))
                         .astype("float32"))
        peaks = []
        try:
            for _ in range(4):
                reset_peak()
                _one_step(step, [x], opt)
                peaks.append(peak() - base)
        except memopt.BudgetError:
            handle.remove()
            raise
        return peaks[2:], handle

    default, _ = run(None)
    budget = int(1.25 * max(default))
    try:
        peaks, handle = run(budget)
    except memopt.BudgetError as exc:  # the subgraphs SOT makes vary: the least budget planned
        budget = exc.smallest_budget
        peaks, handle = run(budget)
    first, second = handle.records[:2]
    assert first.held > 0
    assert first.budget == budget - handle.outside_bytes
    assert second.budget == budget - handle.outside_bytes - first.held
    assert max(peaks) <= budget, (peaks, budget)
    handle.remove()
