"""Programs written in TFP's IR the way TFP's own tests write them
(``test_programs.py`` of ``tfp.experimental.auto_batching``), built here with
autobatch's ``instructions`` module: hand-lowered graphs (per-variable
stacks, ``PushGotoOp``/``IndirectGotoOp``, pops) and call programs
(``FunctionCallOp``), with TFP's ``var_defs``."""
import numpy as np

from autobatch import instructions as inst

I64 = inst.single_type(np.int64, ())
BOOL = inst.single_type(np.bool_, ())


def constant_program():
    """The input goes to ``answer``; then answer = 1; answer = 2 (each write a
    push); returns 2."""
    block = inst.Block([inst.prim_op([], "answer", lambda: 1),
                        inst.prim_op([], "answer", lambda: 2)], inst.halt_op())
    return inst.Program(inst.ControlFlowGraph([block]), [], {"answer": I64},
                        ["answer"], "answer")


def single_if_program():
    """2 where input > 1, else 0."""
    entry, yes, no = inst.Block(), inst.Block(), inst.Block()
    entry.assign_instructions([inst.prim_op(["input"], "cond", lambda n: n > 1),
                               inst.BranchOp("cond", yes, no)])
    yes.assign_instructions([inst.prim_op([], "answer", lambda: 2), inst.halt_op()])
    no.assign_instructions([inst.prim_op([], "answer", lambda: 0), inst.halt_op()])
    return inst.Program(inst.ControlFlowGraph([entry, yes, no]), [],
                        {"input": I64, "cond": BOOL, "answer": I64}, ["input"], "answer")


def pattern_program():
    """Outputs taken apart by patterns; returns ((1, 3), 4, (5, 6))."""
    block = inst.Block([
        inst.prim_op([], ("one", ("five", "three")), lambda: (1, (2, 3))),
        inst.prim_op([], (("four", "five"), "six"), lambda: ((4, 5), 6)),
    ], inst.halt_op())
    return inst.Program(inst.ControlFlowGraph([block]), [],
                        {v: I64 for v in ("one", "three", "four", "five", "six")},
                        [], (("one", "three"), "four", ("five", "six")))


def pattern_variable_program():
    """A tuple-typed variable split into a scalar and a pair: returns
    (inp + 2, inp + 3)."""
    leaf = inst.TensorType(np.int64, ())
    block = inst.Block([
        inst.prim_op(["inp"], "many", lambda x: (x + 1, (x + 2, x + 3))),
        inst.prim_op(["many"], ["one", "two"], lambda x: x),
    ], inst.halt_op())
    var_defs = {"inp": inst.Type(leaf), "many": inst.Type((leaf, (leaf, leaf))),
                "one": inst.Type(leaf), "two": inst.Type((leaf, leaf))}
    return inst.Program(inst.ControlFlowGraph([block]), [], var_defs, ["inp"], "two")


def fibonacci_by_hand():
    """fib(n), fib(0) = fib(1) = 1, lowered by hand: the caller pushes the
    argument into ``n``, the callee pops what it is done with and leaves its
    result in ``ans``, return addresses on the program counter's stack."""
    entry, enter, recur1, recur2, recur3, finish = (
        inst.Block(name=name) for name in
        ("entry", "enter_fib", "recur1", "recur2", "recur3", "finish"))
    entry.assign_instructions([inst.PushGotoOp(inst.halt(), enter)])
    enter.assign_instructions([inst.prim_op(["n"], "cond", lambda n: n > 1),
                               inst.BranchOp("cond", recur1, finish)])
    recur1.assign_instructions([
        inst.PopOp(["cond"]),
        inst.prim_op(["n"], "nm1", lambda n: n - 1),
        inst.push_op(["nm1"], ["n"]),             # argument of the first call
        inst.PopOp(["nm1"]),
        inst.PushGotoOp(recur2, enter),
    ])
    recur2.assign_instructions([
        inst.push_op(["ans"], ["fibm1"]),
        inst.PopOp(["ans"]),
        inst.prim_op(["n"], "nm2", lambda n: n - 2),
        inst.PopOp(["n"]),
        inst.push_op(["nm2"], ["n"]),             # argument of the second call
        inst.PopOp(["nm2"]),
        inst.PushGotoOp(recur3, enter),
    ])
    recur3.assign_instructions([
        inst.push_op(["ans"], ["fibm2"]),
        inst.PopOp(["ans"]),
        inst.prim_op(["fibm1", "fibm2"], "ans", lambda a, b: a + b),
        inst.PopOp(["fibm1", "fibm2"]),
        inst.IndirectGotoOp(),
    ])
    finish.assign_instructions([
        inst.PopOp(["n", "cond"]),
        inst.prim_op([], "ans", lambda: 1),
        inst.IndirectGotoOp(),
    ])
    var_defs = {v: I64 for v in ("n", "nm1", "fibm1", "nm2", "fibm2", "ans")}
    var_defs["cond"] = BOOL
    graph = inst.ControlFlowGraph([entry, enter, recur1, recur2, recur3, finish])
    return inst.Program(graph, [], var_defs, ["n"], "ans")


