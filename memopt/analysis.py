"""Where a program's memory goes: timeline, peak, who holds it, what batch fits.

:func:`from_graph` takes a memopt :class:`~memopt.graph.Graph` (as
:func:`memopt.analyze` reads it from a Paddle program, PIR or legacy, with
:mod:`memopt.paddle.runtime`) and models what Paddle's executor allocates
while it runs one step:

- every non-persistable dense variable holds its bytes from the op that
  writes it first to its last use (live intervals of :mod:`memopt.liveness`);
  with the garbage collector on (``FLAGS_eager_delete_tensor_gb`` >= 0, the
  default) it is freed right after its last use, with it off it is held to the
  end of the step;
- a use that only needs a tensor's shape (Paddle's *no-need-buffer* inputs,
  e.g. ``x`` of ``add_grad``) does not keep its memory alive;
- fed data stay allocated for the whole step (the executor keeps them in the
  scope);
- for PIR, the executor's in-place pass (``FLAGS_pir_apply_inplace_pass``, on
  by default) writes some outputs over their dying input
  (:func:`memopt.paddle.pir.inplace.executor_inplace`): the two share one
  buffer, as do an in-place op's (``sgd_``, ``batch_norm_``) input and output;
- ops run in the order the executor picks, not in program order
  (:func:`executor_order`): Paddle's multi-thread executor runs an op as soon
  as its inputs are ready, so an optimizer step frees its gradient early;
- a legacy program is analysed through its translation to PIR (values named
  after the legacy variables); the versions of a variable written more than
  once (``name#k``, e.g. after memory_optimize's renames) are one buffer, as
  the legacy executor keeps one per variable;
- with the garbage collector off, a variable memopt.release_memory releases
  is held to its release, not to the end of the step;
- what a training program's ``if``/``while`` regions save for the backward
  pass (PIR stacks) is held from the push to the pop, once per loop
  iteration (:attr:`RuntimeModel.loop_iterations`);
- persistable variables (parameters, optimizer state) are counted apart: they
  are allocated before the step and outlive it;
- what kernels allocate beyond the program's types, where known
  (:mod:`memopt.paddle.kernel_memory`): the real size of outputs typed
  empty (``rnn``'s ``reserve``), and an op's scratch memory held while it
  runs (``OpFacts.workspace``, category ``"workspace"``; ``rnn_grad``,
  ``layer_norm_grad``, ``add_grad``, convolutions' im2col buffer).

Not modelled: other kernels' temporary workspaces, and which branch of an
``if`` runs (values saved in either branch are counted: an upper bound).  ``benchmarks/bench_analysis.py`` measures the error against
Paddle's allocator (within 10% on the benchmark models).

Sizes are symbolic in the batch (a ``-1`` dimension is ``B``), so the live
bytes at each op position are a polynomial in ``B`` and the peak is their
maximum: :meth:`Analysis.peak` answers for any batch size,
:meth:`Analysis.max_batch_size` the largest batch that fits a budget.

Units: bytes; positions are flat op positions (:meth:`Graph.walk_ops`).
"""
from __future__ import annotations

import heapq
import json
import logging
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from .graph import Graph, Op, Size, unversioned
from .liveness import Interval, StraightLine, program_liveness
from .report import format_bytes
from .schedule import reorder

log = logging.getLogger(__name__)

__all__ = ["RuntimeModel", "Holder", "Analysis", "from_graph", "from_graph_modes", "versions",
           "executor_order"]

#: With the garbage collector off, Paddle 3.3.1's executor (CPU) holds this
#: many more buffers the size of each fetched value of a PIR program when the
#: step ends (what fetching makes, besides the value itself; the default of
#: :attr:`RuntimeModel.fetch_copies`).  Measured: a [64, 1024] float32 tanh
#: output fetched besides the loss raises the step's peak by 4 x 256 KiB with
#: GC off (the value, kept to the end anyway, and 3 more; a second such value:
#: 3 more again) and by none with GC on.
FETCH_COPIES_GC_OFF = 3

#: :data:`FETCH_COPIES_GC_OFF` for a legacy program (legacy executor): a
#: [16, 8192] float32 logits fetched besides the loss raised the measured
#: step peak by 2 x 512 KiB with GC off.
LEGACY_FETCH_COPIES_GC_OFF = 2

#: Categories of memory, in report order.
CATEGORIES = ("parameter", "input", "activation", "gradient", "optimizer", "workspace")


@dataclass(frozen=True)
class RuntimeModel:
    """How the executor handles memory.

    Attributes
    ----------
    gc : free a variable right after its last use (Paddle's eager deletion,
        ``FLAGS_eager_delete_tensor_gb`` >= 0); False holds every variable to
        the end of the step.
    inplace : apply the PIR executor's in-place pass (PIR programs only).
    device : ``"cpu"`` or ``"gpu"``: the in-place pass differs slightly.
    schedule : ``"dataflow"``: ops run in the order Paddle's executor picks
        (:func:`executor_order`: an op runs once its inputs are ready, an
        optimizer update right after its gradient); ``"program"``: in
        program order.
    workers : threads of the executor's work queue in the dataflow schedule
        (Paddle uses 4 on CPU).
    loop_iterations : how many times a ``while`` body runs, for the memory a
        training program's loop saves for its backward pass (each iteration
        pushes its values on a stack).  The trip count is known only at run
        time; the default 1 gives a lower estimate for loops.
    fetch_copies : with ``gc`` False, how many more buffers the size of
        each fetched value the executor holds when the step ends
        (:data:`FETCH_COPIES_GC_OFF`, :data:`LEGACY_FETCH_COPIES_GC_OFF`).
    """

    gc: bool = True
    inplace: bool = True
    device: str = "cpu"
    schedule: str = "dataflow"
    workers: int = 4
    loop_iterations: int = 1
    fetch_copies: int = FETCH_COPIES_GC_OFF


