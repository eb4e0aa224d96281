"""PIR programs rewritten: ops turned into their in-place variants.

On PIR, values are SSA and Paddle's executor already frees each one after
its last use (GC on) and already runs some ops of the top-level block in
place (its in-place pass).  What is left to do soundly is to turn ops into
their in-place variants wherever the input dies at the op: inside ``if``/``while`` regions (the executor's pass
never touches them), where that pass is off, with GC off, and for shapes
the pass refuses (a ``-1`` past the first dimension).

This adapter states what the core's planner needs
(:func:`state_inplace_facts`: each op's in-place variant, views); the core
decides (:func:`memopt.candidates.variant_inplace`); the plan is pure data and is made in full before the program is touched;
:func:`apply_inplace` then rewrites all or nothing.  A replaced op's result
Values are new objects: the old Python ``Value`` objects are dead (touch
them only to fetch them).  ``Executor.run`` is wrapped so that fetching an
old one fetches its replacement, and fetching a Value an in-place op now
overwrites raises :class:`~memopt.errors.MergedVariableError`.

Which Values are overwritten is read from the program itself, not from a
record on the Python object: every op this rewrite makes in place carries
the string attribute :data:`MARK_ATTR` (the overwritten operands' names),
which ``Program.clone()`` keeps, so a clone refuses the same fetches
(:func:`overwritten_by`).  Paddle's JSON serializer keeps only the
attributes an op's YAML declares, so a saved ``.json`` program loses the
mark: :func:`check_save` refuses, at save time, an inference model whose
fetch targets an in-place op writes over.
"""
from __future__ import annotations

import logging

from ..errors import PlanError
from ..graph import InplaceVariant
from .pir import PirGraph, is_pir_program
from .pir_inplace import (CPU_NO_INPLACE, build_inplace,
                          has_inplace_variant, inplace_map, inplace_maps, is_inplace_op)

log = logging.getLogger(__name__)

__all__ = [
    "state_inplace_facts",
    "apply_inplace",
    "resolve_fetch_list",
    "install_fetch_guard",
    "record_rewrite",
]

#: Ops whose result may be a view of an operand: never overwrite such a result
#: in place (the viewed tensor may still be live).
_VIEW_OPS = frozenset({
    "pd_op.split", "pd_op.split_with_num", "pd_op.slice", "pd_op.strided_slice",
    "pd_op.transpose", "pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze",
    "pd_op.flatten", "pd_op.view_dtype", "pd_op.view_shape", "pd_op.as_strided",
    "pd_op.unbind", "pd_op.diagonal", "pd_op.expand", "pd_op.share_data",
    "pd_op.assign", "builtin.split", "builtin.slice", "pd_op.while", "pd_op.if"})

#: The program attribute recording a rewrite: {"replaced": {old value id: new
#: Value}} (old Python Values of this process only; read by the fetch guard).
RECORD_ATTR = "_memopt_pir_rewrites"

#: The op attribute marking an op memory_optimize made in place: the names
#: of the operands it writes over, comma-separated.
MARK_ATTR = "memopt_inplace"


def state_inplace_facts(pg: PirGraph, device: str = "cpu") -> None:
    """State, on the ops of ``pg.graph``, what the core's in-place planner
    (:func:`memopt.candidates.variant_inplace`) needs from Paddle.

    Every op gets ``facts.view`` (its result may be a view of an operand:
    :data:`_VIEW_OPS`).  An op Paddle registers an in-place variant for
    (``name_``) and that is not in place already gets ``facts.variant``: the
    variant's ``(input, output, repeated)`` pairs in slot order (None where a
    value is null or unnamed; ``repeated`` where another operand reads the
    input too) and ``kernel_refuses`` for the ops whose CPU kernel cannot run
    in place (:data:`CPU_NO_INPLACE`, on ``device == "cpu"``).  Probes each
    op name's variant once (:func:`inplace_maps`).
    """
    graph_ops = [op for _, op in pg.graph.walk_ops()]
    inplace_maps(pg.program, [op for op in pg.ops if op is not None])
    for op, pir_op in zip(graph_ops, pg.ops):
        op.facts.view = op.type in _VIEW_OPS
        if pir_op is None or not has_inplace_variant(op.type) or is_inplace_op(pir_op):
            continue
        refuses = device == "cpu" and op.type in CPU_NO_INPLACE
        pairs = []
        if not refuses:
            operands = list(pir_op.operands_source())
            results = list(pir_op.results())
            for out_slot, in_slot in sorted(inplace_map(pir_op, pg.program).items()):
                vin, vout = operands[in_slot], results[out_slot]
                if not (vin.initialized() and vout.initialized()) \
                        or vin.id not in pg.name_of or vout.id not in pg.name_of:
                    pairs.append(None)
                    continue
                repeated = sum(1 for v in operands if v.initialized() and v.id == vin.id) != 1
                pairs.append((pg.name_of[vin.id], pg.name_of[vout.id], repeated))
        op.facts.variant = InplaceVariant(tuple(pairs), refuses)


