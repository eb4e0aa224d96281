"""The TFP-style user code of ``tfp_user_code.py`` on autobatch's modules,
each check against the result TFP 0.25 gives for the same code; and, where
TFP's venv is there (``make tfp`` builds ``.tfp-venv``; or set
``AUTOBATCH_TFP_PYTHON``), the same code run on TFP itself, compared whole.
Also the package surface a TFP user imports (``autobatch.xla``...), and the
errors of the new entry points."""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import need_file

import autobatch
from autobatch.errors import ProgramError
import tfp_user_code as user

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TFP_PYTHON = os.environ.get("AUTOBATCH_TFP_PYTHON",
                            os.path.join(ROOT, ".tfp-venv", "bin", "python"))


def test_package_has_tfp_submodules_and_names():
    for name in ("allocation_strategy", "dsl", "frontend", "instructions", "liveness",
                 "lowering", "numpy_backend", "stack_optimization", "stackless",
                 "type_inference", "virtual_machine", "xla"):
        module = getattr(autobatch, name)
        assert module.__name__ == f"autobatch.{name}"
    assert autobatch.truthy is autobatch.frontend.truthy
    assert autobatch.numpy_backend.NumpyBackend is autobatch.NumpyBackend


def test_liveness_analysis_matches_tfp():
    assert user.liveness_of_if(autobatch) == {
        "entry": [["input"], [["cond", "input"]], ["input"]],
        "yes": [["input"], [["answer"]], ["answer"]],
        "no": [[], [["answer"]], ["answer"]],
        "exit": ["answer"]}


def test_liveness_analysis_solves_loops_and_refuses_lowered_jumps():
    inst = autobatch.instructions
    head, body = inst.Block(name="head"), inst.Block(name="body")
    head.assign_instructions([inst.prim_op(["i"], "more", lambda i: i > 0),
                              inst.BranchOp("more", body, None)])
    body.assign_instructions([inst.prim_op(["i", "acc"], "acc", lambda i, a: a + i),
                              inst.prim_op(["i"], "i", lambda i: i - 1), inst.GotoOp(head)])
    info = autobatch.liveness.liveness_analysis(inst.ControlFlowGraph([head, body]), ["acc"])
    assert info[head].live_into_block == {"i", "acc"}        # carried around the loop
    assert info[body].live_out_instructions == [{"i", "acc"}, {"i", "acc"}]
    lowered = inst.Block(name="call")
    lowered.assign_instructions([inst.PushGotoOp(None, lowered)])
    with pytest.raises(ValueError, match="PushGotoOp"):
        autobatch.liveness.liveness_analysis(inst.ControlFlowGraph([lowered]), [])


def test_ir_field_names_match_tfp():
    assert user.ir_field_names(autobatch) == [
        "cond", "yes", "no", True, "yes", "entry", ["b"], ["input"], "answer",
        ["entry", "yes", "no"], True, "no"]
    inst = autobatch.instructions
    with pytest.raises(TypeError, match="cond_var"):
        inst.BranchOp(cond="c", cond_var="c", true_target="a", false_target="b")
    op = inst.PrimOp(["a"], "b", abs, None, "absolute")      # TFP's 4th: skip_push_mask
    assert op.skip_push_mask == frozenset() and op.name == "absolute"
    assert op.replace(vars_out="c").vars_out == "c"
    with pytest.raises(ValueError, match="Nothing to replace"):
        op.replace()
    assert inst.VariableAllocation("full") is inst.VariableAllocation.FULL
    assert inst.Block(name=None).label_str.startswith("block-")


def test_pattern_functions_match_tfp():
    assert user.patterns(autobatch) == [
        3, [["a", 1], ["b", 2], ["c", [3, 4]]], [11, [22, 33]], [True, [True, True]], True]
    with pytest.raises(ValueError, match="different structure"):
        autobatch.instructions.pattern_zip(("a", "b"), 1)


def test_detect_batch_size_matches_tfp():
    assert user.batch_sizes(autobatch) == [4, "ValueError"]


def test_inference_and_stackless_flags_match_tfp():
    assert user.machinery_flags(autobatch) == {
        "signature": [["int64", []]], "inference": [[True, False]],
        "stackless": [[False, True]], "result": [2, 4, 6], "outside": [False, False]}


def test_stackless_execute_refuses_extra_arguments_in_autobatch_order():
    program = user._call_program(autobatch.instructions, lambda: None)
    with pytest.raises(TypeError, match="block_code_cache"):
        autobatch.stackless.execute(program, [np.arange(3)], None, 5, "extra")


def test_signature_checks_the_number_of_inputs():
    program = user._call_program(autobatch.instructions, lambda: None)
    backend = autobatch.NumpyBackend()
    with pytest.raises(ProgramError, match="takes 1 input"):
        autobatch.type_inference.signature(program, [np.arange(3), np.arange(3)], backend)