@dataclass(frozen=True)
class Holder:
    """One buffer: a variable, or an in-place chain of variables sharing memory.

    Attributes
    ----------
    name : the variable that allocates it (the first of ``names``).
    names : every variable living in this buffer, in the order they are
        written.
    size : bytes, symbolic in the batch size.
    category : ``"input"``, ``"activation"``, ``"gradient"`` or ``"optimizer"``.
    op : type of the op that allocates it; ``position`` its flat position.
    start, end : first and last op positions at which it holds memory.
    label : how the user knows ``name`` (:attr:`memopt.graph.Var.display`:
        for a PIR value the ``name=`` given in Python or the op that makes
        it and where, with ``%N`` beside it); the name itself otherwise.
    """

    name: str
    names: tuple
    size: Size
    category: str
    op: str
    position: int
    start: int
    end: int
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def bytes(self, batch_size: int) -> int:
        return self.size.at(batch_size)


def _order(size: Size) -> tuple:
    """Sort key of sizes: the larger for large batches first."""
    return size.power, size.coefficient


def _scaled(size: Size, factor: int) -> Size:
    return size if factor == 1 else Size(size.coefficient * factor, size.power)


def _poly_add(poly: dict, size: Size, sign: int = 1) -> None:
    poly[size.power] = poly.get(size.power, 0) + sign * size.coefficient


def _poly_at(poly: dict, batch_size: int) -> int:
    return sum(c * batch_size ** p for p, c in poly.items())


def _poly_str(poly: dict) -> str:
    terms = []
    for power in sorted(poly, reverse=True):
        c = poly[power]
        if not c:
            continue
        unit = format_bytes(c)
        terms.append(unit if power == 0 else f"{unit}*B" if power == 1 else f"{unit}*B^{power}")
    return " + ".join(terms) if terms else "0 B"


