"""Reference training runs, bit-identity checks and a small saved model
the Paddle tests share.

:func:`reference` runs a model of :mod:`memopt.testing.models` unoptimized for
:data:`STEPS` steps, once per test session (the GC mode does not change the
numbers); :func:`assert_same` demands every fetched array of every step and
every parameter afterwards to be bit-identical (``np.array_equal``).
:func:`train_steps` / :func:`assert_same_steps` do the same for a program a
test builds itself, :func:`save_legacy_cnn` saves a small legacy inference
model.
"""
import contextlib

import numpy as np

from memopt.testing import models

STEPS = 3

_REFERENCE = {}


def reference(name: str) -> models.RunResult:
    """:data:`STEPS` unoptimized steps of legacy model ``name`` (cached)."""
    if name not in _REFERENCE:
        _REFERENCE[name] = models.run_steps(models.build(name, "legacy"), STEPS)
    return _REFERENCE[name]


def assert_same(expected: models.RunResult, actual: models.RunResult) -> None:
    """Every fetch of every step and every final parameter bit-identical."""
    assert len(expected.fetches) == len(actual.fetches)
    for step, (want, got) in enumerate(zip(expected.fetches, actual.fetches, strict=True)):
        for k, (a, b) in enumerate(zip(want, got, strict=True)):
            assert np.array_equal(a, b), f"step {step}, fetch {k} differs"
    assert len(expected.params) == len(actual.params) > 0
    for k, (a, b) in enumerate(zip(expected.params, actual.params, strict=True)):
        assert np.array_equal(a, b), f"parameter {k} differs after {len(actual.fetches)} steps"


@contextlib.contextmanager
def after_one_step(model):
    """Run ``model``'s startup program and one training step in a fresh
    scope; yield ``run(fetch_list)``, which runs the next step there."""
    import paddle

    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    with paddle.static.scope_guard(scope), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        exe.run(model.main, feed=model.feed(rng), fetch_list=[model.loss])
        yield lambda fetch_list: exe.run(model.main, feed=model.feed(rng),
                                         fetch_list=fetch_list)


def startup_persistables(startup) -> list:
    """The names a PIR startup program sets, sorted: its parameters
    (``builtin.set_parameter``) and the optimizer state it makes
    (``builtin.shadow_output``) -- what a bit-identity check reads back
    from the scope after the steps."""
    names = set()
    for op in startup.global_block().ops:
        if op.name() == "builtin.set_parameter":
            names.add(op.attrs()["parameter_name"])
        elif op.name() == "builtin.shadow_output":
            names.add(op.attrs()["output_name"])
    return sorted(names)


def train_steps(paddle, main, startup, fetch, feed, persistables=None, steps: int = STEPS):
    """``steps`` steps of a static program from seeded parameters and data
    in a fresh scope: ``([fetches per step], {persistable name: array})``.
    ``feed(rng)`` gives each step's feed; ``persistables``: the names to
    read back (default :func:`startup_persistables`, a PIR startup's)."""
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    outs = []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(1)
        exe.run(startup)
        for _ in range(steps):
            outs.append([np.array(a) for a in exe.run(main, feed=feed(rng), fetch_list=fetch)])
        names = startup_persistables(startup) if persistables is None else persistables
        params = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
    return outs, params


def assert_same_steps(want, got, context="") -> None:
    """Two :func:`train_steps` results bit-identical: every fetch of every
    step (dtype too) and every persistable read back (``context`` names the
    configuration in a failure)."""
    for step, (xs, ys) in enumerate(zip(want[0], got[0], strict=True)):
        for k, (a, b) in enumerate(zip(xs, ys, strict=True)):
            assert a.dtype == b.dtype and np.array_equal(a, b), \
                f"{context} step {step} fetch {k} differs"
    assert sorted(want[1]) == sorted(got[1]) and want[1]
    for name, a in want[1].items():
        assert np.array_equal(a, got[1][name]), f"{context} {name} differs after the steps"


def save_legacy_cnn(paddle, prefix):
    """A legacy conv-relu x2 / flatten / fc classifier (build inside
    ``OldIrGuard``), its startup run in the current scope, saved as an
    inference model at ``prefix``; returns the Executor."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 3, 8, 8], "float32")
        h = paddle.nn.functional.relu(paddle.static.nn.conv2d(x, 4, 3))
        h = paddle.nn.functional.relu(paddle.static.nn.conv2d(h, 4, 3))
        out = paddle.static.nn.fc(paddle.flatten(h, 1), 2)
    exe = paddle.static.Executor(paddle.CPUPlace())
    paddle.seed(3)
    exe.run(startup)
    paddle.static.save_inference_model(prefix, [x], [out], exe, program=main)
    return exe
