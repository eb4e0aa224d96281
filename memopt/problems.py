"""Interval problems: the input of every memory planner in memopt.

A :class:`Buffer` is a block of ``size`` bytes that must hold its value over
the half-open range of time steps ``[lower, upper)`` (op positions: the buffer
is live at step ``t`` exactly when ``lower <= t < upper``).  A
:class:`Problem` is a list of buffers, optionally with the ``capacity`` (bytes)
a plan must fit in.

Two buffers *overlap in time* when ``a.lower < b.upper and b.lower < a.upper``;
only such buffers may not share memory.

The CSV format is the one of the MiniMalloc benchmark problems::

    id,lower,upper,size
    0,995328,1000448,656384

with one buffer per row.  :func:`read_csv` rejects malformed files with a
:class:`~memopt.errors.ProblemFormatError` naming the file, the row and the
fix; :func:`write_csv` writes the same format.

Sizes are bytes: a plain ``int``, or a :class:`memopt.graph.Size` when the
size grows with a symbolic batch dimension (see :func:`problem_from_graph`).

This module imports neither Paddle nor TensorFlow.
"""
from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Optional, Union

from .errors import ProblemFormatError
from .graph import Size, size_at

__all__ = [
    "Buffer",
    "Problem",
    "read_csv",
    "write_csv",
    "problem_from_graph",
    "size_at",
    "CSV_COLUMNS",
]

#: The columns of the CSV format, in the order :func:`write_csv` writes them.
CSV_COLUMNS = ("id", "lower", "upper", "size")

SizeLike = Union[int, Size]


@dataclass(frozen=True)
class Buffer:
    """A buffer of ``size`` bytes live over the time steps ``[lower, upper)``.

    Attributes
    ----------
    id : any hashable; an int in CSV problems, the variable name for programs.
    lower : first time step the buffer occupies (inclusive, an op position).
    upper : end of its lifetime (exclusive); ``upper > lower``.
    size : bytes, an ``int >= 0`` or a :class:`memopt.graph.Size`.

    A malformed buffer raises :class:`~memopt.errors.ProblemFormatError`.
    """

    id: Hashable
    lower: int
    upper: int
    size: SizeLike

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProblemFormatError(
                    f"buffer {self.id!r}: {name} must be an int time step, got {value!r}")
        if self.upper <= self.lower:
            raise ProblemFormatError(
                f"buffer {self.id!r}: its interval [{self.lower}, {self.upper}) is "
                "empty or reversed; upper is exclusive and must be greater than lower")
        size = self.size
        if isinstance(size, Size):
            if size.coefficient < 0 or size.power < 0:
                raise ProblemFormatError(f"buffer {self.id!r}: negative size {size}")
        elif not isinstance(size, int) or isinstance(size, bool):
            raise ProblemFormatError(
                f"buffer {self.id!r}: size must be an int number of bytes or a "
                f"memopt.graph.Size, got {size!r}")
        elif size < 0:
            raise ProblemFormatError(
                f"buffer {self.id!r}: negative size {size}; sizes are bytes >= 0")

    def overlaps(self, other: "Buffer") -> bool:
        """True when the two buffers are live at some common time step."""
        return self.lower < other.upper and other.lower < self.upper

    def bytes(self, batch_size: Optional[int] = None) -> int:
        """Size in bytes (a symbolic size needs ``batch_size``)."""
        return size_at(self.size, batch_size)