@dataclass
class Analysis:
    """The memory of one program step under a :class:`RuntimeModel`.

    Attributes
    ----------
    graph : the program's :class:`Graph`.
    batch_size : the batch size figures default to (1 when None was given).
    runtime : the runtime model used.
    holders : every non-persistable buffer (see :class:`Holder`).
    persistable : bytes of persistable variables (parameters, optimizer
        state) as ``{power of B: bytes}`` (normally just ``{0: bytes}``).
    op_types : the op type at each flat position.
    inplace : ``(position, input, output)`` of the ops the executor runs in
        place (PIR), as modelled (positions in program order).
    order : ``order[i]`` is the program-order flat position of the op that
        runs ``i``-th; timeline positions, ``Holder.start``/``end``/
        ``position`` and ``op_types`` are in run order.
    batch_planner : ``planner(budget, start_batch, limit) -> batch`` behind
        ``max_batch_size(recompute=True)``: the largest batch found at which
        ``memory_optimize(budget=...)`` returns a plan, checked by planning
        there; set by :func:`memopt.analyze` for a PIR program without
        if/while regions, None otherwise.
    places : ``places[i]`` is where the op that runs ``i``-th is in the
        program as ``print(program)`` shows it (``"op 233"``, ``"op 2 in
        pd_op.while at op 40"``), the numbering PIR values' labels use;
        ``""`` where the adapter gave none (legacy programs, bare graphs,
        ops an adapter added).  See :meth:`place`.
    """

    graph: Graph
    batch_size: Optional[int]
    runtime: RuntimeModel
    holders: list
    persistable: dict
    op_types: list
    inplace: list = field(default_factory=list)
    order: list = field(default_factory=list)
    batch_planner: Any = field(default=None, repr=False, compare=False)
    places: list = field(default_factory=list)
    _coef: Any = field(default=None, repr=False)
    #: what :func:`from_graph_modes` read from ``graph`` whatever the runtime
    #: (:func:`modes_of` reuses it); None when made otherwise
    _shared: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = max(len(self.op_types), 1)
        powers = sorted({h.size.power for h in self.holders} | {0})
        self._powers = powers
        coef = np.zeros((len(powers), n + 1), dtype=object)
        index = {p: k for k, p in enumerate(powers)}
        for h in self.holders:
            k = index[h.size.power]
            coef[k, h.start] += h.size.coefficient
            coef[k, h.end + 1] -= h.size.coefficient
        self._coef = np.cumsum(coef, axis=1)[:, :n]

    # -- figures --------------------------------------------------------------
    def batch_for(self, batch_size: Optional[int] = None) -> int:
        """The batch size figures are given at: ``batch_size``, else the
        analysis's own, else 1 (ValueError below 1)."""
        b = batch_size if batch_size is not None else (self.batch_size or 1)
        if not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"batch_size must be a positive integer, got {b!r}")
        return int(b)

    def timeline(self, batch_size: Optional[int] = None) -> list:
        """Live non-persistable bytes at every op position (while it runs);
        a program without ops has one position: the step holding its feeds."""
        b = self.batch_for(batch_size)
        total = np.zeros(self._coef.shape[1], dtype=object)
        for k, p in enumerate(self._powers):
            total = total + self._coef[k] * (b ** p)
        return [int(x) for x in total]

    def setup_ops(self) -> int:
        """How many op positions at the start of the run are declarations,
        not instructions of the executor: parameters (``builtin.parameter``),
        feeds and data (``pd_op.data``, ``feed``) and their glue
        (``builtin.split``...).  They make no kernel call and allocate
        nothing for the step (fed data are held from position 0 anyway), so
        a picture of the step may start at this position.  In the dataflow
        schedule every declaration comes first; in program order only the
        leading ones are counted.  0 when every op is a declaration (a
        program that only declares: nothing to skip to)."""
        count = 0
        for op_type in self.op_types:
            if op_type not in _NOT_INSTRUCTIONS:
                return count
            count += 1
        return 0

    def place(self, position: int) -> str:
        """Where the op at run position ``position`` is, as reports say it:
        its ``print(program)`` place (:attr:`places`) when known, else
        ``"op N"`` with ``N`` the run position (``"run position N"`` in a
        program whose other ops have places, so the two numberings are
        never mixed up)."""
        if 0 <= position < len(self.places) and self.places[position]:
            return self.places[position]
        return f"run position {position}" if any(self.places) else f"op {position}"

    def _place_and_type(self, position: int) -> str:
        """``"op 233 (pd_op.batch_norm_)"``; ``"op 23 (mul_grad;
        pd_op.matmul_grad)"`` for a legacy op's place."""
        place = self.place(position)
        op_type = self.op_types[position] if self.op_types else "-"
        if place.endswith(")"):
            return f"{place[:-1]}; {op_type})"
        return f"{place} ({op_type})"

    def _made_at(self, holder: Holder) -> str:
        """``"at op 23"``; ``"(fed)"`` for data no op of the program makes."""
        pos = holder.position
        if holder.category == "input" and any(self.places) \
                and not (0 <= pos < len(self.places) and self.places[pos]):
            return "(fed)"
        return f"at {self.place(pos)}"

    def peak_position(self, batch_size: Optional[int] = None) -> int:
        """The first op position where the live bytes are highest."""
        line = self.timeline(batch_size)
        return int(np.argmax(np.array(line, dtype=float))) if line else 0

    def peak(self, batch_size: Optional[int] = None) -> int:
        """Peak live bytes of non-persistable variables during the step."""
        line = self.timeline(batch_size)
        return max(line) if line else 0

    def persistable_bytes(self, batch_size: Optional[int] = None) -> int:
        """Bytes of persistable variables (allocated before the step)."""
        return _poly_at(self.persistable, self.batch_for(batch_size))

    def total_peak(self, batch_size: Optional[int] = None) -> int:
        """Persistable bytes plus the step's peak: what the device must hold.

        Compare this, not :meth:`peak`, with an allocator peak taken from
        before the startup program runs (it counts parameters and optimizer
        state too).  E.g. legacy ResNet-50 training, batch 8, 96 px, GC off,
        Paddle 3.3.1 CPU: peak 575.1 MiB + persistable 179.7 MiB = 754.9 MiB
        predicted; measured 576.4 MiB above the startup's 179.7 MiB."""
        return self.persistable_bytes(batch_size) + self.peak(batch_size)

    def total_peak_pending(self, window: int, batch_size: Optional[int] = None) -> int:
        """:meth:`total_peak` when frees may run up to ``window`` ops late.

        Paddle's CPU garbage collector does not free a buffer in the op
        that last uses it: it queues the free on its own thread
        (``InterpreterCoreEventGarbageCollector::Free``), which runs when
        the OS gives it a core.  Until then the allocator still counts the
        buffer.  Here every buffer freed after op ``t - k`` (``1 <= k <=
        window``, in run order) is taken to be still held at op ``t``:
        ``max_t live(t) + freed(t - window .. t - 1)``, plus the persistable
        bytes.  ``window=0`` is :meth:`total_peak`."""
        line = self.timeline(batch_size)
        if window <= 0 or not line:
            return self.total_peak(batch_size)
        b = self.batch_for(batch_size)
        freed = np.zeros(len(line) + 1, dtype=object)
        last = len(line) - 1
        for h in self.holders:
            if h.end < last:
                freed[h.end + 1] += h.bytes(b)  # its free is queued once op h.end is done
        pending = [int(x) for x in np.cumsum(freed)]
        # frees queued after ops t-window .. t-1, i.e. at slots t-window+1 .. t
        best = max(0, max(live + pending[t] - pending[t - window if t > window else 0]
                          for t, live in enumerate(line)))
        return self.persistable_bytes(b) + best

    def peak_formula(self, batch_size: Optional[int] = None) -> str:
        """The live bytes at the peak position as a formula in ``B``."""
        pos = self.peak_position(batch_size)
        poly = {p: int(self._coef[k, pos]) for k, p in enumerate(self._powers)}
        return _poly_str(poly)

    def held_at(self, position: Optional[int] = None,
                batch_size: Optional[int] = None) -> list:
        """Buffers live at ``position`` (default: the peak), largest first."""
        b = self.batch_for(batch_size)
        pos = self.peak_position(b) if position is None else position
        live = [h for h in self.holders if h.start <= pos <= h.end]
        return sorted(live, key=lambda h: (-h.bytes(b), h.start, h.name))

    def breakdown(self, position: Optional[int] = None,
                  batch_size: Optional[int] = None) -> dict:
        """Bytes by category at ``position`` (default: the peak), persistable
        variables under ``"parameter"``."""
        b = self.batch_for(batch_size)
        out = {c: 0 for c in CATEGORIES}
        out["parameter"] = self.persistable_bytes(b)
        for h in self.held_at(position, b):
            out[h.category] = out.get(h.category, 0) + h.bytes(b)
        return out

    def peak_curve(self, batch_sizes: Iterable[int]) -> list:
        """``[(batch size, peak bytes)]``: the peak as a function of the batch."""
        return [(int(b), self.peak(b)) for b in batch_sizes]

    def grows_with_batch(self) -> bool:
        """Whether any memory depends on the batch size (a ``-1`` dimension)."""
        return any(p > 0 and np.any(self._coef[k] != 0)
                   for k, p in enumerate(self._powers)) or \
            any(p > 0 and c for p, c in self.persistable.items())

    def max_batch_size(self, budget_bytes: int, *, include_persistable: bool = True,
                       limit: int = 1 << 30, recompute: bool = False) -> Optional[int]:
        """The largest batch size whose memory fits ``budget_bytes``.

        Counts the step's peak plus, when ``include_persistable``, the
        persistable variables.  Returns 0 when not even batch 1 fits, and
        ``None`` when memory does not depend on the batch size and fits
        (any batch does).  Searches up to ``limit``.

        ``recompute=True``: the batch ``memory_optimize(program,
        budget=budget_bytes, batch_size=n)`` is known to plan (the same
        figure as :class:`memopt.errors.BudgetError`'s ``largest_batch``):
        the largest batch ``n`` found at which planning, exactly as
        memory_optimize plans under this analysis' runtime (the plans it
        vouches for, frees up to ``memopt.paddle.pir.budget.GC_LAG_OPS``
        ops late, the rewritten program checked), returns a plan, with
        ``n + 1`` refused (or ``n == limit``); 0 if batch 1 is refused.
        Searched from the estimate the plans at this analysis' batch give,
        a few plannings of seconds each; the program is planned as it is
        when called and left as it was.  It is the largest such batch if a
        batch gets a plan whenever a larger one does (memory grows with
        the batch); otherwise a verified lower bound of it.  Persistable
        variables always count (``include_persistable=False`` is refused):
        a budget holds them.  Needs an analysis of a PIR program by
        :func:`memopt.analyze` (if/while regions included: their loops'
        trip counts read as ``budget=`` reads them).
        """
        from .batch_search import largest_passing

        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if recompute and self.batch_planner is None and len(self.graph.blocks) == 1:
            raise ValueError("max_batch_size(recompute=True) needs the analysis of a PIR "
                             "program made by memopt.analyze(program)")
        if recompute and self.batch_planner is not None:
            if not include_persistable:
                raise ValueError(
                    "max_batch_size(recompute=True) answers for memory_optimize(budget=...), "
                    "whose budget holds the parameters and optimizer state: drop "
                    "include_persistable=False")
            if not self.grows_with_batch():
                return None if self.batch_planner(budget_bytes, 1, 1) else 0
            return self.batch_planner(budget_bytes, self.batch_for(None), limit)

        def need(b: int) -> int:
            return self.peak(b) + (self.persistable_bytes(b) if include_persistable else 0)

        if need(1) > budget_bytes:
            return 0
        if not self.grows_with_batch():
            return None
        return largest_passing(lambda b: need(b) <= budget_bytes, 1, limit, {1: True})

    # -- output ---------------------------------------------------------------
    def to_json(self, batch_size: Optional[int] = None, top: int = 10) -> dict:
        """A JSON-ready dict of the figures at ``batch_size``."""
        b = self.batch_for(batch_size)
        pos = self.peak_position(b)
        return {
            "batch_size": b,
            "runtime": {"gc": self.runtime.gc, "inplace": self.runtime.inplace,
                        "device": self.runtime.device},
            "ops": len(self.op_types),
            "peak_bytes": self.peak(b),
            "peak_position": pos,
            "peak_op": self.op_types[pos] if self.op_types else None,
            "peak_formula": self.peak_formula(b),
            "persistable_bytes": self.persistable_bytes(b),
            "total_peak_bytes": self.total_peak(b),
            "breakdown_at_peak": self.breakdown(pos, b),
            "inplace_ops": len(self.inplace),
            "held_at_peak": [
                {"name": h.name, "label": h.label, "bytes": h.bytes(b), "size": str(h.size),
                 "category": h.category, "op": h.op, "position": h.position,
                 "shared_with": list(h.names[1:])}
                for h in self.held_at(pos, b)[:top]],
            "timeline": self.timeline(b),
            "dynamic_inputs": [{"name": n, "shape": shape} for n, shape in self.dynamic_inputs()],
        }

    def dynamic_inputs(self) -> list:
        """``[(name, shape)]`` of the fed inputs with more than one ``-1``
        dimension.  Every ``-1`` is taken as the batch size, so an input
        ``ids [-1, -1]`` is analysed as B x B (a sequence as long as the
        batch) and its terms grow as B^2: the figures are for that length."""
        seen: dict = {}
        for _, var in self.graph.all_vars():
            if (var.is_data or var.is_feed) and sum(1 for d in var.shape if d == -1) > 1:
                seen.setdefault(var.name, list(var.shape))
        return sorted(seen.items())

    def dynamic_inputs_note(self) -> str:
        """What :meth:`dynamic_inputs` means for the figures, or ''."""
        return dynamic_inputs_text(self.dynamic_inputs())

    def report(self, batch_size: Optional[int] = None, top: int = 5,
               budget_bytes: Optional[int] = None) -> str:
        """A human-readable summary (what ``str(analysis)`` prints)."""
        b = self.batch_for(batch_size)
        pos = self.peak_position(b)
        lines = [
            f"memory analysis at batch size {b} ({len(self.op_types)} ops; "
            f"GC {'on' if self.runtime.gc else 'off'}"
            + (f", {len(self.inplace)} ops in place" if self.inplace else "") + ")",
            f"  peak of the step      {format_bytes(self.peak(b))} at "
            f"{self._place_and_type(pos)}"
            + (f", run position {pos} (the plot's x)" if self.place(pos) != f"op {pos}"
               and not self.place(pos).startswith("run ") else ""),
            f"  as a function of B    {self.peak_formula(b)} (at that op)",
            f"  persistable           {format_bytes(self.persistable_bytes(b))}",
            f"  total                 {format_bytes(self.total_peak(b))}",
            "  at the peak: " + ", ".join(
                f"{c} {format_bytes(v)}" for c, v in self.breakdown(pos, b).items() if v),
            f"  top {top} holders at the peak:",
        ]
        shown = self.held_at(pos, b)[:top]
        width = max([24] + [len(h.label) for h in shown])   # the columns line up
        for h in shown:
            shared = f" (+{len(h.names) - 1} in place)" if len(h.names) > 1 else ""
            lines.append(f"    {h.label:<{width}} {format_bytes(h.bytes(b)):>11}  {h.category:<10} "
                         f"made by {h.op} {self._made_at(h)}{shared}")
        if self.grows_with_batch():
            curve = self.peak_curve(sorted({1, b, 2 * b, 4 * b}))
            lines.append("  peak by batch size:   " + ", ".join(
                f"B={k}: {format_bytes(v)}" for k, v in curve))
        if budget_bytes is not None:
            fits = self.max_batch_size(budget_bytes)
            what = ("any batch size (memory does not grow with it)" if fits is None
                    else "none (batch size 1 does not fit)" if fits == 0 else str(fits))
            lines.append(f"  largest batch in {format_bytes(budget_bytes)}: {what}")
        note = self.dynamic_inputs_note()
        if note:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    def to_html(self, path: str, batch_size: Optional[int] = None, *, compare: Sequence = (),
                labels: Sequence[str] = (), title: str = "") -> str:
        """Write the interactive memory page of this analysis to ``path``.

        One self-contained HTML file (no network at view time): the live
        bytes over the op sequence stacked by kind, the peak marked;
        hovering shows the op there and its largest holders (names, sizes,
        the op that made each and its last reader); a sortable table of the
        largest holders at the peak (:mod:`memopt.pages`).

        ``compare``: analyses of the same program after rewrites
        (memory_optimize, release_memory...), drawn on this one's x axis
        (its run positions, :mod:`memopt.alignment`).  ``labels`` names this
        analysis and each of ``compare`` (default ``"before"``, ``"after"``
        with one to compare, else ``program 1``, ``program 2``...).
        Sizes are at ``batch_size`` (default: this analysis's).  Returns
        ``path``.
        """
        from .pages.writer import write_page

        if not labels:
            labels = (["before", "after"] if len(compare) == 1
                      else ["program"] if not compare else [])
        return write_page(path, [self, *compare], labels=labels, batch_size=batch_size,
                          title=title)

    def dumps(self, batch_size: Optional[int] = None) -> str:
        return json.dumps(self.to_json(batch_size), indent=2, sort_keys=True)