def fibonacci_calls(dtype=np.int64):
    """fib(n) again, with FunctionCallOp (TFP's ``fibonacci_function_calls``)."""
    enter, recur, finish = (inst.Block(name=n) for n in ("enter_fib", "recur", "finish"))
    fib = inst.Function(None, ["n"], "ans", lambda types: types[0], name="fibonacci")
    enter.assign_instructions([inst.prim_op(["n"], "cond", lambda n: n > 1),
                               inst.BranchOp("cond", recur, finish)])
    recur.assign_instructions([
        inst.prim_op(["n"], "nm1", lambda n: n - 1),
        inst.FunctionCallOp(fib, ["nm1"], "fibm1"),
        inst.prim_op(["n"], "nm2", lambda n: n - 2),
        inst.FunctionCallOp(fib, ["nm2"], "fibm2"),
        inst.prim_op(["fibm1", "fibm2"], "ans", lambda a, b: a + b),
        inst.halt_op(),
    ])
    finish.assign_instructions([inst.prim_op([], "ans", lambda: 1), inst.halt_op()])
    fib.graph = inst.ControlFlowGraph([enter, recur, finish])
    main = inst.ControlFlowGraph([inst.Block([inst.FunctionCallOp(fib, ["n1"], "ans")],
                                             inst.halt_op(), name="main_entry")])
    typ = inst.single_type(dtype, ())
    var_defs = {v: typ for v in ("n", "n1", "nm1", "fibm1", "nm2", "fibm2", "ans")}
    var_defs["cond"] = BOOL
    return inst.Program(main, [fib], var_defs, ["n1"], "ans")


def is_even_calls(dtype=np.int64):
    """is_even(n) by mutual recursion of is_even and is_odd, with TFP's
    "done with" pops in the function bodies."""
    def pred_type(types):
        return inst.TensorType(np.bool_, types[0].shape)
    is_odd = inst.Function(None, ["n"], "ans", pred_type, name="is_odd")
    is_even = inst.Function(None, ["n"], "ans", pred_type, name="is_even")

    def body(answer, other):
        enter, done, recur = inst.Block(), inst.Block(), inst.Block()
        enter.assign_instructions([inst.prim_op(["n"], "cond", lambda n: n < 1),
                                   inst.BranchOp("cond", done, recur)])
        done.assign_instructions([inst.PopOp(["n", "cond"]),
                                  inst.prim_op([], "ans", lambda: answer), inst.halt_op()])
        recur.assign_instructions([
            inst.PopOp(["cond"]),
            inst.prim_op(["n"], "nm1", lambda n: n - 1),
            inst.PopOp(["n"]),
            inst.FunctionCallOp(other, ["nm1"], "ans"),
            inst.PopOp(["nm1"]),
            inst.halt_op(),
        ])
        return inst.ControlFlowGraph([enter, done, recur])

    is_even.graph = body(True, is_odd)
    is_odd.graph = body(False, is_even)
    main = inst.ControlFlowGraph([inst.Block([inst.FunctionCallOp(is_even, ["n1"], "ans")],
                                             inst.halt_op())])
    typ = inst.single_type(dtype, ())
    var_defs = {"n": typ, "n1": typ, "nm1": typ, "cond": BOOL, "ans": BOOL}
    return inst.Program(main, [is_even, is_odd], var_defs, ["n1"], "ans")