def apply_inplace(pg: PirGraph, rewrites) -> dict:
    """Turn each planned op into its in-place variant, all or nothing.

    Every new op is built first, right before its original (which keeps its
    uses); if any build fails, the new ops are erased and the program is as
    it was.  Then each original's uses move to the new op and it is erased.
    Returns ``{old result Value id: new result Value}``.
    """
    built = []
    try:
        for rw in rewrites:
            old = pg.ops[rw.position]
            new = build_inplace(old)
            if new.name() != old.name() + "_" or new.num_results() != old.num_results() \
                    or [str(r.type()) for r in new.results()] != \
                    [str(r.type()) for r in old.results()]:
                new.erase()
                raise PlanError(f"the in-place variant of {old.name()} does not "
                                "match the op it replaces")
            built.append((old, new))
    except Exception:
        for _, new in built:
            new.erase()
        raise
    replaced = {}
    for (old, new), rw in zip(built, rewrites):
        new.set_str_attr(MARK_ATTR, ",".join(nin for nin, _ in rw.pairs))
        for a, b in zip(old.results(), new.results()):
            if a.initialized():
                replaced[a.id] = b
        old.replace_all_uses_with(new.results())
        old.erase()
    return replaced


def record_rewrite(program, replaced: dict) -> None:
    """Remember which old Python Values the rewrite replaced (the guard swaps
    them for their replacements when fetched); what in-place ops now write
    over is marked on the ops themselves (:data:`MARK_ATTR`)."""
    entry = getattr(program, RECORD_ATTR, None) or {"replaced": {}}
    entry["replaced"].update(replaced)
    setattr(program, RECORD_ATTR, entry)
    install_fetch_guard()


def overwritten_by(value):
    """``(op, names)`` of an op memory_optimize made in place that writes
    over ``value`` (read from the ops using it: survives ``clone()``), or
    None."""
    from paddle.base import core

    try:
        users = value.all_used_ops()
    except Exception:  # not a Value of a live program
        return None
    vid = value.id
    for op in users:
        if not op.has_attr(MARK_ATTR):
            continue
        for _, operand in dict(core.pir.get_op_inplace_info(op)).items():
            if operand < op.num_operands() and op.operand_source(operand).id == vid:
                return op, op.attrs()[MARK_ATTR]
    return None


def _overwritten_error(value, found):
    from ..errors import MergedVariableError

    op, names = found
    try:
        from .pir import value_label

        name = value_label(value)  # as the user knows it: 'my_sum' (%7), ...
    except Exception:
        name = names.split(",")[0] if names else "the Value"
    return MergedVariableError(
        f"cannot fetch {name}: memopt.memory_optimize made {op.name()} write over it in "
        "place, so after the run it holds another value. Rebuild the program and pass "
        "the Value in fetch_list (or skip_opt_set) to memory_optimize to keep it")


def resolve_fetch_list(program, fetch_list):
    """``fetch_list`` with Values replaced by memory_optimize swapped for their
    replacements; raises :class:`MergedVariableError` for a Value an in-place
    op memory_optimize made now overwrites (fetching it would return another
    value's data) -- in the rewritten program and in its clones."""
    if fetch_list is None:
        return fetch_list
    entry = getattr(program, RECORD_ATTR, None) or {"replaced": {}}
    single = not isinstance(fetch_list, (list, tuple))
    items = [fetch_list] if single else list(fetch_list)
    out = []
    for item in items:
        vid = getattr(item, "id", None) if not isinstance(item, str) else None
        if isinstance(vid, str):
            item = entry["replaced"].get(vid, item)
            found = overwritten_by(item)
            if found is not None:
                raise _overwritten_error(item, found)
        out.append(item)
    return out[0] if single else type(fetch_list)(out)


def check_save(fetch_vars) -> None:
    """Raise :class:`MergedVariableError` if a Value of ``fetch_vars`` (an
    inference model's fetch targets) is written over by an op
    memory_optimize made in place: the saved ``.json`` would fetch another
    value's data, and it cannot carry the mark that says so."""
    items = fetch_vars if isinstance(fetch_vars, (list, tuple)) else [fetch_vars]
    for item in items:
        if hasattr(item, "all_used_ops"):
            found = overwritten_by(item)
            if found is not None:
                raise _overwritten_error(item, found)


def _fetch_hook(program, fetch_list):
    """The fetch guard's hook (:mod:`memopt.paddle.fetch_guard`)."""
    if is_pir_program(program):
        return resolve_fetch_list(program, fetch_list)
    return fetch_list


def install_fetch_guard() -> None:
    """Route fetches of rewritten PIR programs through
    :func:`resolve_fetch_list` (one ``Executor.run`` wrapper, shared with the
    legacy adapter)."""
    from .fetch_guard import add_hook

    add_hook(_fetch_hook)
    from .fetch_guard import add_save_hook

    add_save_hook(check_save)


def check_user_names(pg: PirGraph, options) -> None:
    """ValueError (program untouched) for ``skip_opt_set`` / ``fetch_list``
    names the program has no value of (:func:`memopt.names.check_known`)."""
    from ..names import check_known

    known = set(pg.values)
    check_known(options.skip_opt_set, known, "skip_opt_set")
    check_known(options.fetch_list, known, "fetch_list")
