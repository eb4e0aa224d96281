"""allocation_strategy.optimize: exact maps for small programs, derived by hand.

Rules (module doc of autobatch.allocation_strategy): never read -> NULL; read
but never live across a block boundary or a call -> TEMPORARY; live across a
boundary or a call that cannot overwrite it -> REGISTER; live across a call
that may run the variable's own function again -> FULL.
"""
import numpy as np
import pytest

from autobatch import examples, reference
from autobatch.allocation_strategy import function_flow, optimize
from autobatch.dsl import ProgramBuilder
from autobatch.errors import ProgramError
from autobatch.instructions import VariableAllocation
from autobatch.virtual_machine import execute

NULL = VariableAllocation.NULL
TEMPORARY = VariableAllocation.TEMPORARY
REGISTER = VariableAllocation.REGISTER
FULL = VariableAllocation.FULL


def test_recursive_fib():
    program = optimize(examples.fibonacci())
    assert program.function("fib").var_alloc == {
        "n": FULL,          # read after the first recursive call (n - 2)
        "big": TEMPORARY,   # the condition: computed and branched on in one block
        "n1": TEMPORARY,    # argument, consumed by the call in its block
        "left": FULL,       # kept across the second recursive call
        "n2": TEMPORARY,
        "right": TEMPORARY,  # result used right after the call, same block
        "sum": TEMPORARY,
        "one": TEMPORARY,
    }
    assert program.pc_alloc is FULL  # return addresses need a stack


def test_collatz_loop_is_analysed_not_rejected():
    program = optimize(examples.collatz())
    assert program.function("collatz").var_alloc == {
        "n": REGISTER,           # carried around the back edge
        "steps": REGISTER,
        "loop1.cond": TEMPORARY,  # computed in the loop head, branched on there
        "even": TEMPORARY,
    }
    assert program.pc_alloc is REGISTER  # no calls at all


def test_a_condition_kept_across_blocks_is_a_register():
    ab = ProgramBuilder()
    with ab.function("countdown", params=["n"]):
        ab.primop(lambda n: n > 0, "more")
        with ab.while_("more"):          # tested at the loop head, set in the body
            ab.primop(lambda n: n - 1, "n")
            ab.primop(lambda n: n > 0, "more")
        ab.return_("n")
    alloc = optimize(ab.program("countdown")).function("countdown").var_alloc
    assert alloc == {"n": REGISTER, "more": REGISTER}


def test_tail_calls_need_no_stack():
    program = optimize(examples.even_odd(tail_calls=True))
    for name in ("is_even", "is_odd"):
        assert program.function(name).var_alloc == {
            "n": REGISTER,       # read after the branch, in another block
            "zero": TEMPORARY, "base": TEMPORARY, "m": TEMPORARY, "r": TEMPORARY,
        }
    assert program.pc_alloc is REGISTER


def test_mutual_recursion_with_work_after_the_call():
    program = optimize(examples.even_odd(tail_calls=False))
    for name in ("is_even", "is_odd"):
        assert program.function(name).var_alloc == {
            "n": REGISTER,
            "zero": FULL,        # live across a call that reaches this function again
            "base": TEMPORARY, "m": TEMPORARY, "r": TEMPORARY, "res": TEMPORARY,
        }
    assert program.pc_alloc is FULL


def _caller_of(helper_calls_main: bool):
    ab = ProgramBuilder()
    with ab.function("main", params=["x", "unused"]):
        ab.primop(lambda x: x * 2, "y")
        ab.primop(lambda x: x + 1, "dead")
        ab.call("helper", ["x"], "z")
        ab.primop(lambda y, z: y + z, "out")
        ab.return_("out")
    with ab.function("helper", params=["v"]):
        ab.primop(lambda v: v > 100, "stop")
        with ab.if_("stop"):
            ab.return_("v")
        ab.primop(lambda v: v * 3, "w")
        ab.call("main" if helper_calls_main else "helper", ["w", "w"][:1 + helper_calls_main],
                "r")
        ab.primop(lambda r: r + 1, "r1")
        ab.return_("r1")
    return ab.program("main")


def test_call_graph_refinement_keeps_values_across_non_recursive_calls_in_registers():
    program = optimize(_caller_of(helper_calls_main=False))
    assert program.function("main").var_alloc == {
        "x": REGISTER,    # a parameter: written by the caller, in another block
        "unused": NULL,   # never read
        "y": REGISTER,    # live across helper(), which never runs main again
        "dead": NULL,     # written, never read
        "z": TEMPORARY, "out": TEMPORARY,
    }
    helper = program.function("helper").var_alloc
    assert helper["v"] == REGISTER and helper["w"] == TEMPORARY
    assert program.pc_alloc is FULL


def test_values_across_a_call_that_can_come_back_are_full():
    program = optimize(_caller_of(helper_calls_main=True))
    assert program.function("main").var_alloc["y"] == FULL


def test_nuts_shaped_program():
    program = optimize(examples.nuts_shaped(*examples.nuts_problem(size=4)))
    assert program.function("nuts").var_alloc == {
        "x": REGISTER, "depth": REGISTER,      # tree() cannot run nuts() again
        "stop": TEMPORARY, "done": TEMPORARY,
    }
    assert program.function("tree").var_alloc == {
        "x": REGISTER, "depth": REGISTER,
        "is_leaf": TEMPORARY, "y": TEMPORARY, "stop": TEMPORARY,
        "sub": FULL,          # needed again after the first recursive call
        "first": REGISTER,    # a tuple; crosses the `if stop` branch, no call
        "z": TEMPORARY, "stop2": TEMPORARY,  # the second call is a tail call
    }


def test_reads_before_writes_are_rejected_with_the_variable_named():
    ab = ProgramBuilder()
    with ab.function("f", params=["x"]):
        ab.primop(lambda x: x > 0, "pos")
        with ab.if_("pos"):
            ab.const(1, "y")
        ab.return_("y")
    with pytest.raises(ProgramError, match="function 'f': variable 'y' may be read before"):
        optimize(ab.program("f"))


def test_liveness_comes_from_the_shared_core():
    flow = function_flow(examples.collatz().function("collatz"))
    head = flow.block_start["loop1.head"]
    assert flow.liveness.live_in(head) == {"n", "steps"}
    # and the input program is left unchanged
    program = examples.fibonacci()
    optimize(program)
    assert program.function("fib").var_alloc == {} and program.pc_alloc is None


@pytest.mark.parametrize("helper_calls_main", [False, True])
def test_programs_run_with_these_allocations_as_the_reference_says(helper_calls_main):
    program = _caller_of(helper_calls_main)
    x = np.array([1, 5, 40, 99, 101, 150])
    args = [x, np.zeros_like(x)]
    want = reference.run_batch(program, args, max_stack_depth=20)
    assert np.array_equal(execute(program, args, max_stack_depth=20), want)