# -- building -----------------------------------------------------------------

def dynamic_inputs_text(many: Sequence) -> str:
    """The note for ``many``, ``[(name, shape)]`` of inputs with several
    ``-1`` dimensions (each taken as the batch size), or '' for none."""
    if not many:
        return ""
    shown = ", ".join(f"{n} {s}" for n, s in many[:3]) + (" ..." if len(many) > 3 else "")
    return (f"{shown}: every -1 dimension is taken as the batch size B (a sequence as "
            "long as the batch; such terms grow as B^2); build or save the program with "
            "the other dimensions fixed (e.g. InputSpec([None, 128])) for figures at "
            "that length")


def _runtime_reads(op: Op) -> tuple:
    """What an op really needs in memory: its reads minus no-need-buffer ones."""
    shape_only = op.facts.no_need_buffer
    if not shape_only:
        return op.reads
    return tuple(n for n in op.reads if n not in shape_only)


def _runtime_graph(graph: Graph) -> Graph:
    """A copy of ``graph`` whose ops read only what they need in memory (the
    ops that read all they name shared with ``graph``)."""
    if not any(op.facts.no_need_buffer for b in graph.blocks for op in b.ops):
        return graph
    blocks = []
    for block in graph.blocks:
        new = type(block)(block.idx, block.parent, vars=block.vars)
        new.ops = [Op(op.type, _runtime_reads(op), op.writes, op.sub_blocks, op.role,
                      op.loop, op.attrs, op.facts) if op.facts.no_need_buffer else op
                   for op in block.ops]
        blocks.append(new)
    return Graph(blocks=blocks, fetch_names=graph.fetch_names)


