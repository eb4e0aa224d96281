"""Where merged and released variables of a legacy program live, kept in its desc.

memory_optimize makes variables with disjoint lifetimes share memory;
release_memory frees variables right after their last use.  Either way a
variable stops holding its own value at the end of a run, so fetching it
must fail by name rather than return another variable's data.  That is made
true by the program itself, not by a Python-side guard that a ``clone()`` or
a save would lose:

- the memory of a merge lives under a *fresh* name, ``memopt@buf_<k>``,
  that no user variable holds: every member of the group (its first member
  included) is renamed to it, and a released variable is renamed to one of
  its own;
- the user names so renamed are removed from their block, so Paddle itself
  refuses to fetch them, naming them (``<name> not in VariableScope``), in
  any process, from any copy of the program;
- the fresh variable's desc carries the record -- the string attribute
  :data:`RECORD_ATTR`, JSON ``{"names": [...], "merged": bool,
  "released": bool}`` -- which ``VarDesc`` attributes keep through
  ``clone()``, ``clone(for_test=True)``, ``serialize_to_string`` /
  ``parse_from_string``, ``paddle.static.save`` and
  ``save_inference_model`` (measured on Paddle 3.3.1), so that where memopt
  is imported :func:`check_fetch` can turn Paddle's error into
  :class:`memopt.errors.MergedVariableError` saying what happened and how to
  keep the variable.

Removing a variable frees its ``VarDesc``; the Python ``Variable`` objects a
user still holds (``logits`` from building the model) are re-pointed at a
detached copy of it first (:func:`_detach`), so they keep their name, shape
and dtype -- and, fetched, fail by name.

Paddle is imported lazily.
"""
from __future__ import annotations

import json
import re
from typing import Dict, Iterable, List, Mapping, Tuple

from ...errors import GraphError, MergedVariableError

__all__ = ["BUFFER_PREFIX", "RECORD_ATTR", "SUBSTITUTED_VAR", "BEFORE_BACKWARD_VAR",
           "fresh_names", "record_of", "check_fetch", "apply_merges", "rename_released",
           "mark_substituted", "mark_before_backward"]

#: Prefix of the names shared or released memory lives under.
BUFFER_PREFIX = "memopt@buf_"

#: The VarDesc string attribute holding a buffer's record (JSON).
RECORD_ATTR = "memopt_record"

#: Declared (no op uses it) in block 0 of a legacy program whose grad ops'
#: dims-only reads memory_optimize redirected to another operand; its
#: :data:`RECORD_ATTR` says how many.  Such a program fails translated to
#: PIR with the GC on (PIR's collector frees a variable one op reads both
#: for its dims and its data before the op runs), so the fetch guard
#: refuses that run by name of the flag.
SUBSTITUTED_VAR = "memopt@substituted"

#: Declared (no op uses it) in block 0 of a legacy program memopt rewrote
#: while it had trainable parameters and no backward op
#: (:mod:`memopt.paddle.pending_backward`): a backward part appended later
#: reads and names merged variables, so such a program is refused once it
#: has one (:func:`memopt.paddle.legacy.program.check_backward_order`).
BEFORE_BACKWARD_VAR = "memopt@before_backward"

_SUFFIX = re.compile(re.escape(BUFFER_PREFIX) + r"(\d+)$")


def fresh_names(program, count: int) -> List[str]:
    """``count`` names ``memopt@buf_<k>`` declared in no block of ``program``
    (``k`` above every one already there: a program optimized twice)."""
    used = set()
    top = 0
    for block in program.blocks:
        for name in block.vars:
            used.add(name)
            m = _SUFFIX.match(name)
            if m:
                top = max(top, int(m.group(1)))
    out = []
    k = top
    while len(out) < count:
        k += 1
        name = f"{BUFFER_PREFIX}{k}"
        if name not in used:
            out.append(name)
    return out


def _read(desc) -> dict:
    try:
        if desc.has_attr(RECORD_ATTR):
            value = json.loads(desc.attr(RECORD_ATTR))
            if isinstance(value, dict):
                return value
    except (ValueError, TypeError, RuntimeError):
        pass
    return {}


