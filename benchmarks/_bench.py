"""What every benchmark of benchmarks/ shares: timing, medians, MiB and markdown tables.

- :func:`median_time` runs a function ``repeat`` times and gives the median
  wall-clock and CPU seconds (this process); :func:`median_seconds` the wall
  median alone; :class:`Stopwatch` times one block (wall and CPU).
- :func:`median` is ``statistics.median`` (None for no values).
- :func:`mib` is bytes in MiB (2**20 bytes), as a float.
- :class:`Table` prints a markdown table: the header and its alignment row
  when made, then one line per :meth:`Table.row`.
- :func:`run_worker` runs the script's ``--worker`` mode in a fresh process
  (one configuration per process) and returns the JSON line it printed.

Benchmarks import it as ``import _bench`` (``python benchmarks/x.py`` puts
benchmarks/ first on ``sys.path``; the scripts of scripts/ add it).  Nothing
here knows a figure: every number a table shows is measured by the script in
the run that prints it.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

__all__ = ["median_time", "median_seconds", "median", "mib", "Stopwatch", "Table", "run_worker"]

MIB = float(1 << 20)


def median_time(fn: Callable[[], Any], repeat: int = 1) -> Tuple[float, float]:
    """Median wall-clock and median CPU seconds (this process) of ``fn()``
    over ``repeat`` runs (at least one)."""
    wall: List[float] = []
    cpu: List[float] = []
    for _ in range(max(1, repeat)):
        with Stopwatch() as clock:
            fn()
        wall.append(clock.wall)
        cpu.append(clock.cpu)
    return statistics.median(wall), statistics.median(cpu)


def median_seconds(fn: Callable[[], Any], repeat: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeat`` runs."""
    return median_time(fn, repeat)[0]


def median(values: Iterable[float]) -> Optional[float]:
    """The median of ``values``; None when there are none."""
    values = list(values)
    return statistics.median(values) if values else None


def mib(n: float) -> float:
    """Bytes in MiB (2**20 bytes)."""
    return n / MIB


class Stopwatch:
    """``with Stopwatch() as clock: ...`` then ``clock.wall`` / ``clock.cpu``
    (seconds: wall-clock, and CPU of this process)."""

    def __enter__(self) -> "Stopwatch":
        self.wall = self.cpu = 0.0
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


class Table:
    """A markdown table printed as it goes.

    ``columns`` are the header cells; ``align`` one of ``"l"``, ``"r"``,
    ``"c"`` per column (default: left).  The header and the alignment row
    are printed when the table is made; :meth:`row` prints one line.
    """

    _RULE = {"l": "---", "r": "---:", "c": ":---:"}

    def __init__(self, columns: Sequence[str], align: Optional[str] = None,
                 out: Callable[[str], Any] = print) -> None:
        align = align or "l" * len(columns)
        if len(align) != len(columns):
            raise ValueError(f"{len(columns)} columns but {len(align)} alignments")
        self.width = len(columns)
        self.out = out
        out("| " + " | ".join(columns) + " |")
        out("|" + "|".join(self._RULE[a] for a in align) + "|")

    def row(self, *cells: Any) -> None:
        if len(cells) != self.width:
            raise ValueError(f"a row of {len(cells)} cells in a table of {self.width} columns")
        self.out("| " + " | ".join(str(c) for c in cells) + " |")


def run_worker(script: str, args: Sequence[Any], env: Optional[dict] = None,
               timeout: float = 1800, flag: str = "--worker",
               python: Optional[str] = None) -> dict:
    """Run ``script --worker *args`` in a fresh Python process (Paddle's
    logging quiet, ``env`` added to the environment) and return the last
    JSON object it printed on a line of its own; ``{"error": ...}`` with
    the last line of its stderr if it printed none (a crash), or on a
    timeout (:func:`memopt.testing.workers.run_worker`)."""
    from memopt.testing import workers

    return workers.run_worker(script, args, env, timeout=timeout, flag=flag, python=python)
