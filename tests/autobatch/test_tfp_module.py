"""TFP's ``instructions.Module`` and ``dsl.ProgramBuilder.module()`` on
autobatch's modules (TFP's ``program(main)`` is ``module().program(main)``):
functions built together, entered at any of them; ``Module.lookup``; a
Module of TFP's own Function objects; a bad entry named."""
import numpy as np
import pytest

import tfp_programs as tp
from autobatch import dsl, instructions as inst
from autobatch import virtual_machine as vm
from autobatch.backends.numpy import NumpyBackend
from autobatch.errors import ProgramError

NP = NumpyBackend()


def fib_and_double():
    ab = dsl.ProgramBuilder()
    with ab.function("fib", type_inference=lambda types: types[0]) as fib:
        ab.param("n")
        ab.var.cond = ab.primop(lambda n: n > 1)
        with ab.if_(ab.var.cond):
            ab.var.nm1 = ab.primop(lambda n: n - 1)
            ab.var.a = ab.call(fib, [ab.var.nm1])
            ab.var.nm2 = ab.primop(lambda n: n - 2)
            ab.var.b = ab.call(fib, [ab.var.nm2])
            ab.var.ans = ab.primop(lambda a, b: a + b)
        with ab.else_():
            ab.var.ans = ab.const(1)
        ab.return_(ab.var.ans)
    with ab.function("fib_twice") as twice:
        k = ab.param("k")
        ab.var.f = ab.call(fib, [k])
        ab.var.y = ab.primop(lambda f: 2 * f)
        ab.return_(ab.var.y)
    return ab, fib, twice


def test_builder_module_enters_at_any_function():
    ab, fib, twice = fib_and_double()
    module = ab.module()
    assert isinstance(module, inst.Module)
    assert [fn.name for fn in module.functions] == ["fib", "fib_twice"]
    assert module.lookup("fib").name == "fib" and module.lookup("missing") is None
    n = np.array([0, 3, 7])
    assert vm.execute(module.program(fib), [n], 15, NP).tolist() == [1, 3, 21]
    assert vm.execute(module.program("fib_twice"), [n], 15, NP).tolist() == [2, 6, 42]
    assert int(inst.interpret(module.program(twice), 6)) == 26
    # TFP's program(main) is module().program(main): the same results.
    assert vm.execute(ab.program("fib_twice"), [n], 15, NP).tolist() == [2, 6, 42]


def test_module_of_tfp_function_objects():
    program = tp.fibonacci_calls()
    fib = program.function("fibonacci")
    module = inst.Module([fib], {"n": tp.I64})
    entered = module.program(fib)
    assert entered.main == "fibonacci"
    assert vm.execute(entered, [np.array([5, 6])], 15, NP).tolist() == [8, 13]


def test_bad_module_use_is_named():
    ab, _, _ = fib_and_double()
    with pytest.raises(ProgramError, match=r"no function 'fob' \(functions: \['fib', "
                                           r"'fib_twice'\]\)"):
        ab.module().program("fob")
    builder = dsl.ProgramBuilder()
    with pytest.raises(ProgramError, match="module\\(\\) called inside function 'f'"):
        with builder.function("f"):
            builder.param("x")
            builder.module()
    declared = dsl.ProgramBuilder()
    g = declared.declare_function("g")
    with declared.function("h"):
        declared.param("x")
        declared.var.y = declared.call(g, ["x"])
        declared.return_(declared.var.y)
    with pytest.raises(ProgramError, match=r"\['g'\] declared and called but never defined"):
        declared.module()