def _write(desc, names: Iterable[str], merged: bool, released: bool,
           mixed_shapes: bool = False) -> None:
    record = {"names": sorted(set(names)), "merged": bool(merged), "released": bool(released)}
    if mixed_shapes:  # the names it holds were declared with different shapes
        record["mixed_shapes"] = True
    desc._set_attr(RECORD_ATTR, json.dumps(record, sort_keys=True))


def mixed_shape_buffers(program) -> List[str]:
    """The buffers of ``program`` (every block) that hold variables declared
    with different shapes (level 1 and 2 merges across shapes), sorted."""
    return sorted(name for block in program.blocks for name, var in block.vars.items()
                  if name.startswith(BUFFER_PREFIX) and _read(var.desc).get("mixed_shapes"))


def record_of(program) -> Dict[str, Tuple[str, bool, bool]]:
    """``{user name: (buffer name, merged, released)}`` read from the descs
    of ``program``'s variables (every block): empty for a program no rewrite
    touched."""
    out: Dict[str, Tuple[str, bool, bool]] = {}
    for block in program.blocks:
        for name, var in block.vars.items():
            if not name.startswith(BUFFER_PREFIX):
                continue
            rec = _read(var.desc)
            for user in rec.get("names", ()):
                out[str(user)] = (name, bool(rec.get("merged")), bool(rec.get("released")))
    return out


def _names_held(pblock, name: str) -> List[str]:
    """The user names a variable stands for: its record's if it is a buffer
    (a program optimized again), else itself."""
    if name.startswith(BUFFER_PREFIX) and pblock.has_var(name):
        rec = _read(pblock.var(name).desc)
        if rec.get("names"):
            return list(rec["names"])
    return [name]


def _detached_copy(desc):
    """A ``VarDesc`` owned by Python with ``desc``'s name, type, shape,
    dtype and flags (for a Variable whose block no longer declares it)."""
    from paddle.base import core

    copy = core.VarDesc(desc.name())
    copy.set_type(desc.type())
    try:
        copy.set_shape(desc.shape())
        copy.set_dtype(desc.dtype())
        copy.set_lod_level(desc.lod_level())
    except Exception:  # a type without a tensor shape (a reader)
        pass
    copy.set_persistable(desc.persistable())
    copy.set_stop_gradient(desc.stop_gradient())
    copy.set_need_check_feed(desc.need_check_feed())
    return copy


def _detach(pblock, name: str) -> None:
    """Remove ``name`` from ``pblock``; the Variable object the block had for
    it (the one user code holds) keeps a detached copy of its desc."""
    var = pblock.vars.get(name)
    if var is not None:
        copy = _detached_copy(var.desc)
    pblock.desc._remove_var(name.encode())
    if var is not None:
        var.desc = copy
        del pblock.vars[name]


def _users_elsewhere(program, names: Mapping[str, int]) -> List[Tuple[str, int]]:
    """``(name, block)`` pairs where an op of a block other than the name's
    own uses one of ``names`` (name -> its block) *as that block's
    variable*: the using block and its ancestors up to the home declare no
    variable of that name of their own (a sub-block local shadowing it is
    another variable)."""
    out = []
    for pblock in program.blocks:
        if not pblock.ops:
            continue
        for pop in pblock.ops:
            desc = pop.desc
            for name in (*desc.input_arg_names(), *desc.output_arg_names()):
                home = names.get(name)
                if home is None or home == pblock.idx:
                    continue
                if _resolves_to(program, pblock.idx, name) == home:
                    out.append((name, pblock.idx))
    return out


def _resolves_to(program, block_idx: int, name: str) -> int:
    """The block whose declaration of ``name`` a use in block ``block_idx``
    sees (walking up the parents), or -1."""
    idx = block_idx
    while 0 <= idx < program.num_blocks:
        pblock = program.block(idx)
        if pblock.desc.find_var(name.encode()) is not None:
            return idx
        idx = pblock.parent_idx
    return -1


