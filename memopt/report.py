"""What :func:`memopt.memory_optimize` and :func:`memopt.release_memory` did.

A :class:`Report` is plain data: one :class:`Reuse` per variable that took
over another's memory, and a summary.  ``str(report)`` is the text
``print_log=True`` prints: the summary first, then the reuses grouped by the
memory they share (largest first), at most :data:`SHOWN_GROUPS` lines and a
count of the rest; :meth:`Report.to_json` holds everything, every reuse
included.

Sizes are bytes.  A size that grows with the batch (a ``-1`` dimension) is
kept symbolic (:class:`memopt.graph.Size`, ``c * B**k``) in the reuse lines
and in the totals (:class:`Bytes`, a sum of such terms); the estimated peaks
and the holders at the peak depend on *when* sizes are compared, so they are
evaluated at a stated reference batch size (:attr:`Report.batch_size`).

Fields of :class:`Report`
-------------------------
program_type : ``"legacy"`` or ``"pir"``.
level, skip_grads : the options the plan was made with.
runtime : the memory model planned for, e.g. ``"garbage collection on
    (FLAGS_eager_delete_tensor_gb=0.0)"``; ``gc`` is its boolean.
reuses : one :class:`Reuse` per variable that shares another's memory.
temporaries_before / temporaries_after : bytes of the distinct temporaries
    (non-persistable dense variables) before and after: every variable
    its own memory before; one block per group of merged variables after.
batch_size : the batch size the estimates below are evaluated at.
persistable_bytes : parameters and optimizer state at ``batch_size``.
peak_before / peak_after : the estimated peak (bytes, persistable included)
    under the runtime model: with GC on, a variable (a group, after) holds
    memory from its first write to its last use; with GC off, from the
    start of the run to its end.
top_holders : the five largest holders at the estimated peak after.
release : how temporaries' memory is released at run time.
not_merged : why candidates were left alone: reason -> number of variables.
seconds : wall time memory_optimize took.
notes : anything else worth saying (empty usually).
analyses : the :class:`memopt.analysis.Analysis` of the program before and
    after, where memopt made them (for :meth:`Report.to_html`; not in
    :meth:`Report.to_dict`).
operation : ``"memory_optimize"`` or ``"release_memory"``: what made the report.
released : the variables release_memory frees right after their last use
    (empty for memory_optimize, and with the garbage collector on).
labels : name -> how the user knows it, where the name is not that (PIR
    values: ``'my_sum' (%7)`` from a ``name=`` in Python, else the op that
    makes it and where, ``pd_op.add at op 6, model.py:12 (%7)``); the text
    prints labels, the other fields keep names.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from .graph import Size, as_size

#: Reference batch size for the estimates, when the caller gives none.
REFERENCE_BATCH = 32

#: Lines of reuses (one per memory shared) ``str(report)`` (print_log)
#: shows, and variables named per line; the rest are counted.
SHOWN_GROUPS, SHOWN_PER_GROUP = 12, 4

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"16GiB"`` -> 17179869184; accepts B, KB/MB/GB/TB (powers of 1000),
    KiB/MiB/GiB/TiB (powers of 1024), a bare number of bytes, and decimals
    (``"1.5GiB"``).  Raises ValueError naming the text otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a number of bytes: write e.g. "
                         "16GiB, 512MiB, 2GB or 1000000")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: int) -> str:
    """Bytes in binary units, the one byte formatter: ``1536`` -> ``"1.5 KiB"``,
    plain bytes below 1 KiB (``"12 B"``), KiB to TiB with one decimal."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{sign}{int(n)} B" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"


def format_size(size) -> str:
    """A Size (or int) as text: ``'4.0 KiB'``, ``'512 B * B'`` (per batch row)."""
    size = as_size(size)
    if size.power == 0:
        return format_bytes(size.coefficient)
    suffix = "B" if size.power == 1 else f"B^{size.power}"
    return f"{format_bytes(size.coefficient)}*{suffix}"


@dataclass(frozen=True)
class Bytes:
    """A sum of symbolic sizes: ``terms[k]`` bytes per ``B**k``."""

    terms: Tuple[Tuple[int, int], ...] = ()  # (power, coefficient), ascending power

    @classmethod
    def total(cls, sizes: Iterable) -> "Bytes":
        acc: Dict[int, int] = {}
        for size in map(as_size, sizes):
            acc[size.power] = acc.get(size.power, 0) + size.coefficient
        return cls(tuple(sorted((p, c) for p, c in acc.items() if c)))

    def at(self, batch_size: int) -> int:
        return sum(c * batch_size ** p for p, c in self.terms)

    def __str__(self) -> str:
        if not self.terms:
            return "0 B"
        return " + ".join(format_size(Size(c, p)) for p, c in self.terms)

    def to_dict(self) -> Dict[str, int]:
        """``{"B^k": coefficient}``."""
        return {f"B^{p}": c for p, c in self.terms}


