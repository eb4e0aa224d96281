"""The Reports of memory_optimize and release_memory, built from plans.

:func:`estimate` and :func:`peak_and_holders` give the peaks (bytes at a
batch size, persistable variables included) of a plan under the garbage
collector's model (:func:`memopt.simulate.group_timeline`);
:func:`peak_holding` the same for release points;
:func:`make_report` / :func:`release_report` / :func:`pir_report` /
:func:`pir_release_report` turn plans into :class:`memopt.report.Report`.
Imports no Paddle: plans and analyses come in as plain data.
"""
from __future__ import annotations

from typing import Iterable, List, Mapping, Optional

from .graph import Size, as_size, size_at
from .plan import Options, Plan
from .problems import Buffer
from .report import REFERENCE_BATCH, Bytes, Holder, Report
from .simulate import group_timeline

__all__ = ["estimate", "peak_and_holders", "peak_holding", "make_report", "release_report",
           "pir_report", "pir_release_report"]


class _Groups:
    def __init__(self, groups) -> None:
        self.groups = groups


def estimate(plan: Plan, gc: bool, batch_size: int = REFERENCE_BATCH):
    """``(peak before, peak after, top holders after)`` in bytes at
    ``batch_size``, persistable variables included, under the GC model."""
    persist = sum(as_size(s).at(batch_size) for s in plan.persistable)
    buffers = plan.buffers
    grouped = set()
    after = []
    for group in plan.groups:
        after.append([buffers[n] for n in group])
        grouped.update(group)
    after.extend([b] for n, b in buffers.items() if n not in grouped)
    before = [[b] for b in (plan.before or buffers).values()]
    if not buffers:
        return persist, persist, []
    peak_before = group_timeline(_Groups(before), gc=gc, batch_size=batch_size).peak
    peak_after, holders = peak_and_holders(after, gc, batch_size)
    return persist + peak_before, persist + peak_after, holders


def peak_and_holders(groups: List[List[Buffer]], gc: bool, batch_size: int):
    """``(peak bytes, the five largest holders at the peak)`` of ``groups``
    (each holding its largest member's bytes, see
    :func:`memopt.simulate.group_timeline`) at ``batch_size``; with ``gc``
    off every group holds its memory at the peak."""
    timeline = group_timeline(_Groups(groups), gc=gc, batch_size=batch_size)
    step = timeline.peak_step
    holders = []
    for group in groups:
        lo = min(b.lower for b in group)
        hi = max(b.upper for b in group)
        if step is None or not gc or lo <= step < hi:
            size = max(as_size(b.size).at(batch_size) for b in group)
            holders.append(Holder(str(group[0].id), size, tuple(str(b.id) for b in group)))
    holders.sort(key=lambda h: (-h.bytes, h.name))
    return timeline.peak, holders[:5]


def peak_holding(buffers: Mapping[str, Buffer], freed: Iterable[str],
                 persistable: Iterable[Size], batch_size: int):
    """``(peak, top five holders at the peak)`` in bytes at ``batch_size``,
    persistable variables included, when every temporary holds its memory
    from its first write to the end of the run (the garbage collector off)
    except those in ``freed``, which hold it to their last use."""
    persist = sum(int(size_at(s, batch_size)) for s in persistable)
    if not buffers:
        return persist, []
    end = max(b.upper for b in buffers.values())
    freed = set(freed)
    held = [[Buffer(b.id, b.lower, b.upper if name in freed else end, b.size)]
            for name, b in buffers.items()]
    peak, holders = peak_and_holders(held, True, batch_size)
    return persist + peak, holders


def make_report(plan: Plan, options: Options, runtime: str, program_type: str,
                seconds: float, batch_size: int = REFERENCE_BATCH, release: str = "",
                notes: Optional[List[str]] = None) -> Report:
    """The :class:`Report` of a checked plan."""
    if plan.estimates is not None and batch_size == REFERENCE_BATCH:
        peak_before, peak_after, holders = plan.estimates
    else:
        peak_before, peak_after, holders = estimate(plan, plan.gc, batch_size)
    sizes = {n: as_size(b.size) for n, b in plan.buffers.items()}
    merged_away = {name for group in plan.groups for name in group[1:]}
    return Report(
        program_type=program_type, level=options.level, skip_grads=options.skip_grads,
        gc=plan.gc, runtime=runtime, reuses=list(plan.reuses),
        temporaries_before=Bytes.total(sizes.values()),
        temporaries_after=Bytes.total(s for n, s in sizes.items() if n not in merged_away),
        batch_size=batch_size,
        persistable_bytes=sum(as_size(s).at(batch_size) for s in plan.persistable),
        peak_before=peak_before, peak_after=peak_after, top_holders=holders,
        release=release or _release_text(plan.gc), not_merged=dict(plan.reasons),
        seconds=seconds, notes=_notes(plan) + list(notes or []))


def _notes(plan: Plan) -> List[str]:
    if not plan.moved:
        return list(plan.notes)
    return list(plan.notes) + [f"moved {plan.moved} optimizer ops up to right after their gradients are "
            "complete, so each gradient dies at once (bit-identical: every dependency "
            "is kept)"]


def _release_text(gc: bool) -> str:
    if gc:
        return ("Paddle's eager-deletion garbage collector frees each temporary right "
                "after its last use (no release ops needed)")
    return ("garbage collection is off: temporaries are held until the run ends; "
            "memopt.release_memory(program) frees each right after its last use "
            "(or set FLAGS_eager_delete_tensor_gb=0 with paddle.set_flags)")


