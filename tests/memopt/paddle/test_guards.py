"""memopt's guards on Paddle, put in by one call and taken out by one call
(:mod:`memopt.paddle.guards`).

Each check runs in a fresh process: taking the guards out changes Paddle's
functions for the whole process, which the other tests' processes must not
see.
"""
import subprocess
import sys
import textwrap


PRELUDE = """
import numpy as np
import paddle

paddle.enable_static()
import memopt
from memopt.errors import MergedVariableError
from memopt.paddle import guards
from memopt.testing import models


def current():
    return [getattr(guards._owner(m, o), n, None) for m, o, n in guards.WRAPPED]


def fetch_merged(model, report):
    '''Run one step of ``model`` fetching a variable ``report`` merged
    away: the error's class name, or "ran".'''
    exe = paddle.static.Executor(paddle.CPUPlace())
    with model.guard():
        model.initialize(exe)
        try:
            exe.run(model.main, feed=model.feed(np.random.default_rng(0)),
                    fetch_list=[report.reuses[0].var])
        except Exception as exc:  # what stops the fetch is the point
            return type(exc).__name__
    return "ran"


def optimized():
    model = models.build("mlp", "legacy")
    with model.guard():
        report = memopt.memory_optimize(model.main, level=1)
    assert report.reuses, "the MLP must have a merged variable to fetch"
    return model, report
"""


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_uninstall_gives_paddle_back_its_own_functions(paddle):
    """install() wraps all seven of Paddle's functions once (twice: the same
    wrappers); uninstall() puts back the very objects Paddle had."""
    assert run("""
        original = current()
        assert all(f is not None for f in original), original
        assert not guards.installed()
        guards.install()
        wrapped = current()
        guards.install()
        assert current() == wrapped  # idempotent: no wrapper around a wrapper
        assert all(w is not o for w, o in zip(wrapped, original, strict=True)), [
            guards.WRAPPED[k] for k, (w, o) in enumerate(zip(wrapped, original, strict=True))
            if w is o]
        assert guards.installed()
        guards.uninstall()
        assert all(f is o for f, o in zip(current(), original, strict=True))
        assert not guards.installed()
        guards.uninstall()  # nothing in: nothing changes
        assert all(f is o for f, o in zip(current(), original, strict=True))
        print("ok")
    """) == "ok"


def test_guards_check_while_in_and_not_once_taken_out(paddle):
    """A fetch of a merged variable raises MergedVariableError with the
    guards in, Paddle's own (a RuntimeError: the name is not in the scope)
    once they are out (and memopt's again
    after the next rewrite puts them back)."""
    assert run("""
        model, report = optimized()  # memory_optimize puts the legacy guards in
        assert guards.installed()
        guarded = fetch_merged(model, report)
        guards.uninstall()
        bare = fetch_merged(model, report)
        again, report_again = optimized()  # the next rewrite puts them back
        print(guarded, bare, guards.installed(), fetch_merged(again, report_again))
    """).split() == ["MergedVariableError", "RuntimeError", "True", "MergedVariableError"]
