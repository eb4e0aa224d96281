"""Lower bounds on what any memory plan can achieve.

- :func:`peak_live_bytes`: the most bytes live at one time step.  No offset
  plan (and no plan of any kind) can be lower: every live buffer needs its own
  bytes.
- :func:`whole_buffer_lower_bound`: for whole-buffer reuse (groups that each
  cost their largest member), the *sum of positional maxima*: let ``s_i(t)``
  be the ``i``-th largest size live at step ``t``; the bound is
  ``sum_i max_t s_i(t)``.  It holds because at any step the ``i`` largest
  live buffers are in ``i`` different groups, so the ``i``-th most expensive
  group costs at least ``s_i(t)`` for every ``t``.

Sizes are bytes; symbolic sizes need a ``batch_size``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .simulate import buffer_sizes, peak_live

__all__ = ["peak_live_bytes", "whole_buffer_lower_bound", "positional_maxima"]


def peak_live_bytes(buffers: Sequence, batch_size: Optional[int] = None) -> int:
    """The most bytes live at any one step (0 for no buffers)."""
    return peak_live(buffers, batch_size)


def positional_maxima(buffers: Sequence, batch_size: Optional[int] = None) -> np.ndarray:
    """``m[i] = max_t s_i(t)``: the largest ``i``-th largest live size, descending.

    Only the steps where some buffer starts need to be looked at: between two
    starts the live set only shrinks.
    """
    n = len(buffers)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sizes = buffer_sizes(buffers, batch_size)
    lowers = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=n)
    uppers = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=n)
    best = np.zeros(0, dtype=sizes.dtype)
    for t in np.unique(lowers):
        live = sizes[(lowers <= t) & (uppers > t)]
        live = -np.sort(-live)
        if len(live) > len(best):
            best = np.concatenate([best, np.zeros(len(live) - len(best), dtype=sizes.dtype)])
        best[:len(live)] = np.maximum(best[:len(live)], live)
    return best


def whole_buffer_lower_bound(buffers: Sequence, batch_size: Optional[int] = None) -> int:
    """Sum of positional maxima: no group plan costs less (see module docstring)."""
    return int(sum(int(m) for m in positional_maxima(buffers, batch_size)))
