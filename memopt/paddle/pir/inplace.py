"""Paddle's in-place op variants, and a model of its executor's in-place pass.

Many Paddle ops have an in-place variant named with a trailing underscore
(``pd_op.relu`` -> ``pd_op.relu_``) that writes a result over an operand;
which result over which operand is the variant's *in-place map*
(``{result slot: operand slot}``).  Paddle exposes the map only on a built
op, so :func:`inplace_maps` builds each variant once, in a throwaway clone
of the program, and caches the map per op name.

:func:`executor_inplace` predicts which ops Paddle 3's PIR executor runs in
place (its ``inplace_pass``, on by default): memory analysis needs it to
know which buffers the executor shares.
"""
from __future__ import annotations

import contextlib

import logging
from typing import Iterable

from .program import DATA_OPS, FETCH_OPS, PirGraph, all_ops

log = logging.getLogger(__name__)

__all__ = [
    "has_inplace_variant",
    "is_inplace_op",
    "is_top_level",
    "build_inplace",
    "static_mode",
    "inplace_map",
    "inplace_maps",
    "executor_inplace",
    "CPU_NO_INPLACE",
]

#: name -> {result slot: operand slot} of in-place variants, probed once per op name.
_INPLACE_MAPS: dict = {}

#: Ops whose result may differ in shape from the input they overwrite.
_RESHAPE_LIKE = ("pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze")
#: Ops for which the executor's pass compares element counts loosely.
_RELAXED_NUMEL = ("pd_op.reshape_grad", "pd_op.add_grad")
#: Ops the executor's pass never makes in-place on CPU (their CPU kernels
#: cannot write over an input, see Paddle's inplace_pass.cc).
CPU_NO_INPLACE = ("pd_op.add_grad", "pd_op.subtract_grad")
#: Ops with a registered ``name_`` that is not an in-place version of them.
_NOT_INPLACE_VARIANT = ("pd_op.transpose",)


def _ops_module():
    from paddle.base import core

    return core.pir.ops


def has_inplace_variant(op_name: str) -> bool:
    """Whether Paddle registers ``op_name + "_"`` (e.g. ``pd_op.relu_``)."""
    dialect, _, short = op_name.partition(".")
    return (dialect == "pd_op" and not short.endswith("_")
            and op_name not in _NOT_INPLACE_VARIANT
            and hasattr(_ops_module(), short + "_"))


def is_inplace_op(pir_op) -> bool:
    """Whether ``pir_op`` already writes over one of its operands (``sgd_``,
    ``batch_norm_``, an op a previous rewrite made in-place)."""
    from paddle.base import core

    return pir_op.name().endswith("_") and bool(core.pir.get_op_inplace_info(pir_op))


@contextlib.contextmanager
def static_mode():
    """Static mode for the duration (restored after).  Paddle's op builders
    make PIR ops only in static mode; a DistModel
    (``paddle.distributed.to_static``) hands its program over in dygraph
    mode, where they refuse a Value (``relu(): argument 'x' (position 0)
    must be Tensor, but got paddle.base.libpaddle.pir.Value``)."""
    import paddle

    dygraph = paddle.in_dynamic_mode()
    if dygraph:
        paddle.enable_static()
    try:
        yield
    finally:
        if dygraph:
            paddle.disable_static()


@contextlib.contextmanager
def insertion_point_kept():
    """Paddle's insertion point (where the user's next op goes) as it was,
    after the block runs.  Moving it to an op of a clone memopt drops and
    leaving it there made the user's next op land in freed memory: on a
    program rewritten inside its ``program_guard``, ``minimize(loss)``
    after ``memory_optimize`` (or ``memopt.analyze``) died with SIGSEGV."""
    import paddle

    saved = paddle.pir.get_current_insertion_point()
    try:
        yield
    finally:
        paddle.pir.set_insertion_point(saved)


def build_inplace(pir_op):
    """Insert ``pir_op``'s in-place variant right before it, with the same
    operands and attributes; return the new operation."""
    import paddle

    short = pir_op.name().partition(".")[2]
    attrs = pir_op.attrs()
    args = [pir_op.operand_source(i) for i in range(pir_op.num_operands())]
    args += [attrs[a] for a in pir_op.get_attr_names()]
    with static_mode(), insertion_point_kept():
        paddle.pir.set_insertion_point(pir_op)
        out = getattr(_ops_module(), short + "_")(*args)
    first = out[0] if isinstance(out, (list, tuple)) else out
    return first.get_defining_op()


