"""Checks a plan must pass before any program is touched.

Independent of the planner: :func:`verify_order` (the new op order keeps
every dependency), :func:`verify_substitutions` (a dims-only substitute is
another operand of the same shape and dtype), :func:`verify_renaming`
(replays every block: each read still sees the value it saw before; no
rename reaches into another block), :func:`check_grouping` (the grouping, by
:func:`memopt.simulate.check_groups`) and :func:`check_plan` (all of them on
a :class:`memopt.plan.Plan`).  Each raises :class:`memopt.errors.PlanError`
naming what is at fault.  Imports no Paddle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .candidates import substitute
from .errors import PlanError
from .graph import Graph
from .plan import Plan
from .schedule import reorder
from .simulate import check_groups

__all__ = ["verify_order", "verify_substitutions", "verify_renaming", "check_grouping",
           "check_plan"]


def verify_order(graph: Graph, order: Optional[List[int]]) -> None:
    """Check that ``order`` (a permutation of block 0's ops) keeps every
    dependency: for each variable, a write stays after every earlier access
    and a read after the write before it; ops that run sub-blocks keep
    their order relative to every op.

    Raises
    ------
    PlanError
        Naming the variable and ops whose order would change.
    """
    if order is None:
        return
    ops = graph.blocks[0].ops
    if sorted(order) != list(range(len(ops))):
        raise PlanError("the new op order is not a permutation of block 0's ops")
    new_pos = [0] * len(ops)
    for pos, i in enumerate(order):
        new_pos[i] = pos
    # for each name, the op (original index) that comes last in the new order
    # among the earlier writers / earlier accessors of it
    last_write: Dict[str, int] = {}
    last_any: Dict[str, int] = {}
    latest = -1          # earlier op that comes last in the new order
    barrier = -1         # the last earlier op that runs sub-blocks
    for i, op in enumerate(ops):
        here = new_pos[i]
        if barrier >= 0 and new_pos[barrier] > here:
            raise PlanError(f"op {i} ({op.type}) would move above op {barrier} "
                            f"({ops[barrier].type}), which runs sub-blocks")
        if op.sub_blocks and latest >= 0 and new_pos[latest] > here:
            raise PlanError(f"op {i} ({op.type}) runs sub-blocks; op {latest} "
                            f"({ops[latest].type}) may not move below it")
        for name in op.reads:
            j = last_write.get(name)
            if j is not None and new_pos[j] > here:
                raise PlanError(f"op {i} ({op.type}) reads {name!r} and would move above "
                                f"op {j} ({ops[j].type}), which writes it")
        for name in op.writes:
            j = last_any.get(name)
            if j is not None and new_pos[j] > here:
                raise PlanError(f"op {i} ({op.type}) writes {name!r} and would move above "
                                f"op {j} ({ops[j].type}), which uses it")
        for table, names in ((last_write, op.writes), (last_any, (*op.reads, *op.writes))):
            for name in names:
                j = table.get(name)
                if j is None or new_pos[j] < here:
                    table[name] = i
        if latest < 0 or new_pos[latest] < here:
            latest = i
        if op.sub_blocks:
            barrier = i


def verify_substitutions(graph: Graph, substitutions: Iterable[Tuple[int, int, str, str, str]]) -> None:
    """Each substitute is another operand the op already reads, of the same
    static shape and dtype as the variable it stands in for."""
    for block_idx, index, slot, var, sub in substitutions:
        op = graph.blocks[block_idx].ops[index]
        a, b = graph.var(var, block_idx), graph.var(sub, block_idx)
        if var not in op.reads or sub not in op.reads:
            raise PlanError(f"op {index} ({op.type}) of block {block_idx}: {var!r} -> "
                            f"{sub!r} in slot {slot}, but the op does not read both")
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise PlanError(f"op {index} ({op.type}) of block {block_idx}: {sub!r} "
                            f"cannot stand in for {var!r}: different shape or dtype")


@dataclass
class _Grouping:
    """The plan shape :func:`memopt.simulate.check_groups` reads."""

    groups: List[List[Any]]
    group_of: Dict[Any, int]


def check_grouping(buffers: Sequence[Any], groups: List[List[Any]],
                   compatible: Optional[Callable[..., bool]],
                   fits: Optional[Callable[..., bool]]) -> None:
    """The independent checker of :mod:`memopt.simulate` on the grouping."""
    grouping = _Grouping(groups, {b.id: k for k, group in enumerate(groups) for b in group})
    # compatible() compares block, dtype and (level 0) shape for equality:
    # an equivalence, so each member is checked against its group's first
    check_groups(buffers, grouping, compatible=compatible, fits=fits, equivalence=True)


def verify_renaming(graph: Graph, renames: Dict[int, Dict[str, str]],
                    inplace: Iterable[Tuple[str, str, int]] = ()) -> None:
    """Check that renaming changes no value any op reads.

    Replays each block in order, tracking which original variable each name
    holds after the rename.  Every read must find the value it found before:
    a renamed name must hold the variable read, last written in the same
    block (a read of a merged variable before its first write in the block --
    a value carried in from outside or from the previous loop iteration -- is
    an error).  An op may read and write the same name only where it did so
    before or where it is one of the ``inplace`` pairs.  Two distinct
    variables an op uses may not end up under one name otherwise.

    Raises
    ------
    PlanError
        Naming the block, op and variables at fault.
    """
    _verify_scopes(graph, renames)
    allowed = {(src, dst) for src, dst, _ in inplace}
    merged = {name for mapping in renames.values() for name in mapping}
    merged |= {new for mapping in renames.values() for new in mapping.values()}
    for block in graph.blocks:
        mapping = renames.get(block.idx, {})
        if not mapping and not (merged & set(block.vars)):
            continue
        holds: Dict[str, str] = {}
        for index, op in enumerate(block.ops):
            where = f"op {index} ({op.type}) of block {block.idx}"
            new_reads: Dict[str, str] = {}
            for name in op.reads:
                new = mapping.get(name, name)
                if name in merged and holds.get(new) != name:
                    raise PlanError(
                        f"{where} reads {name!r}, but after renaming {new!r} holds "
                        f"{holds.get(new)!r} there")
                if new_reads.setdefault(new, name) != name:
                    raise PlanError(f"{where} reads {new_reads[new]!r} and {name!r}, "
                                    f"both renamed to {new!r}")
            new_writes: Dict[str, str] = {}
            for name in op.writes:
                new = mapping.get(name, name)
                if new_writes.setdefault(new, name) != name:
                    raise PlanError(f"{where} writes {new_writes[new]!r} and {name!r}, "
                                    f"both renamed to {new!r}")
                src = new_reads.get(new)
                if src is not None and src != name and (src, name) not in allowed:
                    raise PlanError(f"{where} reads {src!r} and writes {name!r}, both "
                                    f"renamed to {new!r}, but the op may not run in place")
            for name in op.writes:
                holds[mapping.get(name, name)] = name


def _verify_scopes(graph: Graph, renames: Dict[int, Dict[str, str]]) -> None:
    """No rename reaches into another block: a name renamed in block ``b``
    (old or new) that an op of another block uses must resolve there to a
    variable of its own (a local declaration shadowing ``b``'s), since the
    rewrite changes ``b``'s ops only.

    Raises
    ------
    PlanError
        Naming both blocks and the variable.
    """
    touched = {b: set(m) | set(m.values()) for b, m in renames.items() if m}
    if not touched or len(graph.blocks) == 1:
        return
    for block in graph.blocks:
        if block.idx in touched and len(touched) == 1:
            continue
        for op in block.ops:
            for name in (*op.reads, *op.writes):
                home = graph.home_of(name, block.idx)
                if home != block.idx and name in touched.get(home, ()):
                    raise PlanError(
                        f"op {op.type!r} of block {block.idx} uses {name!r} of block {home}, "
                        f"where the plan renames it: the rename would not reach it")


def check_plan(graph: Graph, plan: Plan) -> None:
    """Every check a plan must pass before a program is rewritten: the new
    op order keeps every dependency of ``graph`` (the original), and the
    renaming changes no value any op reads in that order."""
    verify_substitutions(graph, plan.substitutions)
    substituted = substitute(graph, plan.substitutions) if plan.substitutions else graph
    verify_order(substituted, plan.order)
    scheduled = substituted if plan.order is None else reorder(substituted, plan.order)
    verify_renaming(scheduled, plan.renames, plan.inplace)
    for group in plan.groups:
        owner = group[0]
        for name in group[1:]:
            if plan.renames.get(_block_of(plan, name), {}).get(name) != owner:
                raise PlanError(f"{name!r} is in the group of {owner!r} but not renamed to it")


def _block_of(plan: Plan, name: str) -> int:
    for block, mapping in plan.renames.items():
        if name in mapping:
            return block
    return -1
