"""The plan memory_optimize makes, as plain data, and the options it is made with.

:class:`Options` are memory_optimize's arguments once checked
(:func:`memopt.api.resolve_options`); :class:`Plan` is what
:func:`memopt.planner.plan_memory` returns and :func:`memopt.verify.check_plan`
checks before an adapter applies it.  Nothing here computes anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .graph import Graph, Size
from .problems import Buffer
from .refusals import Refusal
from .report import Reuse

__all__ = ["Options", "Plan", "InplaceRewrite"]


@dataclass(frozen=True)
class Options:
    """memory_optimize's arguments, checked, with names resolved.

    ``skip_opt_set`` holds variable names (Variables/Values already turned
    into their names); ``fetch_list`` the names the user will fetch (kept
    whole, like ``skip_opt_set``, and live at the program's end); ``level``
    is 0, 1 or 2 (the planner sees at most 1: level 2 adds a memory-aware
    order in :mod:`memopt.api`).  Every name is one the program has (checked
    against the program by :func:`memopt.names.check_known` before anything
    changes).  ``read_later`` (set by memopt, not the user) names values a
    backward part not yet appended will read
    (:mod:`memopt.paddle.pending_backward`): no in-place op writes over them,
    though they may take over their input's memory themselves.
    """

    skip_opt_set: frozenset = frozenset()
    skip_grads: bool = True
    level: int = 0
    print_log: bool = False
    fetch_list: frozenset = frozenset()
    read_later: frozenset = frozenset()


@dataclass
class Plan:
    """A memory plan for a :class:`Graph`.

    ``renames[block][old] = new`` is the rewrite; ``groups`` the variable
    names that share one memory block (each in time order, first = the name
    they all take; groups of one left out); ``reuses`` one line per merged
    variable; ``inplace`` the ``(input, output, position)`` pairs run in
    place; ``reasons`` why candidates were left alone.  ``buffers`` holds
    every temporary's live interval (half-open op positions) and size, for
    the estimates; ``before`` the same in the original op order.  ``order``
    (None: unchanged) is the new order of block 0's ops as indices of the
    original ops, ``moved`` how many optimizer ops it moves up, and
    ``scheduled`` the graph in that order, which positions refer to.
    ``substitutions`` are the dims-only reads redirected
    (:func:`dims_only_substitutions`, applied before the order);
    ``estimates`` the ``(peak before, peak after, holders)`` of
    :func:`estimate`; ``notes`` extra lines for the report.
    """

    gc: bool
    level: int
    renames: Dict[int, Dict[str, str]] = field(default_factory=dict)
    groups: List[List[str]] = field(default_factory=list)
    reuses: List[Reuse] = field(default_factory=list)
    inplace: List[Tuple[str, str, int]] = field(default_factory=list)
    reasons: Dict[Refusal, int] = field(default_factory=dict)
    buffers: Dict[str, Buffer] = field(default_factory=dict)
    persistable: List[Size] = field(default_factory=list)
    order: Optional[List[int]] = None
    moved: int = 0
    scheduled: Optional[Graph] = None
    before: Dict[str, Buffer] = field(default_factory=dict)
    estimates: Optional[tuple] = None
    notes: List[str] = field(default_factory=list)
    substitutions: List[Tuple[int, int, str, str, str]] = field(default_factory=list)

    def merged(self) -> Dict[str, str]:
        """``{name: a variable it now shares memory with}`` for every member
        of every group (the first member maps to the second)."""
        out: Dict[str, str] = {}
        for group in self.groups:
            out[group[0]] = group[1]
            for name in group[1:]:
                out[name] = group[0]
        return out


@dataclass
class InplaceRewrite:
    """One op to turn into its in-place variant (pure data, before the rewrite).

    ``position`` is the op's flat position (:meth:`memopt.graph.Graph.walk_ops`);
    ``pairs`` the ``(input name, output name)`` the variant writes over.
    """

    position: int
    op_name: str
    pairs: tuple
    block: int = 0
