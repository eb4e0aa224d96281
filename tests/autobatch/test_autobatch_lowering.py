"""lowering.lower: calls become pushes, pops, copies and jumps."""
import numpy as np
import pytest

from autobatch import examples
from autobatch.dsl import ProgramBuilder
from autobatch.errors import ProgramError
from autobatch.instructions import (
    CopyOp, GotoOp, IndirectGotoOp, PopOp, PushGotoOp, PushOp, TensorType, VariableAllocation,
)
from autobatch.lowering import lower
from autobatch.virtual_machine import execute, prepare

INT = TensorType(np.int64)


def ops(block):
    return [str(op) for op in block.instructions] + [str(block.terminator)]


def test_fib_calls_save_exactly_the_full_variables_live_across_them():
    lowered = prepare(examples.fibonacci(), [INT])
    blocks = {b.name: b for b in lowered.blocks}
    assert list(blocks) == ["fib/entry", "fib/if1.then", "fib/if1.then.ret1",
                            "fib/if1.then.ret2", "fib/if1.else"]
    assert ops(blocks["fib/if1.then"]) == [
        "fib/n1 = primop(fib/n): n - 1",
        "push fib/n",
        "(fib/n,) = copy (fib/n1,)",
        "push-goto fib/if1.then.ret1, fib/entry"]
    assert ops(blocks["fib/if1.then.ret1"]) == [
        "pop fib/n",
        "fib/left = copy <ret:int64[]>",
        "fib/n2 = primop(fib/n): n - 2",
        "push fib/left",
        "(fib/n,) = copy (fib/n2,)",
        "push-goto fib/if1.then.ret2, fib/entry"]
    assert ops(blocks["fib/if1.then.ret2"])[:2] == ["pop fib/left",
                                                    "fib/right = copy <ret:int64[]>"]
    assert isinstance(blocks["fib/if1.else"].terminator, IndirectGotoOp)
    # what the VM must store after each block: the callee's parameter, the result
    assert lowered.live_out["fib/if1.then"] == {"fib/n"}
    assert lowered.live_out["fib/if1.then.ret2"] == {"<ret:int64[]>"}
    assert lowered.var_alloc["<ret:int64[]>"] is VariableAllocation.REGISTER
    assert lowered.callee == {"fib/if1.then": "fib", "fib/if1.then.ret1": "fib"}
    assert "[1] fib/if1.then:" in str(lowered)


def test_tail_calls_become_jumps():
    lowered = prepare(examples.even_odd(tail_calls=True), [INT])
    terminators = [b.terminator for b in lowered.blocks]
    assert not any(isinstance(t, PushGotoOp) for t in terminators)
    jumps = [b for b in lowered.blocks if isinstance(b.terminator, GotoOp)
             and b.terminator.target.endswith("/entry")]
    assert sorted(b.name for b in jumps) == ["is_even/if1.join", "is_odd/if1.join"]
    assert lowered.pc_alloc is VariableAllocation.REGISTER


def test_a_value_kept_across_two_calls_is_pushed_once():
    ab = ProgramBuilder()
    with ab.function("f", params=["n", "k"]):
        ab.primop(lambda n: n > 0, "more")
        with ab.if_("more"):
            ab.primop(lambda n: n - 1, "m")
            ab.call("f", ["m", "k"], "a")
            ab.call("f", ["m", "k"], "b")
            ab.primop(lambda a, b, k: a + b + k, "s")
            ab.return_("s")
        ab.return_("k")
    program = ab.program("f")
    lowered = prepare(program, [INT, INT])
    pushes = [op for b in lowered.blocks for op in b.instructions if isinstance(op, PushOp)]
    pops = [op for b in lowered.blocks for op in b.instructions if isinstance(op, PopOp)]
    # k and m are kept across both calls: pushed before the first only.
    assert [p.vars for p in pushes] == [("f/k", "f/m"), ("f/a",)]
    assert [p.vars for p in pops] == [("f/k", "f/m"), ("f/a", "f/k")]
    n = np.arange(7)
    want = [3]   # f(0, k) = k, f(n, k) = 2 f(n - 1, k) + k
    for _ in range(6):
        want.append(2 * want[-1] + 3)
    assert execute(program, [n, np.int64(3)]).tolist() == want


def test_continuations_copy_results_out_of_the_return_register():
    lowered = prepare(examples.nuts_shaped(*examples.nuts_problem(size=4)),
                      [TensorType(np.float64, (4,))])
    ret = lowered.blocks[lowered.block_index()["nuts/loop1.body.ret1"]].instructions[0]
    assert isinstance(ret, CopyOp)
    assert str(ret) == "(nuts/x, nuts/stop) = copy <ret:(float64[4], bool[])>"
    assert lowered.output == "<ret:(float64[4], int64[])>"


def test_lowering_needs_a_typed_allocated_program():
    with pytest.raises(ProgramError, match="optimize"):
        lower(examples.fibonacci())