_GRAD_NAME = re.compile(r"@GRAD")


def _category(var, role: str) -> str:
    if var.is_data or var.is_feed:
        return "input"
    if role == "backward" or _GRAD_NAME.search(var.name):
        return "gradient"
    if role == "optimize":
        return "optimizer"
    return "activation"


class _Aliases:
    """Union-find over variable names that share one buffer (in-place ops)."""

    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x: str) -> str:
        parent = self.parent
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


#: Ops that are not instructions of Paddle's executor: they make no kernel
#: call (parameters and feeds are set up in the scope before the step).
_NOT_INSTRUCTIONS = frozenset({
    "builtin.parameter", "pd_op.data", "pd_op.feed", "builtin.split", "builtin.slice",
    "builtin.shadow_output", "feed", "fetch", "cf.yield"})


def _units(graph: Graph) -> list:
    """Top-level execution units: each global-block op with the ops of its
    sub-blocks and the synthetic ops an adapter put around it
    (``facts.synthetic`` ``"before"``/``"after"``), as lists of flat
    positions in walk order."""
    units: list = []
    glue_next = False
    for pos, (block_idx, op) in enumerate(graph.walk_ops()):
        synthetic = op.facts.synthetic
        if units and (block_idx != 0 or glue_next or synthetic == "after"):
            units[-1].append(pos)
        else:
            units.append([pos])
        if block_idx == 0:
            glue_next = synthetic == "before"
    return units


