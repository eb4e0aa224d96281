"""Every TFP-style user program of ``tests/autobatch/user_programs.py`` in
every regime on autobatch, against a plain Python loop over the batch
members.

The cells are tests of ``test_sweep_autobatch_user.py``, program x column
(``--worker PROGRAM`` prints one JSON object): a regime's cell is ``ok``
(equal to the loop: ints and bools exactly, floats to 0 ulp where the
program's ops are elementwise, ``allclose`` where it reduces), ``ok, bug
fixed in <hash>``, ``clean refusal`` (an autobatch error naming the problem
before anything runs), ``WRONG`` (a silent wrong result) or ``raw <Error>``
(an exception that is not autobatch's); ``overflow_tf_eager`` /
``overflow_tf_xla`` (``max_stack_depth=1``: the overflow error, or ``fits``
when the program's calls are tail calls and need no stack) in eager TF and
in the user's ``tf.function(jit_compile=True)``; ``dry_run`` (member 0
through ``dry_run=True`` on NumPy).  TFP 0.25 on the same user code is
benchmarks/bench_autobatch_peers.py's business (its own venv).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests", "autobatch")
REGIMES = ("numpy", "tf_eager", "tf_function", "tf_function_no_autograph", "tf_xla",
           "tf1_session")

#: (program, regime) -> the commit that fixed what running it found (a raw
#: error before: TensorFlow's, or AutoGraph's StagingError).
FIXED = {("and_or_calls_prime", r): "c0dc99d" for r in ("tf_eager", "tf1_session")}
FIXED.update({("divisors_literal_arg_i32", r): "96b2004"
              for r in ("tf_eager", "tf_function", "tf_function_no_autograph", "tf_xla",
                        "tf1_session")})


def _autobatch_error_in(message: str):
    """The autobatch error class an exception's message carries (AutoGraph
    wraps an error raised inside the user's ``tf.function`` in a StagingError
    holding its text), or None."""
    import autobatch.errors as errors
    names = [n for n in dir(errors) if n.endswith("Error")]
    for name in names:
        if f"{name}:" in message or f"{name}(" in message:
            return name
    return None


def run_side(side: str, names, regimes, batch: int) -> dict:
    """Every (program, regime) on one side: ``{"name|regime": [status, values]}``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, TESTS)
    import numpy as np
    import user_programs as up
    if side == "tfp":
        from tensorflow_probability.python.experimental import auto_batching as ab
    else:
        import autobatch as ab
    out = {}

    def record(key, thunk):
        record_one(key, thunk)
        if side == "tfp":      # one line per result, so a run cut short keeps the rest
            print(json.dumps({key: out[key]}), flush=True)

    def record_one(key, thunk):
        try:
            out[key] = ["ran", [np.asarray(g).tolist() for g in thunk()]]
        except Exception as exc:  # classified by the parent
            module = type(exc).__module__.split(".")[0]
            message = str(exc).replace("\n", " ")
            ours = _autobatch_error_in(message) if side == "autobatch" and module != "autobatch" \
                else None
            name = f"autobatch.{ours}" if ours else f"{module}.{type(exc).__name__}"
            out[key] = ["error", f"{name}: {message[:160]}"]
    for name in names:
        program = up.PROGRAMS[name]
        for regime in regimes:
            record(f"{name}|{regime}", lambda: up.run(ab, program, regime, batch))
        for regime in ("tf_eager", "tf_xla"):
            record(f"{name}|overflow_{regime}",
                   lambda: up.run(ab, program, regime, batch, max_stack_depth=1))

        def dry():
            ctx, entry = program.build(ab, up.ops("numpy"))
            def first(x):
                return tuple(first(y) for y in x) if isinstance(x, tuple) else x[:1]
            member = [first(x) for x in program.inputs(batch)]
            leaves = [np.asarray(v) for v in up._leaves(entry(*member, dry_run=True,
                                                                backend=ab.NumpyBackend()))]
            return [v.reshape((1,) + v.shape) if v.ndim == 0 else v for v in leaves]
        record(f"{name}|dry_run", dry)
    return out


def classify(result, want, exact, fixed=None) -> str:
    import numpy as np
    import user_programs as up
    status, value = result
    if status == "error":
        if value.startswith(("hangs", "not run")):
            return value.split(":")[0]
        if value.startswith("autobatch."):
            cell = f"clean refusal ({value.split(':')[0].split('.')[-1]})"
            return cell + (f", was a raw error before {fixed}" if fixed else "")
        return f"raw {value.split(':')[0].split('.')[-1]}"
    got = [np.asarray(v) for v in value]
    if up.agree(got, want, exact):
        return f"ok, bug fixed in {fixed}" if fixed else "ok"
    return "WRONG"


def overflow_cell(result, want, exact) -> str:
    """What a run with ``max_stack_depth=1`` did."""
    import numpy as np
    import user_programs as up
    status, value = result
    if status == "error":
        if value.startswith("hangs"):
            return "hangs"
        if any(sign in value for sign in ("StackOverflow", "assert_less",
                                          "Condition x < y did not hold")):  # TFP's
            return "overflow error"
        if value.startswith("autobatch."):
            return "clean refusal"
        return "fails"
    fits = up.agree([np.asarray(v) for v in value], want, exact)
    return "fits (tail calls)" if fits else "silent WRONG"


def program_cells(name: str, batch: int) -> dict:
    """Every cell of program ``name`` on autobatch, in this process:
    ``{regime: cell, "overflow_tf_eager": cell, "overflow_tf_xla": cell,
    "dry_run": cell}``."""
    sys.path.insert(0, TESTS)
    import user_programs as up
    program = up.PROGRAMS[name]
    ours = run_side("autobatch", [name], REGIMES, batch)
    want = up.expected(program, batch)
    out = {regime: classify(ours[f"{name}|{regime}"], want, program.exact,
                            FIXED.get((name, regime))) for regime in REGIMES}
    for regime in ("tf_eager", "tf_xla"):
        out[f"overflow_{regime}"] = overflow_cell(ours[f"{name}|overflow_{regime}"], want,
                                                  program.exact)
    out["dry_run"] = classify(ours[f"{name}|dry_run"], [w[:1] for w in want], program.exact)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", required=True, metavar="PROGRAM")
    parser.add_argument("--batch", type=int, default=9)
    args = parser.parse_args()
    print(json.dumps(program_cells(args.worker, args.batch)))


if __name__ == "__main__":
    main()