def inplace_map(pir_op, program=None) -> dict:
    """``{result slot: operand slot}`` of the in-place variant of ``pir_op``'s
    type ({} when there is none or it cannot be built).

    An op that is already in-place answers its own map; otherwise the map
    probed for its op name (:func:`inplace_maps`) is used.
    """
    from paddle.base import core

    if is_inplace_op(pir_op):
        return dict(core.pir.get_op_inplace_info(pir_op))
    name = pir_op.name()
    if name not in _INPLACE_MAPS:
        inplace_maps(program or _program_of(pir_op), [pir_op])
    found = _INPLACE_MAPS.get(name, {})
    return {k: v for k, v in found.items()
            if v < pir_op.num_operands() and k < pir_op.num_results()}


def inplace_maps(program, pir_ops: Iterable) -> None:
    """Probe and cache the in-place maps of every op name among ``pir_ops``
    not probed yet: one clone of ``program``, one variant built per name
    (on the first op of that name), then the clone is dropped.  A variant
    whose builder wants other arguments (``full_``) gets the map {}."""
    from paddle.base import core

    wanted = {}
    for op in pir_ops:
        name = op.name()
        if name not in _INPLACE_MAPS and name not in wanted:
            if has_inplace_variant(name):
                wanted[name] = op
            else:
                _INPLACE_MAPS[name] = {}
    if not wanted:
        return
    flat = list(all_ops(program.global_block()))
    index = {op.id(): k for k, op in enumerate(flat)}
    clone = program.clone()  # keep a reference: its ops die with it
    scratch = list(all_ops(clone.global_block()))
    for name, op in wanted.items():
        k = index.get(op.id())
        if k is None or k >= len(scratch) or scratch[k].name() != name:
            continue  # not in this program: probe again with another op
        try:
            _INPLACE_MAPS[name] = dict(core.pir.get_op_inplace_info(build_inplace(scratch[k])))
        except Exception as exc:  # a variant whose builder needs other arguments
            log.debug("no usable in-place variant for %s: %s", name, exc)
            _INPLACE_MAPS[name] = {}


def _program_of(pir_op):
    block = pir_op.get_parent_block()
    while not (block.parent_op is None or block.parent_op.name() == "builtin.module"):
        block = block.parent_op.get_parent_block()
    return block.program


def is_top_level(pir_op) -> bool:
    """Whether ``pir_op`` sits in its program's global block (not in a region)."""
    parent = pir_op.get_parent_block().parent_op
    return parent is None or parent.name() == "builtin.module"


def _ids(values) -> set:
    """``Value.id`` of the non-null values among ``values``."""
    return {v.id for v in values if v.initialized()}


def _deletable(value) -> bool:
    """What Paddle's pass may free early: a non-persistable dense tensor
    (or selected rows)."""
    if value is None or not value.initialized():
        return False
    if not (value.is_dense_tensor_type() or value.is_selected_row_type()):
        return False
    try:
        return not value.persistable
    except Exception:  # pragma: no cover
        return True


def reads_shape_only(op, value) -> bool:
    """Whether ``op`` reads only ``value``'s shape, a no-need-buffer operand
    such as ``add_grad``'s ``x`` (False where Paddle has no yaml info for
    the op)."""
    try:
        return bool(op.is_no_need_buffer(value))
    except Exception:
        return False


def _numel_fits(value_in, value_out, relaxed: bool) -> bool:
    """The element-count test of Paddle's in-place pass (``-1`` allowed in
    dimension 0 of a tensor of rank 2 or more only, unless relaxed)."""
    def count(shape):
        total = 1
        for k, dim in enumerate(shape):
            if not relaxed and dim == -1 and (len(shape) == 1 or k != 0):
                return None
            total *= dim
        return total

    a, b = count(list(value_in.shape)), count(list(value_out.shape))
    return a is not None and b is not None and a == b