def _flat_ops(graph: Graph) -> list:
    return [op for _, op in graph.walk_ops()]


def executor_order(graph: Graph, aliases: Optional[_Aliases] = None,
                   workers: int = 4) -> list:
    """The order in which Paddle's executor runs the ops, as flat positions.

    Paddle 3's executors (multi-thread mode, the default) run an op as soon
    as its inputs are ready: an op's first downstream op (lowest index)
    continues in the same task, whose queue prefers the lowest op index;
    every other downstream op that becomes ready is a new task for the work
    queue, served by ``workers`` threads (4 on CPU).  So an optimizer update
    runs soon after its gradient exists instead of at the end of the program,
    and frees the gradient then.  This emulates that schedule
    deterministically: the running tasks take turns, one op each, in the
    order they started.  Dependencies are read-after-write, write-after-read
    and write-after-write on buffers (``aliases`` joins the names an in-place
    op writes over); ops that are no instructions (parameters, feeds) come
    first.
    """
    return _run_tasks(_dependencies(graph, aliases or _Aliases()), workers)


def _dependencies(graph: Graph, aliases: _Aliases, roots: Optional[dict] = None) -> tuple:
    """``(units, downstream, deps, instruction)`` of :func:`executor_order`:
    what its schedule runs on, whatever the worker count.  ``roots``: names
    already looked up in ``aliases`` (name -> its buffer), filled in."""
    ops = _flat_ops(graph)
    units = _units(graph)
    n = len(units)
    last_writer: dict = {}
    readers: dict = {}
    upstream: list = [set() for _ in range(n)]
    instruction = []
    if roots is None:
        roots = {}  # name -> its buffer (aliases.find, looked up once per name)

    def buffer(name: str) -> str:
        root = roots.get(name)
        if root is None:
            root = roots[name] = aliases.find(name)
        return root

    # (each unit's dependencies are sets: the order the buffers are visited
    # in changes none of them)
    for u, positions in enumerate(units):
        head = ops[positions[0]]
        instruction.append(head.type not in _NOT_INSTRUCTIONS)
        if len(positions) == 1:  # most units: one op, its reads before its writes
            reads = {roots[nm] if nm in roots else buffer(nm) for nm in head.reads}
            writes = {roots[nm] if nm in roots else buffer(nm) for nm in head.writes}
        else:
            written_inside: set = set()
            reads = set()
            writes = set()
            for pos in positions:
                op = ops[pos]
                reads.update(buffer(nm) for nm in op.reads if nm not in written_inside)
                for nm in op.writes:
                    written_inside.add(nm)
                    writes.add(buffer(nm))
        for key in reads:
            w = last_writer.get(key)
            if w is not None and w != u:
                upstream[u].add(w)
            readers.setdefault(key, set()).add(u)
        for key in writes:
            for r in readers.get(key, ()):
                if r != u:
                    upstream[u].add(r)
            w = last_writer.get(key)
            if w is not None and w != u:
                upstream[u].add(w)
            last_writer[key] = u
            readers[key] = set()
    # Units that are not instructions are done before the step starts.
    downstream: list = [[] for _ in range(n)]
    deps = [0] * n
    for u in range(n):
        if not instruction[u]:
            continue  # set up before the step: scheduled up front, not by its inputs
        ups = {w for w in upstream[u] if instruction[w]}
        deps[u] = len(ups)
        for w in ups:
            downstream[w].append(u)
    for d in downstream:
        d.sort()
    return units, downstream, deps, instruction


def _run_tasks(dependencies: tuple, workers: int) -> list:
    """:func:`executor_order`'s schedule of ``dependencies`` (from
    :func:`_dependencies`, not changed) with ``workers`` threads."""
    units, downstream, deps, instruction = dependencies
    deps = list(deps)
    n = len(units)
    order: list = [u for u in range(n) if not instruction[u]]
    roots = [u for u in range(n) if instruction[u] and deps[u] == 0]

    # Round-robin over at most `workers` running tasks, one op per task per
    # step; tasks that become ready wait in a FIFO queue (the work queue).
    queue = deque([[r] for r in roots])
    active: list = []
    while queue or active:
        while len(active) < workers and queue:
            active.append(queue.popleft())
        still = []
        for heap in active:
            u = heapq.heappop(heap)
            order.append(u)
            for k, v in enumerate(downstream[u]):
                deps[v] -= 1
                if deps[v] == 0:
                    if k == 0:
                        heapq.heappush(heap, v)
                    else:
                        queue.append([v])
            if heap:
                still.append(heap)
        active = still
    if len(order) != n:  # a cycle would be a bug in the dependencies
        log.warning("executor order: %d of %d units scheduled; using program order",
                    len(order), n)
        order = list(range(n))
    return [pos for u in order for pos in units[u]]