@dataclass
class Reuse:
    """One variable that took over another's memory.

    ``var`` (in ``block``, of ``shape``/``dtype``/``size``) now uses the
    memory ``takes`` used before it (``takes`` died at or before the op that
    first writes ``var``); in the rewritten program both are called
    ``renamed_to`` (legacy: a fresh ``memopt@buf_<k>``, the merged names
    having left the program; PIR: the input's name).  ``how`` is ``"in-place"`` (the op that kills ``takes``
    writes ``var`` into the same memory; ``op`` names it) or ``"rename"``.
    """

    var: str
    takes: str
    renamed_to: str
    shape: tuple = ()
    dtype: str = "float32"
    size: object = 0
    block: int = 0
    how: str = "rename"
    op: str = ""

    def line(self, labels: Optional[Dict[str, str]] = None) -> str:
        """One line: the variable, its shape, dtype and size, the memory it
        took and how; names as ``labels`` maps them (see Report.labels)."""
        lab = (labels or {}).get
        shape = "[" + ", ".join(str(d) for d in self.shape) + "]"
        where = f" at {self.op}" if self.op else ""
        block = f" (block {self.block})" if self.block else ""
        name = "" if self.renamed_to == self.takes else f", now {self.renamed_to!r}"
        return (f"{lab(self.var, self.var)}{block} {shape} {self.dtype} "
                f"{format_size(self.size)} -> {lab(self.takes, self.takes)} "
                f"({self.how}{where}{name})")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["shape"] = list(self.shape)
        out["size"] = _size_json(self.size)
        return out


@dataclass
class Holder:
    """Memory held at the estimated peak: ``bytes`` under the name ``name``,
    shared by ``members`` (the variables merged into it; just ``name`` when
    nothing was)."""

    name: str
    bytes: int
    members: Tuple[str, ...] = ()


def _bytes_at(size, batch_size: int) -> int:
    return size.at(batch_size) if isinstance(size, Size) else int(size)


def _size_json(size):
    if isinstance(size, Size):
        return {"coefficient": size.coefficient, "power": size.power}
    return int(size)


