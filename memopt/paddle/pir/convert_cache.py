"""Reading one PIR program state once per planning call.

``memory_optimize(level=2)`` and ``budget=`` read the program into a
:class:`memopt.paddle.pir.program.PirGraph` many times (the in-place rewrite, its
trial on a clone, the order's and the slices' checks, the reported peaks:
13 reads of a 12-layer BERT at level 2), most of them of a state an
earlier read already saw.  Inside :func:`shared`, :func:`memopt.paddle.pir.program.convert`
keeps what it read by the program's *state* and hands out a fresh copy of it
when the same state is read again.

The state is the program's ops in walk order (``Operation.id()``, unique
for the process's life: a moved, added, removed or replaced op changes it)
with each op's operands (``Value.id``: a redirected use changes it), the
regions nested in each op, and what the read was asked for (the fetch
list).  Within one planning call nothing else a read looks at changes (memopt's
own rewrites only add, erase, move and rewire ops; the attribute they set,
``memopt_inplace``, is not read); the cache lives for that call only, so a
program the user changes between calls is read afresh.

A copy shares nothing mutable with the kept read (callers set op facts,
``kept``, labels on what they get): new blocks, ops, op facts and attrs,
variables and the PirGraph's dicts; the PIR handles (``Operation``,
``Value``) are shared, as two reads of one state would give the same ones.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Callable, Optional

__all__ = ["shared", "cached", "state_key"]

#: How many reads one planning call keeps (a 24-layer BERT's read is a few MB).
KEEP = 8

_active: Optional["OrderedDict"] = None


@contextlib.contextmanager
def shared():
    """Within the block, reads of a program state already read are copies
    of the first read (nested blocks share the outermost cache)."""
    global _active
    if _active is not None:
        yield
        return
    _active = OrderedDict()
    try:
        yield
    finally:
        _active = None


def state_key(program, fetch_list) -> tuple:
    """What a read of ``program`` for ``fetch_list`` depends on that a
    planning call may change (see the module docstring)."""
    out: list = []

    def walk(block) -> None:
        for op in block.ops:
            out.append(op.id())
            for v in op.operands_source():
                out.append(v.id if v.initialized() else None)
            for sub in op.blocks():  # a container: always true, never test it
                out.append("{")
                walk(sub)
                out.append("}")
            out.append(";")

    walk(program.global_block())
    fetch = tuple(("value", v.id) if hasattr(v, "id") else ("name", v) for v in fetch_list)
    return fetch, tuple(out)


def cached(program, fetch_list: list, read: Callable[[], object]):
    """``read()`` (a :class:`memopt.paddle.pir.program.PirGraph` of ``program``), or a
    copy of the read of the same state made earlier inside :func:`shared`."""
    cache = _active
    if cache is None:
        return read()
    key = state_key(program, fetch_list)
    entry = cache.get(key)
    if entry is not None and entry[0] is program:
        cache.move_to_end(key)
        return _copy(entry[1])
    result = read()
    cache[key] = (program, _copy(result))
    while len(cache) > KEEP:
        cache.popitem(last=False)
    return result


def _shallow(obj):
    """A new object of ``obj``'s class with the same attributes (what
    ``copy.copy`` does for these plain dataclasses, several times faster)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _copy_op(op):
    new = _shallow(op)
    new.attrs = dict(op.attrs) if op.attrs is not None else None
    facts = new.facts = _shallow(op.facts)
    facts.dims_only = dict(facts.dims_only)
    return new


def _copy(pg):
    """A copy of the PirGraph ``pg`` that shares nothing mutable with it
    but the PIR handles."""
    new = _shallow(pg)
    graph = new.graph = _shallow(pg.graph)
    blocks = []
    for block in pg.graph.blocks:
        b = _shallow(block)
        b.ops = [_copy_op(op) for op in block.ops]
        b.vars = {name: _shallow(var) for name, var in block.vars.items()}
        blocks.append(b)
    graph.blocks = blocks
    new.ops = list(pg.ops)
    new.name_of = dict(pg.name_of)
    new.values = dict(pg.values)
    new.defining_op = dict(pg.defining_op)
    return new
