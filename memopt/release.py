"""Release points: where a run with the garbage collector off frees each temporary.

With ``FLAGS_eager_delete_tensor_gb < 0`` Paddle's executor frees nothing
during a run: every temporary holds its memory from its first write to the
end of the run.  :func:`memopt.release_memory` (Fluid inserted ``delete_var``
ops) puts a *release* right after the op that uses a temporary last; the
adapter realises it as an op that drops the variable's buffer (legacy
Paddle: ``share_buffer`` from a variable no op ever writes, which leaves the
released variable holding no memory).  This module decides where, on a
:class:`memopt.graph.Graph`, and checks the result independently; it
imports no Paddle.

What is released: the candidates of :func:`memopt.candidates.classify` that
live in block 0 (dense, not persistable, not fed or fetched, not likely
fetched, not in ``skip_opt_set``, not live at entry, touched by no
control-flow op and by no sub-block) -- gradients included.  A release goes
after the last op of block 0 that reads or writes the name (a read for dims
only counts too: the executor still looks at the variable there), never
after the last op of the block (nothing runs after it), and never twice (a
name whose last use is already a release is reported as released before).
Sub-block locals are left alone: a loop body's locals are read back by
``while_grad`` from the step scopes.

Nothing may use a name after its release: the checker
(:func:`verify_releases`) replays block 0 and fails if any later op, or any
op of a sub-block run by a later control op, reads or writes a released
name.  (A program rewritten again afterwards may write the name anew --
memory_optimize can give a released name to a later variable -- and the
executor then allocates it afresh.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Tuple

from .candidates import classify, persistable_sizes, reason_counts, temporaries
from .errors import PlanError
from .graph import RELEASED_VAR, Graph, Op, Size
from .plan import Options
from .problems import Buffer
from .refusals import Refusal
from .scopes import scoped_liveness

__all__ = ["ReleasePlan", "plan_releases", "verify_releases", "RELEASED_VAR"]


@dataclass
class ReleasePlan:
    """Where to free what.

    ``after[i]`` names the block-0 temporaries released right after block 0's
    op ``i`` (original op indices); ``buffers`` every temporary's live
    interval (half-open op positions of the analysed graph) and size;
    ``persistable`` the sizes of persistable variables (for the estimates);
    ``already`` the names an earlier release already frees; ``reasons`` why
    the other temporaries are kept (reason -> count).
    """

    after: Dict[int, Tuple[str, ...]] = field(default_factory=dict)
    buffers: Dict[str, Buffer] = field(default_factory=dict)
    persistable: List[Size] = field(default_factory=list)
    already: Tuple[str, ...] = ()
    reasons: Dict[Refusal, int] = field(default_factory=dict)

    @property
    def released(self) -> List[str]:
        """Every name this plan releases, in program order."""
        return [name for index in sorted(self.after) for name in self.after[index]]


def plan_releases(graph: Graph, skip_opt_set: Iterable[str] = ()) -> ReleasePlan:
    """Release every block-0 temporary of ``graph`` right after its last use.

    ``skip_opt_set`` names variables to keep (never released).
    """
    options = Options(skip_opt_set=frozenset(skip_opt_set), skip_grads=False)
    split, _, intervals, free, excluded = scoped_liveness(graph)
    candidates, reason_of, home = classify(split, options, intervals, free, excluded)
    plan = ReleasePlan(buffers=temporaries(split, intervals),
                       persistable=persistable_sizes(split, home),
                       reasons=reason_counts(reason_of))

    ops = graph.blocks[0].ops
    last_use: Dict[str, int] = {}
    for index, op in enumerate(ops):
        for name in (*op.reads, *op.writes):
            last_use[name] = index
    after: Dict[int, List[str]] = {}
    already: List[str] = []
    for name in sorted(candidates, key=lambda n: (last_use.get(n, -1), n)):
        if candidates[name] != 0 or name not in last_use:
            continue
        index = last_use[name]
        if ops[index].facts.release:
            already.append(name)
        elif index < len(ops) - 1:
            after.setdefault(index, []).append(name)
    plan.after = {index: tuple(names) for index, names in sorted(after.items())}
    plan.already = tuple(already)
    return plan


def _names_used(graph: Graph, op: Op) -> set:
    """Names ``op`` reads or writes, with those of the sub-blocks it runs (any depth)."""
    used = set(op.reads) | set(op.writes)
    stack = list(op.sub_blocks)
    while stack:
        block = graph.blocks[stack.pop()]
        for inner in block.ops:
            used.update(inner.reads)
            used.update(inner.writes)
            stack.extend(inner.sub_blocks)
    return used


def verify_releases(graph: Graph, after: Mapping[int, Iterable[str]]) -> None:
    """Check release points against ``graph`` without trusting the planner.

    Every released name must be a dense, non-persistable variable declared in
    block 0 that is not fed, fetched or declared data; released at most once;
    and no op of block 0 after the release (nor any op of a sub-block such an
    op runs) may read or write it.

    Raises
    ------
    PlanError
        Naming the variable and the ops involved.
    """
    block = graph.blocks[0]
    fetched = set(graph.fetch_names)
    n_ops = len(block.ops)
    released: Dict[str, int] = {}
    for index in after:
        if not 0 <= index < n_ops:
            raise PlanError(f"release after op {index}, but block 0 has {n_ops} ops")
    for index, op in enumerate(block.ops):
        clash = sorted(_names_used(graph, op).intersection(released))
        if clash:
            name = clash[0]
            at = released[name]
            raise PlanError(
                f"{name!r} is released after op {at} ({block.ops[at].type}) but op {index} "
                f"({op.type}) uses it later")
        for name in after.get(index, ()):
            var = block.vars.get(name)
            if (var is None or not var.is_dense or var.persistable or var.is_feed
                    or var.is_fetch or var.is_data or name in fetched):
                raise PlanError(f"{name!r} is not a temporary of block 0: it must never be "
                                "released")
            if name in released:
                raise PlanError(f"{name!r} is released twice (after ops {released[name]} "
                                f"and {index})")
            released[name] = index
