"""TFP-style user programs autobatch had not seen (``user_programs.py``),
each against a plain Python loop over its members: on NumPy, on TensorFlow
in the regimes where running them found bugs, with their storage checked
against what liveness implies (``allocation_check.py``), and where TFP's
venv is there, against TFP 0.25 running the same user code.
``tests/sweeps/test_sweep_autobatch_user.py`` runs every program in every regime."""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import need_file

import autobatch
import allocation_check
import user_programs as up

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TFP_PYTHON = os.environ.get("AUTOBATCH_TFP_PYTHON",
                            os.path.join(ROOT, ".tfp-venv", "bin", "python"))
BATCH = 9


@pytest.mark.parametrize("name", sorted(up.PROGRAMS))
def test_numpy_matches_a_python_loop(name):
    program = up.PROGRAMS[name]
    got = up.run(autobatch, program, "numpy", BATCH)
    want = up.expected(program, BATCH)
    assert up.agree(got, want, program.exact), (got, want)


@pytest.mark.parametrize("name, dtypes", [("float16_int8_tuple", ["float16", "int8"]),
                                           ("divmod_int32_tuple", ["int32", "int32"]),
                                           ("for_break_f32", ["float32"])])
def test_small_dtypes_stay_what_the_inputs_are(name, dtypes):
    got = up.run(autobatch, up.PROGRAMS[name], "numpy", BATCH)
    assert [g.dtype.name for g in got] == dtypes


@pytest.mark.parametrize("name", sorted(up.PROGRAMS))
def test_storage_is_what_liveness_implies(name):
    """No variable weaker than its liveness needs (a value lost across a
    call), none stronger (a stack where none is needed)."""
    program = up.PROGRAMS[name]
    ctx, entry = program.build(autobatch, up.ops("numpy"))
    backend = autobatch.NumpyBackend()
    sig = autobatch.type_inference.signature(ctx.program(entry.__name__),
                                             list(program.inputs(4)), backend)
    compiled = ctx.program_compiled(entry.__name__, sig, backend)
    assert allocation_check.differences(compiled) == []


def test_the_storage_check_sees_a_weakened_variable():
    program = up.PROGRAMS["nuts_tree_b4"]
    ctx, entry = program.build(autobatch, up.ops("numpy"))
    backend = autobatch.NumpyBackend()
    sig = autobatch.type_inference.signature(ctx.program("build_tree"),
                                             list(program.inputs(4)), backend)
    compiled = ctx.program_compiled("build_tree", sig, backend)
    fn = compiled.functions[0]
    assert fn.var_alloc["depth"] is autobatch.VariableAllocation.FULL
    fn.var_alloc["depth"] = autobatch.VariableAllocation.REGISTER
    assert allocation_check.differences(compiled) == [
        "BUG: build_tree.depth is REGISTER, liveness needs FULL"]


def test_a_literal_argument_meets_tensorflow_modulo_in_type_inference(tf):
    """``has_divisor(n, 2)`` makes ``d`` a weak int; type inference ran ``n %
    d`` on a placeholder 0 for it, which TensorFlow refuses (integer
    division by zero) where NumPy warns: the program could not run on
    TensorFlow at all.  Its placeholders are ones now, as TFP's."""
    program = up.PROGRAMS["and_or_calls_prime"]
    got = up.run(autobatch, program, "tf_eager", BATCH)
    assert up.agree(got, up.expected(program, BATCH))


def test_tfp_runs_the_same_user_code_to_the_same_results(tf):
    """TFP 0.25, on the programs its frontend accepts and its NumPy backend
    runs (its masked NumPy updates do not broadcast vector variables, so
    programs with [batch, k] state fail there: TFP's own limit)."""
    need_file(TFP_PYTHON, "TFP 0.25's venv (make tfp; CI builds it)")
    names = ["mutual_parity", "collatz_recursive", "divmod_int32_tuple", "newton_sqrt_f64",
             "bisection_f64", "nested_tuple_rotate"]
    script = ("import json, os, sys\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
              f"sys.path.insert(0, {HERE!r})\n"
              "from tensorflow_probability.python.experimental import auto_batching as ab\n"
              "import user_programs as up\n"
              f"print(json.dumps({{n: [g.tolist() for g in up.run(ab, up.PROGRAMS[n], "
              f"'numpy', {BATCH})] for n in {names!r}}}))\n")
    done = subprocess.run([TFP_PYTHON, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for name in names:
        ours = [g.tolist() for g in up.run(autobatch, up.PROGRAMS[name], "numpy", BATCH)]
        assert ours == theirs[name], name


def test_a_counter_typed_only_by_constants_takes_its_partners_dtype(tf):
    """``count_from(n, 1)`` with an int32 ``n``: ``d`` is only ever given
    Python constants, so it was stored as int64, and ``d > n`` mixed int64
    with int32, which TensorFlow refuses: TensorFlow's TypeError from the
    middle of the run (eager, in tf.function and in a TF1 Session).  On
    TensorFlow such a variable now takes the dtype of what a primop
    combines it with (int32 here, as TFP types the constant); NumPy, which
    promotes, keeps int64."""
    program = up.PROGRAMS["divisors_literal_arg_i32"]
    got = up.run(autobatch, program, "tf_eager", 6)
    assert got[0].dtype == np.int32 and up.agree(got, up.expected(program, 6))


def _scaled_by_counter(ab):
    ctx = ab.Context()

    @ctx.batch(type_inference=lambda arg_types: arg_types[0])
    def scale(x):
        i = 0
        while i < 3:
            x = x * i + x
            i += 1
        return x
    return scale


def test_a_constants_only_variable_no_partner_fits_is_refused_before_the_run(tf):
    """``x * i`` with a float32 ``x`` and ``i`` only ever given ints: no
    int partner to take a dtype from, so ``i`` is int64 and TensorFlow
    refuses the op; type inference says so, naming ``i``, before the run
    (NumPy promotes and runs it)."""
    scale = _scaled_by_counter(autobatch)
    assert scale(np.ones(2, np.float32)).tolist() == [6.0, 6.0]
    with pytest.raises(autobatch.errors.TypeInferenceError,
                       match=r"x \* i \+ x.*'i' is only ever given Python constants"):
        scale(tf.ones([2], tf.float32))


def test_an_error_inside_the_users_tf_function_keeps_its_class(tf):
    """AutoGraph re-raises an error from inside a ``tf.function`` as its own
    class only where the class takes ``Exception.__init__``; autobatch's
    (TypeError's and ValueError's subclasses) came out as ``StagingError``,
    so ``except TypeError`` / ``except ValueError`` (what TFP users catch)
    missed them."""
    scale = _scaled_by_counter(autobatch)
    run = tf.function(lambda x: scale(x))
    with pytest.raises(autobatch.errors.TypeInferenceError, match="only ever given"):
        run(tf.ones([2], tf.float32))