def _declare(pblock, name: str, like) -> None:
    """Declare ``name`` in ``pblock`` as a non-persistable copy of var desc ``like``."""
    pblock.create_var(name=name, shape=like.shape(), dtype=like.dtype(),
                      type=like.type(), lod_level=like.lod_level(), persistable=False,
                      stop_gradient=like.stop_gradient())


def apply_merges(program, groups: List[List[str]], homes: Mapping[str, int], rewrite,
                 order=None, substitutions=()) -> Dict[str, str]:
    """Rewrite ``program`` so each group of ``groups`` lives under a fresh name.

    ``groups`` are the plan's groups (names in time order; they share one
    memory); ``homes[name]`` the block that declares each member;
    ``rewrite(program, renames, order, substitutions)`` the adapter's
    all-or-nothing rewrite.  Every member is renamed to its group's
    ``memopt@buf_<k>`` (declared first, as a copy of the first member's
    desc, carrying the record), then removed from its block.  All or
    nothing: if the rewrite fails the fresh declarations are removed and
    the error re-raised.  Returns ``{member: buffer name}``.
    """
    groups = [g for g in groups if len(g) >= 2]
    members = {m: homes[g[0]] for g in groups for m in g}
    clash = _users_elsewhere(program, members)
    if clash:
        name, block = clash[0]
        raise GraphError(f"{name!r} is used by an op of block {block}, outside the block "
                         "the plan renames it in")
    buffers = fresh_names(program, len(groups))
    renames: Dict[int, Dict[str, str]] = {}
    declared: List[Tuple[object, str]] = []
    buffer_of: Dict[str, str] = {}
    try:
        for group, buf in zip(groups, buffers):
            pblock = program.block(homes[group[0]])
            _declare(pblock, buf, pblock.var(group[0]).desc)
            declared.append((pblock, buf))
            held: List[str] = []
            released = mixed = False
            for m in group:
                held.extend(_names_held(pblock, m))
                if m.startswith(BUFFER_PREFIX):
                    rec = _read(pblock.var(m).desc)
                    released = released or bool(rec.get("released"))
                    mixed = mixed or bool(rec.get("mixed_shapes"))
            mixed = mixed or len({tuple(pblock.var(m).desc.shape()) for m in group}) > 1
            _write(pblock.var(buf).desc, held, merged=True, released=released,
                   mixed_shapes=mixed)
            for m in group:
                renames.setdefault(pblock.idx, {})[m] = buf
                buffer_of[m] = buf
        rewrite(program, renames, order, substitutions)
    except BaseException:
        for pblock, buf in reversed(declared):
            pblock._remove_var(buf, sync=False)
        raise
    for block_idx, mapping in renames.items():
        pblock = program.block(block_idx)
        for m in mapping:
            _detach(pblock, m)
    return buffer_of


def mark_substituted(program, substitutions) -> None:
    """Declare :data:`SUBSTITUTED_VAR` in block 0 of ``program`` (once),
    recording the ``substitutions`` :func:`apply_merges` made."""
    if not substitutions:
        return
    block = program.global_block()
    count = len(substitutions)
    if block.has_var(SUBSTITUTED_VAR):
        count += int(_read(block.var(SUBSTITUTED_VAR).desc).get("substituted", 0))
    else:
        block.create_var(name=SUBSTITUTED_VAR, shape=[1], dtype="float32", persistable=False)
    block.var(SUBSTITUTED_VAR).desc._set_attr(RECORD_ATTR, json.dumps({"substituted": count}))


def mark_before_backward(program) -> None:
    """Declare :data:`BEFORE_BACKWARD_VAR` in block 0 of ``program`` (once)."""
    block = program.global_block()
    if not block.has_var(BEFORE_BACKWARD_VAR):
        block.create_var(name=BEFORE_BACKWARD_VAR, shape=[1], dtype="float32",
                         persistable=False)