def executor_inplace(pg: PirGraph, fetch_list=(), device: str = "cpu",
                     blacklist: Iterable[str] = ()) -> list:
    """The ops Paddle's executor turns in-place when it runs the program.

    Paddle 3's PIR executor (``FLAGS_pir_apply_inplace_pass``, on by default)
    rewrites ops of the program's top-level block to their in-place variants
    where the input dies at the op; this predicts its choices by its rules
    (Paddle's ``inplace_pass.cc``): the variant must be registered, the input
    must be a deletable dense tensor whose last use in the block is this op
    (a later use of its shape alone, a no-need-buffer operand such as ``x``
    of ``add_grad``, does not count),
    not fed, fetched, persistable or used inside a control-flow region, and
    no value it shares memory with through earlier in-place ops (Paddle's
    ``inplace_map``, ``IsLastUser``) may be read later: an operand of an op
    already in place may be written over again once nothing reads it (Paddle
    3.3.1 turns ``scale(g)`` after ``scale_(g)`` or ``all_reduce_(g)`` in
    place; the model refused every operand of an in-place op and so counted
    each gradient twice in a data-parallel PIR program that scales its
    all-reduced gradients: 1.22 of the measured peak, GC off); dtypes and
    element counts must match.  Ops inside
    ``if``/``while`` regions are never rewritten by the executor.

    Returns ``[(position, input name, output name)]`` in program order, the
    position being the op's flat position in ``pg.graph``.
    """
    from paddle.base import core

    top = [(i, op) for i, op in enumerate(pg.ops) if op is not None and is_top_level(op)]
    if not top:
        return []
    program_block = top[0][1].get_parent_block()
    inplace_maps(program_block.program, [op for _, op in top])
    fetch_ids = {v.id for v in fetch_list if hasattr(v, "id")}
    fetch_ids |= {pg.values[n].id for n in pg.graph.fetch_names if n in pg.values}
    skip = set(fetch_ids)
    for _, op in top:
        name = op.name()
        if name in DATA_OPS or name == "pd_op.shadow_feed":
            skip.add(op.result(0).id)
        elif name in FETCH_OPS:
            skip.add(op.operand_source(0).id)
    last_op: dict = {}
    last_use: dict = {}  # any value's last reader (Paddle's use counts)
    order: dict = {}  # op id -> its place in the walk (nested ops after their parent)

    def scan(block) -> None:
        for op in block.ops:
            order[op.id()] = len(order)
            for v in op.operands_source():
                # a use of the shape alone (no-need-buffer) does not keep the
                # buffer: Paddle's pass skips it, as its GC does
                if v.initialized() and not reads_shape_only(op, v):
                    last_use[v.id] = op.id()
                    if v.id not in skip and _deletable(v):
                        last_op[v.id] = op.id()
            for v in op.results():
                if _deletable(v):
                    last_op[v.id] = op.id()
            for sub in op.blocks():
                scan(sub)

    scan(program_block)
    dies_at: dict = {}
    for vid, oid in last_op.items():
        dies_at.setdefault(oid, set()).add(vid)
    external = _ids(core.pir.get_used_external_value(program_block))
    for _, op in top:
        if op.num_regions():
            external |= _ids(core.pir.get_used_external_value(op))
    blacklist = set(blacklist)
    visited: set = set()
    # Paddle's inplace_map: an in-place result -> the operand it writes over
    # (ops already in place and the ones chosen here)
    source: dict = {}

    def last_user(vin, op) -> bool:
        """Paddle's ``IsLastUser``: nothing after ``op`` reads ``vin`` (the
        dying test) nor any value ``vin`` shares memory with through
        earlier in-place ops (fetched ones count as read at the end)."""
        here = order[op.id()]
        cur = source.get(vin.id)
        while cur is not None:
            if cur in skip or order.get(last_use.get(cur), -1) > here:
                return False
            cur = source.get(cur)
        return True

    chosen = []
    for position, op in top:
        name = op.name()
        operands = list(op.operands_source())
        results = list(op.results())
        visited |= _ids(operands)
        result_ids = _ids(results)
        if not name.startswith("pd_op.") or op.num_regions():
            visited |= result_ids
            continue
        if device == "cpu" and name in CPU_NO_INPLACE:
            visited |= result_ids
            continue
        if is_inplace_op(op):
            for out_slot, in_slot in inplace_map(op).items():
                if out_slot < len(results) and in_slot < len(operands) \
                        and results[out_slot].initialized() and operands[in_slot].initialized():
                    source[results[out_slot].id] = operands[in_slot].id
            visited |= result_ids
            continue
        dying = dies_at.get(op.id())
        if name in blacklist or not dying or not has_inplace_variant(name):
            visited |= result_ids
            continue
        pairs = inplace_map(op, program_block.program).items()
        ok = bool(pairs)
        for out_slot, in_slot in pairs:
            vin, vout = operands[in_slot], results[out_slot]
            if not _inplace_allowed(name, vin, vout, dying) or vout.id in visited \
                    or not _deletable(vout) or not last_user(vin, op) \
                    or vin.id in external or vout.id in external:
                ok = False
                break
        if ok:
            for out_slot, in_slot in pairs:
                vin, vout = operands[in_slot], results[out_slot]
                source[vout.id] = vin.id
                if vin.id in pg.name_of and vout.id in pg.name_of:
                    chosen.append((position, pg.name_of[vin.id], pg.name_of[vout.id]))
        visited |= result_ids
    return chosen