def release_report(plan, released: List[str], ops: int, options: Options, gc: bool,
                   runtime: str, program_type: str, seconds: float,
                   batch_size: int = REFERENCE_BATCH) -> Report:
    """The :class:`Report` of release_memory: ``plan`` a
    :class:`memopt.release.ReleasePlan`, ``released`` the names it freed with
    ``ops`` release ops (none with the garbage collector on: it frees them)."""
    sizes = [as_size(b.size) for b in plan.buffers.values()]
    every = list(plan.buffers)
    if gc:
        before = after = peak_holding(plan.buffers, every, plan.persistable, batch_size)
        text = _release_text(True)
    else:
        before = peak_holding(plan.buffers, plan.already, plan.persistable, batch_size)
        after = peak_holding(plan.buffers, [*plan.already, *released], plan.persistable,
                             batch_size)
        text = (f"garbage collection is off: {len(released)} temporaries are freed right "
                f"after their last use by {ops} release ops (share_buffer from an empty "
                "variable: Paddle 3 has no delete_var op); the others are held until the "
                "run ends")
        if plan.already:
            text += f"; {len(plan.already)} were released before"
    kept = sorted(options.skip_opt_set & set(plan.buffers))
    notes = [f"kept by skip_opt_set: {', '.join(kept)}"] if kept else []
    return Report(
        program_type=program_type, level=options.level, skip_grads=False, gc=gc,
        runtime=runtime, temporaries_before=Bytes.total(sizes),
        temporaries_after=Bytes.total(sizes), batch_size=batch_size,
        persistable_bytes=sum(as_size(s).at(batch_size) for s in plan.persistable),
        peak_before=before[0], peak_after=after[0], top_holders=after[1], release=text,
        not_merged=dict(plan.reasons), seconds=seconds, notes=notes, released=list(released),
        operation="release_memory")


def _pir_release_text(gc: bool) -> str:
    if gc:
        return "Paddle's garbage collector frees each value right after its last use"
    return ("garbage collection is off: values are held until the run ends; set "
            "FLAGS_eager_delete_tensor_gb=0 to free each one after its last use")


def _temporaries_of(graph) -> dict:
    """``{name: size}`` of the non-persistable dense variables of ``graph``."""
    return {var.name: var.size for _, var in graph.all_vars()
            if var.is_dense and not var.persistable}


def pir_report(graph, before, after, reuses, reasons, changed: int, options: Options,
               gc: bool, runtime: str, batch_size: int, seconds: float) -> Report:
    """The :class:`Report` of memory_optimize on a PIR program: ``graph`` the
    program as read, ``before`` / ``after`` its :class:`memopt.analysis.Analysis`
    before and after ``changed`` ops were turned into in-place variants
    (``reuses`` one :class:`Reuse` per pair, ``reasons`` why other ops were
    left alone)."""
    temps = _temporaries_of(graph)
    shared = {r.var for r in reuses}
    held = after.held_at()[:5]
    holders = [Holder(h.name, h.bytes(batch_size), tuple(h.names)) for h in held]
    notes = [f"{len(before.inplace)} ops of the top-level block already run in place "
             "by Paddle's executor (its in-place pass); memopt changed "
             f"{changed} op{'s' if changed != 1 else ''} to in-place variants"]
    return Report(
        program_type="pir", level=options.level, skip_grads=options.skip_grads, gc=gc,
        runtime=runtime, reuses=list(reuses),
        temporaries_before=Bytes.total(temps.values()),
        temporaries_after=Bytes.total(s for n, s in temps.items() if n not in shared),
        batch_size=batch_size, persistable_bytes=before.persistable_bytes(batch_size),
        peak_before=before.total_peak(batch_size), peak_after=after.total_peak(batch_size),
        top_holders=holders, release=_pir_release_text(gc), not_merged=dict(reasons),
        seconds=seconds, notes=notes, labels=_labels(graph, reuses, held))


def _labels(graph, reuses, held) -> dict:
    """name -> how the user knows it (:attr:`memopt.graph.Var.display`), for
    the values the report names: the reuses' from ``graph`` (the program as
    it was), the holders' (``held``, analysis Holders) from the program as
    rewritten; names that say it all are left out."""
    display = {var.name: var.display for _, var in graph.all_vars()}
    out = {h.name: h.label for h in held if h.label != h.name}
    for name in sorted({n for r in reuses for n in (r.var, r.takes, r.renamed_to)}):
        if display.get(name, name) != name:
            out[name] = display[name]
    return dict(sorted(out.items()))


def pir_release_report(graph, analysis, kept: List[str], gc: bool, runtime: str,
                       seconds: float) -> Report:
    """The :class:`Report` of release_memory on a PIR program (nothing
    inserted: Paddle's collector frees values), ``analysis`` its
    :class:`memopt.analysis.Analysis` at :data:`REFERENCE_BATCH`."""
    temps = Bytes.total(_temporaries_of(graph).values())
    return Report(program_type="pir", gc=gc, runtime=runtime, temporaries_before=temps,
                  temporaries_after=temps, batch_size=REFERENCE_BATCH,
                  persistable_bytes=analysis.persistable_bytes(),
                  peak_before=analysis.total_peak(), peak_after=analysis.total_peak(),
                  release=_pir_release_text(gc), seconds=seconds,
                  notes=[f"kept by skip_opt_set: {', '.join(kept)}"] if kept else [],
                  operation="release_memory")
