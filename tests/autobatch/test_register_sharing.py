"""Projection primops and shared registers: the VM moves a value only where
a primop computes it.

:mod:`autobatch.projection` recognizes primops that only pick tuple
components; :mod:`autobatch.register_sharing` lets copy-related REGISTER
leaves that never hold different live values share one array, so the
copies lowering makes (arguments, return values, tuples taken apart) need
no gather or scatter.  Results are checked against plain Python; the random
programs of ``test_autobatch_random`` stress the same machinery.
"""
import re

import numpy as np
import pytest

from autobatch import examples
from autobatch.backends.numpy import MaskedNumpyBackend, NumpyBackend
from autobatch.dsl import ProgramBuilder
from autobatch.projection import Pick, apply, projection
from autobatch.virtual_machine import VirtualMachine, argument_types, execute, prepare

K = 3


@pytest.mark.parametrize("function, n_args, recipe", [
    (lambda first: first[1], 1, Pick(0, (1,))),
    (lambda pair: (pair[1], pair[0]), 1, (Pick(0, (1,)), Pick(0, (0,)))),
    (lambda x: x, 1, Pick(0)),
    (lambda a, b: (b, a[0][1]), 2, (Pick(1), Pick(0, (0, 1)))),
    (lambda x: x[-1], 1, Pick(0, (-1,))),
])
def test_projection_recognizes_picks(function, n_args, recipe):
    assert projection(function, n_args) == recipe


@pytest.mark.parametrize("function, n_args", [
    (lambda pair: (pair[1], pair[0] % pair[1]), 1),   # arithmetic
    (lambda x: x[1:], 1),                              # a slice
    (lambda x: x[K], 1),                               # a global index
    (lambda x: x[True], 1),                            # not an int constant
    (lambda s, d: s | d, 2),
    (lambda x: np.negative(x), 1),                     # a call
    (np.add, 2),                                       # not Python code
    (lambda x: x, 2),                                  # argument count differs
    (lambda *x: x, 1),
])
def test_projection_refuses_everything_else(function, n_args):
    assert projection(function, n_args) is None


def test_apply_refuses_indexing_a_leaf():
    """``x[0]`` of an array value is array indexing, not a projection."""
    assert apply(Pick(0, (1,)), [("t1", "t2")]) == "t2"
    assert apply(Pick(0, (0,)), ["t1"]) is None
    assert apply(Pick(0, (2,)), [("t1", "t2")]) is None


def _vm(program, args):
    lowered = prepare(program, argument_types(args, NumpyBackend()), NumpyBackend())
    return VirtualMachine(lowered, NumpyBackend(), 8)


def _vector_moves(vm):
    """(block index, line) of every gather or scatter of a float64[256] leaf."""
    vector_keys = {key for var, keys in vm.register_keys.items()
                   for key, typ in zip(keys, vm.lowered.var_types[var].leaves(), strict=True) if typ.shape}
    moves = []
    for i in range(vm.halt):
        for line in vm.block_source(i).splitlines():
            keys = re.findall(r"B\.(?:read|write)\(state\[('[^']*')\]", line)
            if any(eval(k) in vector_keys for k in keys):
                moves.append((i, line.strip()))
    return moves


def test_nuts_shaped_moves_vectors_only_in_the_leaf():
    """x, the callee's x, the return register and the unpacked tuple are
    one array: the only vector gather and scatter are the leaf's own."""
    matrix, weights = examples.nuts_problem(16)
    x = np.random.default_rng(0).integers(0, 1009, (50, 16)).astype(np.float64)
    vm = _vm(examples.nuts_shaped(matrix, weights), [x])
    keys = {vm.register_keys[v][0] for v in ("nuts/x", "tree/x", "tree/first",
                                               "<ret:(float64[16], bool[])>")}
    assert len(keys) == 1
    leaf = vm.index["tree/if1.then"]
    moves = _vector_moves(vm)
    assert [i for i, _ in moves] == [leaf, leaf], moves
    got = vm.run([x])
    want = [examples.nuts_python(row, matrix, weights) for row in x]
    assert np.array_equal(got[0], np.stack([w[0] for w in want]))
    assert np.array_equal(got[1], [w[1] for w in want])


def _swapper():
    """Swaps a pair ``n`` times, then returns ``a - b``: a, b live at once
    with different values must never share an array."""
    ab = ProgramBuilder()
    with ab.function("main", params=["a", "b", "n"]):
        with ab.while_(lambda n: n > 0):
            ab.primop(lambda a, b: (b, a), ("a", "b"))
            ab.primop(lambda n: n - 1, "n")
        ab.primop(lambda a, b: a - b, "d")
        ab.return_("d")
    return ab.program(main="main")


@pytest.mark.parametrize("backend", [NumpyBackend(native=False), MaskedNumpyBackend()])
def test_a_swap_keeps_both_values(backend):
    a, b, n = np.arange(10), np.arange(10) * 7 + 1, np.arange(10) % 3
    got = execute(_swapper(), [a, b, n], backend)
    want = np.where(n % 2 == 0, a - b, b - a)
    assert np.array_equal(got, want)
    vm = _vm(_swapper(), [a, b, n])
    assert vm.register_keys["main/a"] != vm.register_keys["main/b"]


def _copy_then_change():
    """``c = a`` (shares a's array only if they never differ while live),
    then ``a`` changes while ``c`` is still used."""
    ab = ProgramBuilder()
    with ab.function("main", params=["a"]):
        ab.primop(lambda a: a, "c")
        ab.primop(lambda a: a * 3, "a")
        ab.call("inc", ["a"], "b")
        ab.primop(lambda b, c: (b, c), "pair")
        ab.return_("pair")
    with ab.function("inc", params=["v"]):
        ab.primop(lambda v: v + 1, "w")
        ab.return_("w")
    return ab.program(main="main")


def test_a_copy_kept_while_its_source_changes():
    a = np.arange(12)
    got = execute(_copy_then_change(), [a], NumpyBackend(native=False))
    assert np.array_equal(got[0], a * 3 + 1) and np.array_equal(got[1], a)
    vm = _vm(_copy_then_change(), [a])
    assert vm.register_keys["main/c"] != vm.register_keys["main/a"]
