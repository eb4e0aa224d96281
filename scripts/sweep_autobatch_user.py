"""Every TFP-style user program of ``tests/autobatch/user_programs.py`` in
every regime, on autobatch and on TFP 0.25 (its own venv, a subprocess),
each against a plain Python loop over the batch members.

Usage::

    PYTHONPATH=. python scripts/sweep_autobatch_user.py [--batch 9]
        [--tfp-python .tfp-venv/bin/python] [--tfp-cache tfp.json]
        [--programs a,b] [--regimes numpy,tf_eager]

Prints a markdown table, program x regime: ``ok`` (equal to the loop: ints
and bools exactly, floats to 0 ulp where the program's ops are elementwise,
``allclose`` where it reduces), ``ok, bug fixed in <hash>``, ``clean refusal``
(an autobatch error naming the problem before anything runs), ``WRONG``
(a silent wrong result) or ``raw <Error>`` (an exception that is not
autobatch's), then ``/ TFP: ...`` for what TFP 0.25 does with the same
user code.  Extra columns: ``overflow`` (``max_stack_depth=1``: the error,
or ``fits`` when the program's calls are tail calls and need no stack) in
eager TF and in the user's ``tf.function(jit_compile=True)``; ``dry_run``
(member 0 through ``dry_run=True`` on NumPy).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _short(cell: str) -> str:
    return cell if cell in ("ok", "WRONG", "hangs", "not run") else "fails"


def run_tfp(python: str, names, regimes, batch: int, timeout: float) -> dict:
    """TFP's side, one process per program (``timeout`` seconds each): a
    run TFP's VM never finishes (an overflow under XLA, where its stack
    assertions are dropped, recurses forever) is ``hangs``."""
    theirs = {}
    for name in names:
        command = [python, os.path.abspath(__file__), "--side", "tfp", "--batch", str(batch),
                   "--programs", name, "--regimes", ",".join(regimes)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            output = done.stdout
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        for line in output.splitlines():
            if line.startswith("{"):
                theirs.update(json.loads(line))
        missing = [key for key in [f"{name}|{r}" for r in regimes] + [
            f"{name}|overflow_tf_eager", f"{name}|overflow_tf_xla", f"{name}|dry_run"]
            if key not in theirs]
        for k, key in enumerate(missing):    # the first one hung; the rest never ran
            theirs[key] = ["error", "hangs: no result within the timeout" if k == 0
                           else "not run: an earlier run of the program hung"]
    return theirs


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=9)
    parser.add_argument("--tfp-python", default=os.path.join(ROOT, ".tfp-venv", "bin", "python"))
    parser.add_argument("--programs", default="")
    parser.add_argument("--tfp-cache", default="",
                        help="a JSON file: TFP's results are read from it where it exists, "
                             "else written to it")
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--tfp-timeout", type=float, default=240,
                        help="seconds for TFP's runs of one program")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, TESTS)
    import user_programs as up
    names = args.programs.split(",") if args.programs else list(up.PROGRAMS)
    regimes = args.regimes.split(",")
    if args.side:
        done = run_side(args.side, names, regimes, args.batch)
        if args.side != "tfp":
            print(json.dumps(done))
        return
    theirs, tfp = {}, None
    if args.tfp_cache and os.path.exists(args.tfp_cache):
        with open(args.tfp_cache) as f:
            theirs = json.load(f)
    elif os.path.exists(args.tfp_python):   # TFP runs beside autobatch's side
        tfp = threading.Thread(target=lambda: theirs.update(
            run_tfp(args.tfp_python, names, regimes, args.batch, args.tfp_timeout)))
        tfp.start()
    ours = run_side("autobatch", names, regimes, args.batch)
    if tfp is not None:
        tfp.join()
        if args.tfp_cache:
            with open(args.tfp_cache, "w") as f:
                json.dump(theirs, f)
    print("| program | " + " | ".join(regimes) + " | overflow eager | overflow in jit_compile"
          " | dry_run |")
    print("|---" * (len(regimes) + 4) + "|")
    for name in names:
        program = up.PROGRAMS[name]
        want = up.expected(program, args.batch)
        cells = []
        for regime in regimes:
            key = f"{name}|{regime}"
            cell = classify(ours[key], want, program.exact, FIXED.get((name, regime)))
            if key in theirs:
                tfp = classify(theirs[key], want, program.exact)
                cell += " / TFP: " + _short(tfp)
            cells.append(cell)
        for regime in ("tf_eager", "tf_xla"):
            cell = overflow_cell(ours[f"{name}|overflow_{regime}"], want, program.exact)
            tfp = theirs.get(f"{name}|overflow_{regime}")
            if tfp is not None:
                cell += " / TFP: " + overflow_cell(tfp, want, program.exact)
            cells.append(cell)
        first = [w[:1] for w in want]
        cell = classify(ours[f"{name}|dry_run"], first, program.exact)
        if f"{name}|dry_run" in theirs:
            tfp = classify(theirs[f"{name}|dry_run"], first, program.exact)
            cell += " / TFP: " + _short(tfp)
        cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