def rename_released(program, names: Iterable[str], rewrite):
    """Rename each variable of block 0 that release_memory frees to a fresh
    name of its own, carrying the record (a buffer already keeps its name).

    Returns ``(mapping, undo, finish)``: ``mapping[user name]`` is the name
    to release; ``undo()`` puts the program back as it was; ``finish()``
    marks buffers released and removes the user names from the block (call
    it once the releases are in).
    """
    block = program.global_block()
    names = list(names)
    plain = [n for n in names if not n.startswith(BUFFER_PREFIX)]
    already = [n for n in names if n.startswith(BUFFER_PREFIX)]
    clash = _users_elsewhere(program, {n: 0 for n in plain})
    if clash:
        name, idx = clash[0]
        raise GraphError(f"released {name!r} is used by an op of block {idx}")
    buffers = fresh_names(program, len(plain))
    declared: List[str] = []
    mapping: Dict[str, str] = {}

    def remove_declared():
        for buf in reversed(declared):
            block._remove_var(buf, sync=False)

    try:
        for name, buf in zip(plain, buffers):
            _declare(block, buf, block.var(name).desc)
            declared.append(buf)
            _write(block.var(buf).desc, [name], merged=False, released=True)
            mapping[name] = buf
        if mapping:
            rewrite(program, {0: dict(mapping)}, None, ())
    except BaseException:
        remove_declared()
        raise

    def undo():
        if mapping:
            rewrite(program, {0: {buf: name for name, buf in mapping.items()}}, None, ())
        remove_declared()

    def finish():
        for name in already:
            rec = _read(block.var(name).desc)
            _write(block.var(name).desc, rec.get("names") or [name],
                   bool(rec.get("merged")), True, bool(rec.get("mixed_shapes")))
        for name in plain:
            _detach(block, name)

    full = dict(mapping)
    full.update({n: n for n in already})
    return full, undo, finish


def _refuse_buffer(block, name: str) -> None:
    """MergedVariableError for a fetch of a buffer ``memopt@buf_<k>``
    itself (``program.list_vars()`` lists it): it is the memory of several
    variables, at the end of a run the last one's, no variable's value."""
    held = _read(block.var(name).desc).get("names") or []
    raise MergedVariableError(
        f"cannot fetch {name!r}: it is the memory memopt.memory_optimize / release_memory "
        f"gave to {', '.join(repr(n) for n in held) or 'several variables'}, holding "
        f"whichever of them was written last, not a variable of the program as you built "
        f"it. Fetch the variable you want instead, kept by passing it in fetch_list= to "
        f"memory_optimize / release_memory")


def check_fetch(program, fetch_list) -> None:
    """Raise :class:`MergedVariableError` if ``fetch_list`` names a variable
    that a rewrite of ``program`` (or of the program it was copied or loaded
    from) renamed away: merged into shared memory or released, or names a
    buffer ``memopt@buf_<k>`` itself.  The other names the program still
    declares pass: by construction they hold their own value."""
    if not fetch_list:
        return
    items = fetch_list if isinstance(fetch_list, (list, tuple)) else [fetch_list]
    block = program.global_block()
    record = None
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if isinstance(name, str) and name.startswith(BUFFER_PREFIX) and block.has_var(name):
            _refuse_buffer(block, name)
        if not isinstance(name, str) or block.has_var(name):
            continue
        if record is None:
            record = record_of(program)
        entry = record.get(name)
        if entry is None:
            continue
        buf, merged, released = entry
        if merged:
            others = sorted(n for n, e in record.items() if e[0] == buf and n != name)
            what = (f"memopt.memory_optimize made it share memory with "
                    f"{', '.join(repr(n) for n in others) or 'other variables'} (now "
                    f"{buf!r}), so after the run it no longer holds its own value")
            if released:
                what += ", and release_memory frees that memory after its last use"
            fn = "memory_optimize"
        else:
            what = (f"memopt.release_memory frees it right after its last use (as {buf!r}), "
                    "so after the run it holds no value")
            fn = "release_memory"
        raise MergedVariableError(
            f"cannot fetch {name!r}: {what}. Rebuild the program and pass "
            f"fetch_list=[{name!r}] (or skip_opt_set={{{name!r}}}) to {fn} to keep it")
