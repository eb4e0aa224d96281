"""Write the memory page of analyses to a file (the thin callers' one entry)."""
from __future__ import annotations

from collections.abc import Sequence

from .model import lane, page
from .render import write

__all__ = ["write_page"]


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