def _reordered(graph: Graph, order: list) -> Graph:
    """``graph`` with its global block's ops in the order of ``order``
    (flat positions; sub-block ops stay with their owner), by the one
    reorderer :func:`memopt.schedule.reorder`."""
    top: dict = {}  # flat position -> index in block 0
    for pos, (block_idx, _) in enumerate(graph.walk_ops()):
        if block_idx == 0:
            top[pos] = len(top)
    return reorder(graph, [top[p] for p in order if p in top])


def _intervals(graph: Graph) -> dict:
    """Each variable's live interval (flat positions) in ``graph``: those of
    :func:`memopt.liveness.analyze_graph`, found in one pass for
    straight-line code (:func:`memopt.liveness.program_liveness`; a budget
    plan analyses hundreds of rewritten graphs).  A fetched name no op
    mentions is live through the whole step there, as the dataflow solution
    has it."""
    live = program_liveness(graph)
    if not isinstance(live, StraightLine):
        return live.intervals()
    intervals = dict(live.intervals())
    last = len(graph.blocks[0].ops) - 1
    if last >= 0:
        for name in graph.fetch_names:
            if name not in intervals:
                intervals[name] = Interval(0, last)
    return intervals


def from_graph(graph: Graph, batch_size: Optional[int] = None,
               runtime: Optional[RuntimeModel] = None,
               inplace: Sequence = (), same_variable: Sequence = ()) -> Analysis:
    """Analyse a memopt :class:`Graph` (see :func:`memopt.api.analyze`).

    ``inplace`` lists ``(position, input name, output name)``: the executor
    writes the output over the input's buffer at that op.  Ops whose
    ``facts.overwrites`` lists ``(input, output)`` pairs (Paddle's own
    in-place ops) share buffers the same way.  ``same_variable`` lists
    ``(name, name)`` pairs that are one variable of the program run (the
    versions of a legacy variable written more than once): one buffer.
    """
    return from_graph_modes(graph, batch_size, [runtime or RuntimeModel()], inplace,
                            same_variable)[0]


class _Shared:
    """What :func:`from_graph_modes` works out once per graph, whatever the
    runtime: the buffers in-place ops share (``aliases``, each name's root
    looked up once), the executor's dependencies (on first use), the graph
    with only the reads ops need in memory (:func:`_runtime_graph`), each
    variable's declaration and size, the persistable bytes.  Read from the
    graph as it is when made: an :class:`Analysis` keeps the one it was
    made with (:func:`modes_of`)."""

    def __init__(self, graph: Graph, inplace: Sequence, same_variable: Sequence) -> None:
        aliases = _Aliases()
        for _, src, dst in inplace:
            aliases.union(src, dst)
        for first, other in same_variable:
            aliases.union(first, other)
        flat = list(graph.walk_ops())
        for _, op in flat:
            for src, dst in op.facts.overwrites:
                aliases.union(src, dst)
        self.graph = graph
        self.inplace = list(inplace)
        self.aliases = aliases
        self.flat = flat
        self._dependencies: Optional[tuple] = None
        self.runtime_graph = _runtime_graph(graph)
        var_of: dict = {}
        for _, var in graph.all_vars():
            var_of.setdefault(var.name, var)
        self.var_of = var_of
        # name -> var.size (a property that computes it: read once)
        self.sizes = {name: var.size for name, var in var_of.items()}
        self.roots: dict = {}
        sizes = self.sizes
        persistable: dict = {}
        persistent_roots: dict = {}  # alias root -> largest size (counted once)
        for name, var in var_of.items():
            if var.persistable and var.is_dense:
                root = self.root(name)
                old = persistent_roots.get(root)
                if old is None or _order(sizes[name]) > _order(old):
                    persistent_roots[root] = sizes[name]
        for root_size in persistent_roots.values():
            _poly_add(persistable, root_size)
        self.persistable = persistable
        self.persistent_roots = persistent_roots
        self.per_iteration = {nm for _, op in flat if op.facts.in_loop
                              for nm in op.facts.stack_push}
        # the variables that may hold a buffer of their own, whatever the
        # order: (name, variable, buffer), in declaration order
        self.candidates = []
        for name, var in var_of.items():
            if var.persistable or not var.is_dense or sizes[name].coefficient == 0:
                continue
            root = self.root(name)
            if root in persistent_roots:
                continue  # written over a parameter: no memory of its own
            self.candidates.append((name, var, root))

    def root(self, name: str) -> str:
        """The buffer ``name`` is in (its alias root)."""
        found = self.roots.get(name)
        if found is None:
            found = self.roots[name] = self.aliases.find(name)
        return found

    def dependencies(self) -> tuple:
        """:func:`_dependencies` of the graph, worked out once."""
        if self._dependencies is None:
            self._dependencies = _dependencies(self.graph, self.aliases, self.roots)
        return self._dependencies


def from_graph_modes(graph: Graph, batch_size: Optional[int], runtimes: Sequence,
                     inplace: Sequence = (), same_variable: Sequence = ()) -> list:
    """:func:`from_graph` of ``graph`` under each of ``runtimes``, in order:
    the buffers in-place ops share and the executor's dependencies are
    worked out once for all (a budget checks each plan under three worker
    counts, level 2 each order under four executor modes)."""
    return _analyses(_Shared(graph, inplace, same_variable), batch_size, runtimes)


