"""namedtuples as values, as in TFP: built in a batched function, returned,
passed as arguments, read by ``.field``, chosen by a conditional
expression; type inference keeps their class, and every engine and backend
gives them back."""
import collections

import numpy as np
import pytest

import autobatch
from conftest import need
from autobatch.instructions import TensorType, Type
from autobatch.type_inference import merge_types

Point = collections.namedtuple("Point", ["x", "y"])
Pair = collections.namedtuple("Pair", ["x", "y"])

ctx = autobatch.Context()


@ctx.batch()
def swap(n):
    p = Point(n, n * 2)
    if n > 1:
        q = Point(p.y, p.x + 1)
    else:
        q = p
    return q


@ctx.batch()
def total(n):
    q = swap(n)                      # a call returning a namedtuple (the VM)
    r = q if q.x > 2 else Point(q.y, q.x)
    return r.x * 10 + r.y


@ctx.batch()
def norm(p):
    return p.x * p.x + p.y


def swap_python(n):
    return Point(2 * n, n + 1) if n > 1 else Point(n, 2 * n)


def total_python(n):
    q = swap_python(n)
    r = q if q.x > 2 else Point(q.y, q.x)
    return r.x * 10 + r.y


N = np.arange(5)


def _check_swap(out):
    assert type(out) is Point
    assert np.asarray(out.x).tolist() == [swap_python(n).x for n in N]
    assert np.asarray(out.y).tolist() == [swap_python(n).y for n in N]


def test_built_returned_and_read_by_field_numpy():
    _check_swap(swap(N))                                  # fused loop engine
    _check_swap(swap(N, stackless=True))
    assert total(N).tolist() == [total_python(n) for n in N]
    assert total(N, stackless=True).tolist() == [total_python(n) for n in N]
    assert norm(Point(np.arange(3), np.ones(3))).tolist() == [1.0, 2.0, 5.0]
    _check_swap(swap.per_example(N))
    assert swap(np.array([2]), dry_run=True) == Point(4, 3)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_namedtuples_on_tensorflow(tf, mode):
    backend = autobatch.TensorFlowBackend(mode)
    _check_swap(swap(N, backend=backend))
    assert np.asarray(total(N, backend=backend)).tolist() == [total_python(n) for n in N]


def test_namedtuples_on_jax():
    need("jax")
    _check_swap(swap(N, backend=autobatch.JaxBackend()))


def test_types_keep_the_class():
    i = TensorType(np.int64, ())
    point, plain = Type(Point(i, i)), Type((i, i))
    assert point != plain
    assert type(merge_types(point, point, "p").tensors) is Point
    with pytest.raises(TypeError, match="Point.*Pair"):
        merge_types(point, Type(Pair(i, i)), "p")
    assert str(point) == "Point(int64[], int64[])"


Rec = collections.namedtuple("Rec", ["a", "b"])


def bump(rec):
    """A plain helper (a primop): namedtuple in, namedtuple out."""
    return Rec(rec.a + 1, rec.b * 2)


def twice(rec):
    first = bump(rec)
    return bump(first)


def outer(rec):
    once = twice(rec)
    return twice(once)


def test_namedtuples_conserved_through_primops_calls_and_declared_types():
    ctx = autobatch.Context()
    same = lambda types: types[0]          # a namedtuple of TensorTypes
    ctx.batch_uncurried(twice, same)
    batched = ctx.batch_uncurried(outer, same)
    got = batched(Rec(np.array([1, 2, 3]), np.array([1.0, 0.5, -1.0])),
                  max_stack_depth=15, backend=autobatch.NumpyBackend())
    assert type(got) is Rec
    assert got.a.tolist() == [5, 6, 7] and got.b.tolist() == [16.0, 8.0, -16.0]
