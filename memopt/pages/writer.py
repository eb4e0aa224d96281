"""Write the memory page of analyses to a file (the thin callers' one entry)."""
from __future__ import annotations

from collections.abc import Sequence

from .model import lane, page
from .render import write

__all__ = ["write_lanes", "write_page"]


def write_page(path: str, analyses: Sequence, *, labels: Sequence[str] = (),
               batch_size: int | None = None, title: str = "",
               notes: Sequence[str] = ()) -> str:
    """Write the memory page of ``analyses`` (the first the reference whose
    run positions are the x axis, the others rewrites of the same program)
    to ``path`` at ``batch_size`` (default: the first analysis's); returns
    ``path``."""
    if not analyses:
        raise ValueError("write_page needs at least one analysis")
    b = analyses[0].batch_for(batch_size)
    runtime = analyses[0].runtime
    subtitle = (f"batch {b}; {len(analyses[0].op_types)} ops; garbage collector "
                f"{'on' if runtime.gc else 'off'}; sizes in bytes at batch {b}")
    data = page([lane(analyses, labels, b)], title=title or f"memory of one step, batch {b}",
                subtitle=subtitle, batch_size=b, notes=notes)
    return write(data, path)


def write_lanes(path: str, lanes: Sequence, *, batch_size: int, title: str,
                notes: Sequence[str] = ()) -> str:
    """Write a page of several lanes to ``path``: ``lanes`` lists ``(title,
    analyses, labels)``, each drawn as :func:`write_page` draws its
    analyses, one under the other (e.g. one program under Paddle's default
    runtime and with the garbage collector off; the ranks of a parallel
    run).  Sizes at ``batch_size``; returns ``path``."""
    if not lanes:
        raise ValueError("write_lanes needs at least one lane")
    drawn = [lane(analyses, labels, batch_size, lane_title)
             for lane_title, analyses, labels in lanes]
    return write(page(drawn, title=title, subtitle=f"sizes in bytes at batch {batch_size}",
                      batch_size=batch_size, notes=notes), path)
