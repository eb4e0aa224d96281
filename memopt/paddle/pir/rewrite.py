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
attributes an op's YAML declares (and ``stop_gradient`` / ``persistable``),
so a saved ``.json`` program loses the mark.  The marks therefore also
travel as a *record* Paddle's writer and reader keep
(:func:`write_record`): a one-byte ``pd_op.full`` constant fed to a
``builtin.shadow_output`` whose declared ``output_name`` is
:data:`RECORD_PREFIX` followed by JSON ``[[path, op name, mark], ...]``
(``path`` the op's position: its index in the top-level block, then, for
an op in a region, the region's block index and its index there, joined
by ``.``).  Measured on Paddle 3.3.1: it survives ``clone()``,
``paddle.static.save`` / the ``.json`` reader, another process, and the
executor runs it (1 byte held in the scope).  :func:`restore_marks` puts
the marks back on the ops, checking each op's name at its position; the
fetch guard calls it, so a reloaded program refuses the same fetches.
``save_inference_model`` prunes the record op with everything its fetch
targets do not need: while it writes, the record of the pruned program is
written again (:func:`record_for_save`) -- after
:func:`memopt.paddle.pir.deploy.out_of_place` gave that program back the
ops as built, so the record is empty and the model holds none.  :func:`check_save` refuses an
inference model whose fetch targets an in-place op writes over.