@dataclass
class Report:
    """What a memory rewrite did; see the module docstring for the fields."""

    program_type: str = "legacy"
    level: int = 0
    skip_grads: bool = True
    gc: bool = True
    runtime: str = ""
    reuses: List[Reuse] = field(default_factory=list)
    temporaries_before: Bytes = field(default_factory=Bytes)
    temporaries_after: Bytes = field(default_factory=Bytes)
    batch_size: int = REFERENCE_BATCH
    persistable_bytes: int = 0
    peak_before: int = 0
    peak_after: int = 0
    top_holders: List[Holder] = field(default_factory=list)
    release: str = ""
    not_merged: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    notes: List[str] = field(default_factory=list)
    released: List[str] = field(default_factory=list)
    recomputed: List[str] = field(default_factory=list)
    added_compute_percent: float = 0.0
    budget: Optional[int] = None
    labels: Dict[str, str] = field(default_factory=dict)
    analyses: List = field(default_factory=list, repr=False, compare=False)
    operation: str = "memory_optimize"

    def label(self, name: str) -> str:
        """How the text names variable ``name`` (see :attr:`labels`)."""
        return self.labels.get(name, name)

    @property
    def merged_count(self) -> int:
        """Variables that now share another's memory."""
        return len(self.reuses)

    def summary_lines(self) -> List[str]:
        b = self.batch_size
        lines = [
            f"memopt: {self.program_type} program, level {self.level}, "
            f"skip_grads={self.skip_grads}, runtime: {self.runtime}",
            f"  merged variables: {self.merged_count} "
            f"({sum(1 for r in self.reuses if r.how == 'in-place')} in place)",
            f"  distinct temporaries: {self.temporaries_before} -> {self.temporaries_after}"
            f" (at batch {b}: {format_bytes(self.temporaries_before.at(b))} -> "
            f"{format_bytes(self.temporaries_after.at(b))})",
            f"  estimated peak at batch {b} (persistable {format_bytes(self.persistable_bytes)} "
            f"included): {format_bytes(self.peak_before)} -> {format_bytes(self.peak_after)}",
        ]
        if self.top_holders:
            lines.append("  largest holders at the peak:")
            for h in self.top_holders:
                shared = f" (shared by {len(h.members)})" if len(h.members) > 1 else ""
                lines.append(f"    {self.label(h.name)}: {format_bytes(h.bytes)}{shared}")
        if self.not_merged:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.not_merged.items()))
            lines.append(f"  left alone: {reasons}")
        if self.release:
            lines.append(f"  memory release: {self.release}")
        if self.released:
            shown = (", ".join(self.label(n) for n in self.released[:5])
                     + (", ..." if len(self.released) > 5 else ""))
            lines.append(f"  released: {len(self.released)} ({shown})")
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.append(f"  time: {self.seconds * 1000:.1f} ms")
        return lines

    def reuse_groups(self) -> List[List[Reuse]]:
        """The reuses grouped by the memory they share (block and name in the
        rewritten program), the largest memory first (at :attr:`batch_size`),
        ties by name; within a group in report order."""
        groups: Dict[Tuple[int, str], List[Reuse]] = {}
        for r in self.reuses:
            groups.setdefault((r.block, r.renamed_to), []).append(r)

        def key(item):
            (block, name), members = item
            biggest = max(_bytes_at(r.size, self.batch_size) for r in members)
            return -biggest, block, name

        return [members for _, members in sorted(groups.items(), key=key)]

    def reuse_lines(self, limit: Optional[int] = SHOWN_GROUPS) -> List[str]:
        """The reuse part of ``str(report)``: one line per memory shared, the
        largest first -- the name it has in the rewritten program, its size,
        then each variable now living there with how it got there -- at most
        ``limit`` lines (None: all) and ``... and N more`` for the rest."""
        if not self.reuses:
            return []
        groups = self.reuse_groups()
        lines = [f"  reuses ({len(self.reuses)} variables in {len(groups)} shared memories, "
                 f"largest first; shape, dtype and size of each in report.to_json()):"]
        shown = groups if limit is None else groups[:limit]
        for members in shown:
            first = members[0]
            block = f" (block {first.block})" if first.block else ""
            biggest = max(members, key=lambda r: _bytes_at(r.size, self.batch_size))
            names = [f"{self.label(r.var)} ({r.how}{' at ' + r.op if r.op else ''})"
                     for r in members[:SHOWN_PER_GROUP]]
            if len(members) > SHOWN_PER_GROUP:
                names.append(f"+{len(members) - SHOWN_PER_GROUP} more")
            lines.append(f"    {self.label(first.renamed_to)}{block} "
                         f"{format_size(biggest.size)} <- " + ", ".join(names))
        rest = groups[len(shown):]
        if rest:
            lines.append(f"    ... and {sum(len(m) for m in rest)} more in {len(rest)} "
                         "shared memories (report.to_json() lists every reuse)")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.summary_lines() + self.reuse_lines())

    def to_dict(self) -> dict:
        return {
            "program_type": self.program_type,
            "level": self.level,
            "skip_grads": self.skip_grads,
            "gc": self.gc,
            "runtime": self.runtime,
            "merged_count": self.merged_count,
            "reuses": [r.to_dict() for r in self.reuses],
            "temporaries_before": self.temporaries_before.to_dict(),
            "temporaries_after": self.temporaries_after.to_dict(),
            "batch_size": self.batch_size,
            "persistable_bytes": self.persistable_bytes,
            "peak_before": self.peak_before,
            "peak_after": self.peak_after,
            "top_holders": [asdict(h) for h in self.top_holders],
            "release": self.release,
            "not_merged": dict(sorted(self.not_merged.items())),
            "seconds": self.seconds,
            "notes": list(self.notes),
            "released": list(self.released),
            "recomputed": list(self.recomputed),
            "added_compute_percent": self.added_compute_percent,
            "budget": self.budget,
            "labels": dict(sorted(self.labels.items())),
            "operation": self.operation,
        }

    def what(self) -> str:
        """What was done, as the page labels the program after it:
        ``"memory_optimize(level=2, budget=8.0 MiB)"``, ``"release_memory"``."""
        if self.operation == "release_memory":
            return "release_memory"
        extra = f", budget={format_bytes(self.budget)}" if self.budget is not None else ""
        return f"memory_optimize(level={self.level}{extra})"

    def to_html(self, path: str, title: str = "") -> str:
        """Write the memory page of the program before and after this
        rewrite to ``path`` (see :meth:`memopt.analysis.Analysis.to_html`):
        both on the original program's op positions, at :attr:`batch_size`,
        what memopt added (recomputed ops, release and bookkeeping ops) and
        the buffers values now share shown.  Returns ``path``.

        Raises ValueError when the report holds no analyses
        (:attr:`analyses`: memopt did not analyse the program, e.g.
        release_memory on a legacy program): then call
        ``memopt.analyze(program)`` before and after and
        ``before.to_html(path, compare=[after])``.
        """
        if len(self.analyses) < 2:
            raise ValueError(
                f"this report of {self.what()} holds no analyses of the program before and "
                "after: call memopt.analyze(program) before and after the rewrite and "
                "before.to_html(path, compare=[after])")
        from .pages.writer import write_page

        return write_page(path, self.analyses, labels=["before", f"after {self.what()}"],
                          batch_size=self.batch_size, notes=list(self.notes),
                          title=title or f"memory of one step before and after {self.what()}, "
                                         f"batch {self.batch_size}")

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The report as JSON (the fields of :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)