def modes_of(analysis: "Analysis", runtimes: Sequence) -> list:
    """:func:`from_graph_modes` of ``analysis``'s graph, batch size and
    in-place pairs under each of ``runtimes``: what it worked out about the
    graph whatever the runtime (:class:`_Shared`) is reused, so the graph
    must be as it was when ``analysis`` was made."""
    shared = analysis._shared
    if shared is None:
        return from_graph_modes(analysis.graph, analysis.batch_size, runtimes, analysis.inplace)
    return _analyses(shared, analysis.batch_size, runtimes)


def _analyses(shared: _Shared, batch_size: Optional[int], runtimes: Sequence) -> list:
    """:func:`from_graph_modes` from a graph's :class:`_Shared`."""
    graph = shared.graph
    flat = shared.flat
    var_of = shared.var_of
    sizes = shared.sizes
    per_iteration = shared.per_iteration
    fetched = set(graph.fetch_names)
    out = []
    for runtime in runtimes:
        if runtime.schedule == "dataflow":
            order = _run_tasks(shared.dependencies(), runtime.workers)
            # the reads an op needs in memory do not depend on the order
            run_graph = _reordered(shared.runtime_graph, order)
        else:
            order = list(range(len(flat)))
            run_graph = shared.runtime_graph
        positions = list(run_graph.walk_ops())
        n = len(positions)
        last = max(n - 1, 0)
        intervals = _intervals(run_graph)
        first_writer: dict = {}
        # a release op (memopt.release_memory) frees variables even with GC
        # off; what it writes besides them holds no memory
        released: dict = {}  # variable -> position of the op that releases it
        hollow: set = set()
        for pos, (_, op) in enumerate(positions):
            for name in op.writes:
                if name not in first_writer:
                    first_writer[name] = pos
            if op.facts.release:
                released.update((name, pos) for name in op.facts.release)
                hollow.update(n for n in op.writes if n not in op.facts.release)
        members: dict = {}
        for name, var, root in shared.candidates:
            if name in hollow:
                continue
            if name not in intervals and name not in first_writer and not (
                    (var.is_data or var.is_feed) and (var.is_fetch or name in fetched)):
                continue  # never written nor read; an input fetched back is held
            members.setdefault(root, []).append(name)
        holders = []
        gc = runtime.gc
        iterations = runtime.loop_iterations
        for names in members.values():
            spans = []
            for nm in names:
                var = var_of[nm]
                iv = intervals.get(nm)
                written = first_writer.get(nm)
                if iv is not None:
                    start, end = iv.start, iv.end
                else:
                    start = end = 0 if written is None else written
                # Memory is allocated by the first write: a variable written on
                # one path only (in a branch) looks live from the program's
                # start to liveness, but holds nothing before it is written.
                if written is not None and written > start:
                    start = written
                if var.is_data or var.is_feed:
                    start, end = min(start, 0), last
                elif not gc:
                    # held to the end, or to its release (a version of a legacy
                    # variable, ``name#k``, written before the release op)
                    freed_at = released.get(unversioned(nm), -1)
                    end = freed_at if (start if written is None else written) < freed_at \
                        else last
                spans.append((start, end, nm))
            if len(spans) == 1:  # most buffers: one variable
                start, end, owner = spans[0]
                held = _scaled(sizes[owner], iterations) if owner in per_iteration \
                    else sizes[owner]
            else:
                spans.sort()
                start = spans[0][0]
                end = max(e for _, e, _ in spans)
                owner = spans[0][2]
                held = max((_scaled(sizes[nm], iterations if nm in per_iteration else 1)
                            for _, _, nm in spans), key=_order)
            pos = first_writer.get(owner, start)
            op = positions[pos][1] if positions else None
            holders.append(Holder(
                name=owner, names=tuple(nm for _, _, nm in spans), size=held,
                category=_category(var_of[owner], op.role if op else "forward"),
                op=op.type if op else "-", position=pos, start=start, end=end,
                label=var_of[owner].display))
        # a kernel's scratch memory (``op.facts.workspace``, filled by the
        # adapters where known): held while the op runs
        for pos, (_, op) in enumerate(positions):
            workspace = op.facts.workspace
            if workspace is not None and workspace.coefficient:
                holders.append(Holder(
                    name=f"workspace of {op.type} at {op.attrs.get('place') or f'op {pos}'}",
                    names=(), size=workspace,
                    category="workspace", op=op.type, position=pos, start=pos, end=pos))
        if not gc and runtime.fetch_copies:
            for name in dict.fromkeys(graph.fetch_names):
                var = var_of.get(name)
                if var is None or var.persistable or not var.is_dense or not var.size.coefficient:
                    continue
                holders.append(Holder(
                    name=f"fetch copies of {name}", names=(),
                    size=_scaled(var.size, runtime.fetch_copies), category="workspace",
                    op="fetch", position=last, start=last, end=last))
        holders.sort(key=lambda h: (h.start, h.name))
        analysis = Analysis(graph=graph, batch_size=batch_size, runtime=runtime,
                            holders=holders, persistable=dict(shared.persistable),
                            op_types=[op.type for _, op in positions],
                            inplace=list(shared.inplace), order=order,
                            places=[op.attrs.get("place", "") for _, op in positions])
        analysis._shared = shared
        out.append(analysis)
    return out


def versions(graph: Graph) -> list:
    """``(name, name#k)`` for every later version of a variable in ``graph``
    (:func:`memopt.graph.versioned`): one variable of the program run, so one
    buffer (the ``same_variable`` of :func:`from_graph`)."""
    declared = {var.name for _, var in graph.all_vars()}
    return sorted((unversioned(name), name) for name in declared
                  if unversioned(name) != name and unversioned(name) in declared)