Where memopt is not imported, nothing refuses such a fetch: a PIR Value has
no name the executor checks; ``Executor.run`` appends a ``pd_op.fetch`` of
the Value, which reads the variable the in-place op wrote.  No attribute,
op or type Paddle keeps in the ``.json`` makes Paddle's fetch check
anything, so there the record is read only by memopt.
"""
from __future__ import annotations

import logging

from ...errors import PlanError
from ...graph import InplaceVariant
from .program import PirGraph, is_pir_program, owning_program
from .later_ops import check_later_readers, live_ids
from .retired import redirect, retire
from .inplace import (CPU_NO_INPLACE, build_inplace, has_inplace_variant, inplace_map,
                          inplace_maps, insertion_point_kept, is_inplace_op)

log = logging.getLogger(__name__)

__all__ = [
    "state_inplace_facts",
    "apply_inplace",
    "resolve_fetch_list",
    "record_rewrite",
    "write_record",
    "restore_marks",
    "RECORD_PREFIX",
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


#: How the ``output_name`` of the record's ``builtin.shadow_output`` begins.
RECORD_PREFIX = "memopt@inplace:"


def _walk(block, path=()):
    """``(path, op)`` of every op of ``block`` and of its ops' regions, in
    text order; ``path`` is (index, block index, index, ...)."""
    for k, op in enumerate(block.ops):
        yield path + (k,), op
        if op.num_regions():
            for b, sub in enumerate(op.blocks()):
                yield from _walk(sub, path + (k, b))


def _path_text(path) -> str:
    return ".".join(str(i) for i in path)


def _record_ops(program) -> list:
    """The ``builtin.shadow_output`` ops of the top-level block carrying a
    record (normally one, the last op memory_optimize added)."""
    return [op for op in program.global_block().ops
            if op.name() == "builtin.shadow_output"
            and str(op.attrs().get("output_name", "")).startswith(RECORD_PREFIX)]


def _entries(program) -> list:
    """``[[path, op name, mark], ...]`` of the ops carrying :data:`MARK_ATTR`."""
    return [[_path_text(path), op.name(), op.attrs()[MARK_ATTR]]
            for path, op in _walk(program.global_block()) if op.has_attr(MARK_ATTR)]


def _encode(entries) -> str:
    import json

    return RECORD_PREFIX + json.dumps(entries, separators=(",", ":"))


def _remove_record(program) -> None:
    for op in _record_ops(program):
        source = op.operand_source(0) if op.num_operands() else None
        op.erase()
        if source is not None and source.initialized():
            producer = source.get_defining_op()
            if producer is not None and producer.name() == "pd_op.full" \
                    and not source.all_used_ops():
                producer.erase()


def write_record(program) -> bool:
    """(Re)write the record of ``program``'s marked ops at the end of its
    top-level block: a one-byte ``pd_op.full`` fed to a
    ``builtin.shadow_output`` named :data:`RECORD_PREFIX` + JSON.  Any
    older record is removed first; a program without marks gets none.
    Returns whether the program changed."""
    import paddle

    entries = _entries(program)
    old = _record_ops(program)
    if len(old) == 1 and entries and \
            old[0].attrs().get("output_name") == _encode(entries):
        return False
    if not old and not entries:
        return False
    _remove_record(program)
    if not entries:
        return True
    block = program.global_block()
    with insertion_point_kept(), paddle.static.program_guard(program):
        paddle.pir.set_insertion_point_to_block_end(block)
        constant = paddle.full([1], 0, "uint8")
        paddle.base.libpaddle.pir.append_shadow_output(
            program, constant, _encode(entries), len(block.ops))
    return True


def _decode(text: str):
    import json

    try:
        value = json.loads(text[len(RECORD_PREFIX):])
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 3
                and all(isinstance(x, str) for x in item)):
            return None
        out.append(item)
    return out


def restore_marks(program) -> int:
    """Put :data:`MARK_ATTR` back on the ops ``program``'s record names (a
    program read from ``.json`` lost the attribute).  Each op is found at
    its recorded position and checked by name; where the program changed
    so that the position no longer holds that op, every op of that name
    that carries no mark is marked (refusing too much, never too little).
    Returns the number of marks set."""
    records = _record_ops(program)
    if not records:
        return 0
    at = None
    set_count = 0
    for rec in records:
        entries = _decode(str(rec.attrs().get("output_name", "")))
        if entries is None:
            log.warning("memopt: unreadable in-place record %r",
                        rec.attrs().get("output_name"))
            continue
        for path, name, mark in entries:
            if at is None:
                at = {_path_text(p): op for p, op in _walk(program.global_block())}
            op = at.get(path)
            if op is not None and op.name() == name:
                if not op.has_attr(MARK_ATTR):
                    op.set_str_attr(MARK_ATTR, mark)
                    set_count += 1
                continue
            log.warning("memopt: the in-place record names %s at %s, which the program no "
                        "longer has there: every %s is treated as made in place", name, path,
                        name)
            for other in at.values():
                if other.name() == name and not other.has_attr(MARK_ATTR):
                    other.set_str_attr(MARK_ATTR, mark)
                    set_count += 1
    return set_count


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
    it was.  Then each original's uses move to the new op and it is retired
    (:mod:`memopt.paddle.pir.retired`: out of the program, alive).
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
        try:  # messages name the user's line, not where memopt built the op
            new.callstack = old.callstack
        except Exception:  # pragma: no cover - an op without a call stack
            pass
        for a, b in zip(old.results(), new.results()):
            if a.initialized():
                replaced[a.id] = b
        old.replace_all_uses_with(new.results())
        retire(old, new)  # not erased: the user's Values of it stay valid
    return replaced


def record_rewrite(program, replaced: dict) -> None:
    """Remember which old Python Values the rewrite replaced (the guard swaps
    them for their replacements when fetched); what in-place ops now write
    over is marked on the ops themselves (:data:`MARK_ATTR`)."""
    entry = getattr(program, RECORD_ATTR, None) or {"replaced": {}}
    entry["replaced"].update(replaced)
    setattr(program, RECORD_ATTR, entry)


def overwritten_by(value):
    """``(op, names)`` of an op memory_optimize made in place that writes
    over ``value`` (read from the ops using it: survives ``clone()``), or
    None.  Where an in-place op using ``value`` carries no mark, the marks
    of ``value``'s program are first restored from its record
    (:func:`restore_marks`: a program read from ``.json``)."""
    from paddle.base import core

    try:
        users = value.all_used_ops()
    except Exception:  # not a Value of a live program
        return None
    vid = value.id
    restored = False
    for op in users:
        try:
            pairs = dict(core.pir.get_op_inplace_info(op))
        except Exception:  # an op Paddle has no in-place facts for
            continue
        for _, operand in pairs.items():
            if operand >= op.num_operands():
                continue
            source = op.operand_source(operand)
            if not source.initialized() or source.id != vid:
                continue
            if not op.has_attr(MARK_ATTR) and not restored:
                # a program read from .json: its marks are in the record
                restored = True
                try:
                    restore_marks(owning_program(value))
                except ValueError:
                    pass
            if op.has_attr(MARK_ATTR):
                return op, op.attrs()[MARK_ATTR]
    return None


def _overwritten_error(value, found):
    from ...errors import MergedVariableError

    op, names = found
    try:
        from .program import value_label

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
    live = None
    for item in items:
        vid = getattr(item, "id", None) if not isinstance(item, str) else None
        if isinstance(vid, str):
            if vid in entry["replaced"]:
                # an op built after the rewrite may have the erased Value's address
                live = live_ids(program) if live is None else live
                if vid not in live:
                    item = entry["replaced"][vid]
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


def record_for_save(program) -> None:
    """The record of the program ``save_inference_model`` writes: its
    pruning keeps the marked ops its targets need and drops the record op,
    so the record is written again for what is left (positions of the
    pruned program)."""
    if is_pir_program(program):
        write_record(program)


def fetch_hook(program, fetch_list):
    """The fetch guard's hook (:mod:`memopt.paddle.guards.fetch`)."""
    if is_pir_program(program):
        redirect(program)  # ops built on a replaced op's Values read its replacement
        check_later_readers(program, MARK_ATTR)
        return resolve_fetch_list(program, fetch_list)
    return fetch_list


def check_user_names(pg: PirGraph, options) -> None:
    """ValueError (program untouched) for ``skip_opt_set`` / ``fetch_list``
    names the program has no value of (:func:`memopt.names.check_known`)."""
    from ...names import check_known

    known = set(pg.values)
    check_known(options.skip_opt_set, known, "skip_opt_set")
    check_known(options.fetch_list, known, "fetch_list")
