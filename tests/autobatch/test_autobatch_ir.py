"""The IR, the DSL and the one-example reference interpreter."""
import numpy as np
import pytest

from autobatch import examples, reference
from autobatch.dsl import ProgramBuilder
from autobatch.errors import ProgramError, StackOverflowError
from autobatch.instructions import (
    BranchOp, FunctionCallOp, GotoOp, PrimOp, ReturnOp, TensorType, Type,
    VariableAllocation, bind_pattern, pattern_leaves, pattern_unflatten,
)


def test_fib_builds_the_expected_blocks_and_prints_readably():
    program = examples.fibonacci()
    fib = program.function("fib")
    assert [b.name for b in fib.blocks] == ["entry", "if1.then", "if1.else"]
    assert isinstance(fib.entry.terminator, BranchOp)
    then = fib.block("if1.then")
    assert [type(op) for op in then.instructions] == [
        PrimOp, FunctionCallOp, PrimOp, FunctionCallOp, PrimOp]
    assert isinstance(then.terminator, ReturnOp)
    text = str(program)
    assert "big = primop(n): n > 1" in text
    assert "left = call fib(n1)" in text
    assert "branch big ? if1.then : if1.else" in text
    assert fib.callees() == ["fib"]
    assert fib.variables() == ["n", "big", "n1", "left", "n2", "right", "sum", "one"]


def test_while_loop_has_a_head_that_tests_and_a_back_edge():
    collatz = examples.collatz().function("collatz")
    names = [b.name for b in collatz.blocks]
    assert names[:3] == ["entry", "loop1.head", "loop1.body"]
    head = collatz.block("loop1.head")
    assert isinstance(head.terminator, BranchOp)
    assert head.terminator.false_target == "loop1.exit"
    back = [b for b in collatz.blocks if isinstance(b.terminator, GotoOp)
            and b.terminator.target == "loop1.head"]
    assert len(back) == 2  # from the entry and from the end of the body


def test_unreachable_code_after_return_is_dropped():
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        ab.return_("x")
        ab.primop(lambda x: x + 1, "y")   # dead
        ab.return_("y")
    f = ab.program("f").function("f")
    assert [b.name for b in f.blocks] == ["entry"]


def test_break_and_continue_jump_to_exit_and_head():
    ab = ProgramBuilder()
    with ab.function("f", params=["n"]):
        with ab.loop():
            ab.primop(lambda n: n - 1, "n")
            ab.primop(lambda n: n > 5, "big")
            with ab.if_("big"):
                ab.continue_()
            ab.break_()
        ab.return_("n")
    program = ab.program("f")
    assert np.array_equal(reference.run_batch(program, [np.array([0, 3, 9])]), [-1, 2, 5])


def test_builder_misuse_raises_program_error_naming_the_problem():
    ab = ProgramBuilder()
    with pytest.raises(ProgramError, match="inside"):
        ab.primop(lambda: 1, "x")
    with pytest.raises(ProgramError, match="can reach its end without return_"):
        with ab.function("f", params=["x"]):
            ab.primop(lambda x: x, "y")
    with pytest.raises(ProgramError, match="else_"):
        with ab.function("g", params=["x"]):
            with ab.else_():
                pass
    with pytest.raises(ProgramError, match="outside a loop"):
        with ab.function("h", params=["x"]):
            ab.break_()
    ab2 = ProgramBuilder()
    with ab2.function("f", params=["x"]):
        ab2.call("missing", ["x"], "y")
        ab2.return_("y")
    with pytest.raises(ProgramError, match="unknown function 'missing'"):
        ab2.program("f")
    ab3 = ProgramBuilder()
    with ab3.function("f", params=["x"]):
        ab3.call("f", ["x", "x"], "y")
        ab3.return_("y")
    with pytest.raises(ProgramError, match="takes 1 argument"):
        ab3.program("f")


def test_patterns_bind_and_rebuild_nested_tuples():
    pairs = dict(bind_pattern(("a", ("b", "c")), (1, (2, 3))))
    assert pairs == {"a": 1, "b": 2, "c": 3}
    assert pattern_unflatten(("a", ("b", "c")), [7, 8, 9]) == (7, (8, 9))
    assert pattern_leaves(("a", ("b", "c"))) == ["a", "b", "c"]
    with pytest.raises(ProgramError, match="cannot unpack a 3-tuple"):
        list(bind_pattern(("a", "b"), (1, 2, 3), "here"))


def test_types_print_and_compare():
    t = Type((TensorType(np.float32, (3,)), TensorType("int64")))
    assert str(t) == "(float32[3], int64[])"
    assert t.leaves()[0].dtype == np.float32 and t.is_tuple
    assert str(TensorType(np.int64, (), weak=True)) == "~int64[]"
    assert VariableAllocation.NULL < VariableAllocation.TEMPORARY < \
        VariableAllocation.REGISTER < VariableAllocation.FULL


@pytest.mark.parametrize("n", [0, 1, 2, 7, 12])
def test_reference_fib_matches_python(n):
    assert int(reference.run(examples.fibonacci(), [np.int64(n)])) == examples.fib_python(n)


def test_reference_runs_tuple_programs_and_tail_calls_without_stack():
    a, steps = reference.run(examples.gcd_pairs(), [(np.int64(84), np.int64(36))])
    assert (int(a), int(steps)) == examples.gcd_python((84, 36))
    # 60 mutually tail-recursive calls fit in a stack of depth 1.
    assert bool(reference.run(examples.even_odd(True), [np.int64(60)], max_stack_depth=1))
    with pytest.raises(StackOverflowError, match="'is_even'.*max_stack_depth=5"):
        reference.run(examples.even_odd(False), [np.int64(60)], max_stack_depth=5)


def test_reference_reports_reads_before_writes():
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        ab.primop(lambda x, y: x + y, "z")
        ab.return_("z")
    with pytest.raises(ProgramError, match="'y' is read before it is written"):
        reference.run(ab.program("f"), [np.int64(-1)])


def test_the_dsl_module_example_runs():
    import textwrap

    import autobatch.dsl
    from autobatch.virtual_machine import execute
    doc = autobatch.dsl.__doc__
    code = textwrap.dedent(doc.split("::\n\n", 1)[1].split("\n\n", 1)[0])
    namespace = {"ProgramBuilder": ProgramBuilder}
    exec(code, namespace)
    got = execute(namespace["program"], [np.array([2, 3, 5, 7]), np.array([10, 3, 0, 1])])
    assert got.tolist() == [1024, 27, 1, 7]