@dataclass
class Problem:
    """Buffers to place, and optionally the ``capacity`` (bytes) to fit in.

    ``name`` is a label for reports (for CSV problems, the file's stem).
    """

    buffers: list = field(default_factory=list)
    capacity: Optional[int] = None
    name: str = ""

    def __post_init__(self) -> None:
        self.buffers = list(self.buffers)
        seen: dict = {}
        for i, buf in enumerate(self.buffers):
            if not isinstance(buf, Buffer):
                raise ProblemFormatError(
                    f"problem {self.name!r}: item {i} is {type(buf).__name__}, "
                    "not a memopt.problems.Buffer")
            if buf.id in seen:
                raise ProblemFormatError(
                    f"problem {self.name!r}: buffer id {buf.id!r} appears twice "
                    f"(items {seen[buf.id]} and {i}); ids must be unique")
            seen[buf.id] = i
        if self.capacity is not None and (not isinstance(self.capacity, int)
                                          or self.capacity < 0):
            raise ProblemFormatError(
                f"problem {self.name!r}: capacity must be an int >= 0 or None, "
                f"got {self.capacity!r}")

    def __len__(self) -> int:
        return len(self.buffers)

    @property
    def symbolic(self) -> bool:
        """True when some size depends on the batch size."""
        return any(isinstance(b.size, Size) and b.size.power > 0 for b in self.buffers)

    def at_batch(self, batch_size: int) -> "Problem":
        """The same problem with every size in plain bytes at ``batch_size``."""
        return Problem([Buffer(b.id, b.lower, b.upper, size_at(b.size, batch_size))
                        for b in self.buffers], self.capacity, self.name)

    @property
    def horizon(self) -> int:
        """One past the last time step any buffer occupies (0 if empty)."""
        return max((b.upper for b in self.buffers), default=0)


# -- CSV ---------------------------------------------------------------------

_CAPACITY_IN_NAME = re.compile(r"^(?P<name>.+)\.(?P<capacity>\d+)$")


def _parse_int(text: str, column: str, where: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ProblemFormatError(
            f"{where}: column {column!r} must be an integer, got {text!r}") from None


def read_csv(path: Union[str, os.PathLike], capacity: Optional[int] = None) -> Problem:
    """Read a problem from a CSV file with the header ``id,lower,upper,size``.

    Parameters
    ----------
    path : the file.  Columns may come in any order; all four are required and
        no other column is accepted (an ``alignment`` or ``gaps`` column would
        be a constraint this planner does not model).
    capacity : bytes the plan must fit in (an int or a string such as
        ``"64MiB"``).  When None and the file is named
        ``<name>.<number>.csv`` (as the MiniMalloc problems are), the number
        is the capacity; otherwise there is none.

    Returns
    -------
    Problem
        Buffers in file order; integer ids become ints.

    Raises
    ------
    ProblemFormatError
        Missing/unknown columns, a row with the wrong number of fields, a
        non-integer value, a negative size, an empty or reversed interval or a
        duplicate id; the message names the file and the row (1 = header).
    """
    if capacity is not None:
        from .arguments import as_bytes

        capacity = as_bytes(capacity, "capacity", allow_zero=True)
    path = os.fspath(path)
    stem = os.path.basename(path)
    if stem.lower().endswith(".csv"):
        stem = stem[:-4]
    name = stem
    match = _CAPACITY_IN_NAME.match(stem)
    if match:
        name = match.group("name")
        if capacity is None:
            capacity = int(match.group("capacity"))
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise ProblemFormatError(f"cannot read problem file {path!r}: {exc}") from None
    with handle:
        reader = csv.reader(_text_lines(handle, path))
        header = next(reader, None)
        if header is None:
            raise ProblemFormatError(
                f"{path}: the file is empty; expected the header {','.join(CSV_COLUMNS)}")
        columns = [h.strip().lower() for h in header]
        missing = [c for c in CSV_COLUMNS if c not in columns]
        unknown = [c for c in columns if c not in CSV_COLUMNS]
        if missing or unknown or len(set(columns)) != len(columns):
            raise ProblemFormatError(
                f"{path}, row 1: bad header {header!r}: expected exactly the columns "
                f"{','.join(CSV_COLUMNS)} (any order)"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else ""))
        index = {c: columns.index(c) for c in CSV_COLUMNS}
        buffers = []
        first_row: dict = {}
        for rowno, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue  # blank line
            where = f"{path}, row {rowno}"
            if len(row) != len(columns):
                raise ProblemFormatError(
                    f"{where}: {len(row)} fields, expected {len(columns)} "
                    f"({','.join(columns)})")
            raw_id = row[index["id"]].strip()
            try:
                buf_id: Hashable = int(raw_id)
            except ValueError:
                buf_id = raw_id
            if buf_id == "":
                raise ProblemFormatError(f"{where}: empty id")
            lower = _parse_int(row[index["lower"]], "lower", where)
            upper = _parse_int(row[index["upper"]], "upper", where)
            size = _parse_int(row[index["size"]], "size", where)
            if size < 0:
                raise ProblemFormatError(
                    f"{where}: buffer {buf_id!r} has negative size {size}; "
                    "sizes are bytes >= 0")
            if upper <= lower:
                raise ProblemFormatError(
                    f"{where}: buffer {buf_id!r} has the empty or reversed interval "
                    f"[{lower}, {upper}); intervals are half-open, upper > lower")
            if buf_id in first_row:
                raise ProblemFormatError(
                    f"{where}: duplicate id {buf_id!r} (first on row "
                    f"{first_row[buf_id]}); ids must be unique")
            first_row[buf_id] = rowno
            buffers.append(Buffer(buf_id, lower, upper, size))
    return Problem(buffers, capacity, name)