def test_xla_compile_nested_output_matches_tfp(tf):
    assert user.xla_nested(autobatch) == [
        ["both", "sum"], [11.0, 22.0], "tuple", [2.0, 4.0], "list", [4.0, 3.0]]
    identity = autobatch.xla.compile_nested_output(lambda x: {"x": x})   # default compile_fn
    assert identity(tf.constant([1, 2]))["x"].numpy().tolist() == [1, 2]
    lazy = autobatch.xla.compile_nested_output(lambda x: x, lambda fn, inputs: [1])
    with pytest.raises(ValueError, match="compile_fn"):
        lazy(tf.constant(1))


CALL_PROGRAM_TEXT = """\
  __program_counter__ :: full, Type(tensors=TensorType(int32()))
  n :: full, Type(tensors=TensorType(int64()))
  out :: full, Type(tensors=TensorType(int64()))
  x :: full, Type(tensors=TensorType(int64()))
  y :: full, Type(tensors=TensorType(int64()))

  def twice(x):
    returns y
    twice_body:
      y = prim(x) by
        def double(x):
            record()
            return x + x
      return

  def main(n):
    returns out
    main_entry:
      out = call(
        twice, n)
      return"""


def test_programs_built_tfp_way_print_tfp_text():
    if_text, call_text, tuple_text, narrow = user.printed_programs(autobatch)
    assert narrow == CALL_PROGRAM_TEXT                       # as TFP 0.25 prints it
    assert call_text.startswith("__program_counter__ :: full") and call_text.endswith(
        "def main(n):\n  returns out\n  main_entry:\n    out = call(twice, n)\n    return")
    assert "    branch(cond, yes, no)\n  yes:\n    answer = prim(input) by\n" in if_text
    assert "pair :: full, Type(tensors=(TensorType(float32(3,)), TensorType(float32(3,))))" \
        in tuple_text and "  returns pair, other_name\n  B0:\n" in tuple_text
    program = user._call_program(autobatch.instructions, lambda: None)
    assert program.format().startswith("program main=main")  # autobatch's own listing


def test_same_code_on_tfp_gives_the_same_results(tf):
    need_file(TFP_PYTHON, "TFP 0.25's venv (make tfp; CI builds it)")
    script = ("import json, os, sys\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
              f"sys.path.insert(0, {HERE!r})\n"
              "from tensorflow_probability.python.experimental import auto_batching as ab\n"
              "import tfp_user_code\n"
              "print(json.dumps({n: c(ab) for n, c in tfp_user_code.CHECKS.items()}))\n")
    done = subprocess.run([TFP_PYTHON, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = json.loads(json.dumps({n: c(autobatch) for n, c in user.CHECKS.items()}))
    assert ours == theirs


def test_builder_takes_tfp_argument_names_and_orders():
    from autobatch import dsl
    ab = dsl.ProgramBuilder()
    with ab.function("halve", lambda types: types[0]) as halve:   # TFP: (name, type_inference)
        ab.param("n")
        ab.var.big = ab.primop(lambda n: n > 10)
        with ab.if_(condition=ab.var.big):
            ab.var.n = ab.primop(lambda n: n // 2)
        ab.return_(vars_out=ab.var.n)
    program = ab.program(main=halve)
    out = autobatch.virtual_machine.execute(program, [np.array([4, 30])], 8,
                                            autobatch.NumpyBackend())
    assert out.tolist() == [4, 15]
    with pytest.raises(TypeError, match="params="):
        with dsl.ProgramBuilder().function("f", ["n"]):           # autobatch's params, by position
            pass
    with pytest.raises(TypeError, match="name="):
        autobatch.instructions.PrimOp(["a"], "b", abs, "absolute")


def test_tensorflow_backend_takes_tfp_arguments(tf):
    backend = autobatch.tf_backend.TensorFlowBackend(False, while_parallel_iterations=4)
    assert backend.safety_checks is False and backend.mode == "graph"
    with pytest.raises(ValueError, match="while_maximum_iterations"):
        autobatch.tf_backend.TensorFlowBackend(while_maximum_iterations=100)


def test_select_block_priority_moves_blocks_without_user_code_first():
    inst = autobatch.instructions
    entry, work, hop = inst.Block(name="entry"), inst.Block(name="work"), inst.Block(name="hop")
    entry.assign_instructions([inst.GotoOp(hop)])
    work.assign_instructions([inst.prim_op(["x"], "x", lambda x: x + 1), inst.IndirectGotoOp()])
    hop.assign_instructions([inst.PopOp([]), inst.PushGotoOp(None, work)])
    program = inst.Program(inst.ControlFlowGraph([entry, work, hop]), [],
                           {"x": inst.single_type(np.int64, ())}, ["x"], "x")
    ordered = autobatch.virtual_machine.select_block_priority(program)
    assert [b.name for b in ordered.graph.blocks] == ["entry", "hop", "work"]
    assert autobatch.virtual_machine.execute(ordered, [np.array([1, 5])], 4).tolist() == [2, 6]
    with pytest.raises(ValueError, match="one graph"):
        autobatch.virtual_machine.select_block_priority(
            user._call_program(inst, lambda: None))