def pea_nuts_by_hand(latent_shape, choose_depth, step_state):
    """TFP's NUTS-shaped benchmark program, lowered by hand:

        while count > 0:
            count -= 1
            state = recur(choose_depth(count), state)

        recur(depth, state) = step_state(state) if depth <= 0 else
                              recur(depth - 1, recur(depth - 1, state) + 1) + 1
    """
    (entry, top, finish_top, enter, recur1, recur2, recur3, base) = (
        inst.Block() for _ in range(8))
    entry.assign_instructions([inst.prim_op(["count"], "cond", lambda c: c > 0),
                               inst.BranchOp("cond", top, inst.halt())])
    top.assign_instructions([
        inst.PopOp(["cond"]),
        inst.prim_op(["count"], "ctm1", lambda c: c - 1),
        inst.PopOp(["count"]),
        inst.push_op(["ctm1"], ["count"]),
        inst.PopOp(["ctm1"]),
        inst.prim_op(["count"], "depth", choose_depth),
        inst.push_op(["depth", "state"], ["depth", "state"]),   # the call's arguments
        inst.PopOp(["depth", "state"]),
        inst.PushGotoOp(finish_top, enter),
    ])
    finish_top.assign_instructions([inst.push_op(["ans"], ["state"]), inst.PopOp(["ans"]),
                                    inst.GotoOp(entry)])
    enter.assign_instructions([inst.prim_op(["depth"], "cond1", lambda d: d > 0),
                               inst.BranchOp("cond1", recur1, base)])
    recur1.assign_instructions([
        inst.PopOp(["cond1"]),
        inst.prim_op(["depth"], "dm1", lambda d: d - 1),
        inst.PopOp(["depth"]),
        inst.push_op(["dm1", "state"], ["depth", "state"]),
        inst.PopOp(["state"]),
        inst.PushGotoOp(recur2, enter),
    ])
    recur2.assign_instructions([
        inst.push_op(["ans"], ["state1"]),
        inst.PopOp(["ans"]),
        inst.prim_op(["state1"], "state2", lambda s: s + 1),
        inst.PopOp(["state1"]),
        inst.push_op(["dm1", "state2"], ["depth", "state"]),
        inst.PopOp(["dm1", "state2"]),
        inst.PushGotoOp(recur3, enter),
    ])
    recur3.assign_instructions([
        inst.push_op(["ans"], ["state3"]),
        inst.PopOp(["ans"]),
        inst.prim_op(["state3"], "ans", lambda s: s + 1),
        inst.PopOp(["state3"]),
        inst.IndirectGotoOp(),
    ])
    base.assign_instructions([
        inst.PopOp(["cond1", "depth"]),
        inst.prim_op(["state"], "ans", step_state),
        inst.PopOp(["state"]),
        inst.IndirectGotoOp(),
    ])
    latent = inst.single_type(np.float32, latent_shape)
    var_defs = {"count": I64, "ctm1": I64, "depth": I64, "dm1": I64,
                "cond": BOOL, "cond1": BOOL}
    var_defs.update({v: latent for v in ("state", "state1", "state2", "state3", "ans")})
    graph = inst.ControlFlowGraph([entry, top, finish_top, enter, recur1, recur2, recur3, base])
    return inst.Program(graph, [], var_defs, ["count", "state"], "state")


def fib(n):
    return 1 if n <= 1 else fib(n - 1) + fib(n - 2)


def pea_nuts_reference(count, depth, state, step_state):
    """What :func:`pea_nuts_by_hand` computes for one example, in Python."""
    def recur(d, s):
        if d <= 0:
            return step_state(s)
        return recur(d - 1, recur(d - 1, s) + 1) + 1
    for _ in range(count):
        state = recur(depth, state)
    return state