def _text_lines(handle, path: str):
    """The file's lines; a file that is not UTF-8 text raises
    :class:`ProblemFormatError` naming it (not a bare UnicodeDecodeError)."""
    try:
        yield from handle
    except UnicodeDecodeError as exc:
        raise ProblemFormatError(
            f"{path} is not a UTF-8 text file ({exc.reason}); expected "
            f"CSV rows {','.join(CSV_COLUMNS)}") from None


def write_csv(problem: Problem, path: Union[str, os.PathLike]) -> None:
    """Write ``problem`` as ``id,lower,upper,size`` rows (read back by :func:`read_csv`).

    Symbolic sizes cannot be written: call ``problem.at_batch(n)`` first.
    The capacity is not stored in the file; name the file
    ``<name>.<capacity>.csv`` to keep it.
    """
    rows = []
    for buf in problem.buffers:
        if isinstance(buf.size, Size) and buf.size.power > 0:
            raise ProblemFormatError(
                f"buffer {buf.id!r} has the symbolic size {buf.size}; "
                "write problem.at_batch(batch_size) instead")
        rows.append((buf.id, buf.lower, buf.upper, size_at(buf.size)))
    with open(os.fspath(path), "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows(rows)


# -- from a program ------------------------------------------------------------

def problem_from_graph(graph, batch_size: Optional[int] = None, *,
                       include_persistable: bool = False,
                       names: Optional[Iterable[str]] = None) -> Problem:
    """The buffers of a :class:`memopt.graph.Graph`: one per dense variable.

    Each variable's live interval (from :func:`memopt.liveness.analyze_graph`,
    inclusive op positions) becomes the half-open ``[start, end + 1)``.

    Parameters
    ----------
    graph : the program model.
    batch_size : when given, every size is plain bytes at that batch size;
        when None, sizes that depend on the batch stay :class:`Size` and fixed
        sizes are ints.
    include_persistable : also include parameters and optimizer state (they
        are live for the whole run, so a planner gains nothing from them).
    names : only these variables (default: every dense variable with a live
        interval and a non-zero size).

    Returns
    -------
    Problem
        Buffers ordered by ``(lower, name)``; ids are variable names.
    """
    from .liveness import analyze_graph  # local: liveness is only needed here

    intervals = analyze_graph(graph).intervals()
    declared: dict = {}
    for _, var in graph.all_vars():
        declared.setdefault(var.name, var)  # the global block's wins
    wanted = None if names is None else set(names)
    buffers = []
    for name, interval in intervals.items():
        var = declared.get(name)
        if var is None or not var.is_dense:
            continue
        if wanted is not None and name not in wanted:
            continue
        if var.persistable and not include_persistable:
            continue
        size = var.size
        if size.coefficient == 0:
            continue
        if batch_size is not None:
            value: SizeLike = size.at(batch_size)
        elif size.power == 0:
            value = size.coefficient
        else:
            value = size
        lower, upper = interval.half_open
        buffers.append(Buffer(name, lower, upper, value))
    buffers.sort(key=lambda b: (b.lower, str(b.id)))
    return Problem(buffers, None, "")