def _inplace_allowed(op_name: str, vin, vout, dying: set) -> bool:
    """``CanDoInplace`` of Paddle's pass: may ``vout`` be written over ``vin``
    (:func:`_static_allowed`, and ``vin`` dies at the op)?"""
    return _static_allowed(op_name, vin, vout) and vin.id in dying


def inplace_options(pg: PirGraph, device: str = "cpu") -> dict:
    """``{position: [(input name, output name)]}``: the pairs Paddle's
    in-place pass would take at each top-level op of ``pg`` if the inputs
    died there -- every test of :func:`executor_inplace` but those that
    depend on where values die or on other ops (see :func:`inplace_where`).
    Ops already in place and ops without a variant are left out."""
    top = [(i, op) for i, op in enumerate(pg.ops) if op is not None and is_top_level(op)]
    if not top:
        return {}
    program_block = top[0][1].get_parent_block()
    inplace_maps(program_block.program, [op for _, op in top])
    from paddle.base import core

    external = _ids(core.pir.get_used_external_value(program_block))
    out = {}
    for position, op in top:
        name = op.name()
        if not name.startswith("pd_op.") or op.num_regions() or is_inplace_op(op) \
                or (device == "cpu" and name in CPU_NO_INPLACE) or not has_inplace_variant(name):
            continue
        operands, results = list(op.operands_source()), list(op.results())
        pairs = []
        for out_slot, in_slot in inplace_map(op, program_block.program).items():
            vin, vout = operands[in_slot], results[out_slot]
            if not (_static_allowed(name, vin, vout) and _deletable(vout)
                    and vin.id not in external and vout.id not in external
                    and vin.id in pg.name_of and vout.id in pg.name_of):
                pairs = []
                break
            pairs.append((pg.name_of[vin.id], pg.name_of[vout.id]))
        if pairs:
            out[position] = pairs
    return out


def _static_allowed(op_name: str, vin, vout) -> bool:
    """The tests of Paddle's ``CanDoInplace`` that do not depend on where
    ``vin`` dies: both initialized; dense tensors of one dtype whose element
    counts fit (reshape-like ops: any count), or the same type."""
    if not vin.initialized() or not vout.initialized():
        return False
    if vin.is_dense_tensor_type() and vout.is_dense_tensor_type():
        if vin.dtype != vout.dtype:
            return False
        return op_name in _RESHAPE_LIKE or _numel_fits(vin, vout, op_name in _RELAXED_NUMEL)
    return str(vin.type()) == str(vout.type())


def inplace_where(graph, options: list) -> list:
    """``[(position, input, output)]``: the in-place pass of
    :func:`executor_inplace` run on ``graph`` (one flat block) given each
    op's possible pairs (``options[position]``, names of ``graph``; see
    :func:`inplace_options`): an op's pairs are taken, all or none, where
    each input's data is last read at that op, is no fed, fetched or
    persistable value, and no input or output was taken by an earlier
    pair or in-place op."""
    ops = graph.blocks[0].ops
    var = graph.blocks[0].vars
    fetched = set(graph.fetch_names)
    last: dict = {}
    for k, op in enumerate(ops):
        shape_only = set(op.facts.no_need_buffer)
        for n in op.reads:
            if n not in shape_only:
                last[n] = k
        for n in op.writes:
            last[n] = k
    reused_in, reused_out, chosen = set(), set(), []
    for k, op in enumerate(ops):
        if op.facts.overwrites or (op.type.startswith("pd_op.") and op.type.endswith("_")):
            reused_in.update(op.reads)
            reused_out.update(op.writes)
            continue
        pairs = options[k]
        if not pairs:
            continue
        ok = all(last.get(i) == k and i not in fetched and i not in reused_in
                 and o not in reused_out and i in var and not (
                     var[i].persistable or var[i].is_feed or var[i].is_data)
                 for i, o in pairs)
        if ok:
            for i, o in pairs:
                reused_in.add(i)
                reused_out.add(o)
                chosen.append((k, i, o))
    return chosen
