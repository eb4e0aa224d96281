"""The largest batch size that passes a check, found with few checks.

:func:`largest_passing` is the one search behind every "largest batch"
memopt states: :meth:`memopt.analysis.Analysis.max_batch_size` (the check:
the step's peak at that batch fits) and, for ``budget=``,
:class:`memopt.errors.BudgetError`'s ``largest_batch`` and
``max_batch_size(recompute=True)`` (the check: planning at that batch, as
``memory_optimize`` does, returns a plan: :mod:`memopt.paddle.pir.budget`).
A check may be expensive (a planning takes seconds), so the search starts
from a guess, gallops away from it and bisects, and remembers every answer.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

__all__ = ["largest_passing"]


def largest_passing(passes: Callable[[int], bool], start: int = 1, limit: int = 1 << 30,
                    known: Optional[Dict[int, bool]] = None) -> int:
    """The largest batch ``n`` in ``1..limit`` found with ``passes(n)`` true
    and ``passes(n + 1)`` false (or ``n == limit``); 0 when ``passes(1)`` is
    false.

    Every figure returned was checked: ``passes(n)`` ran and said true.  The
    search starts at ``start`` (a guess, clamped to ``1..limit``), gallops up
    (``start + 1``, ``+ 2``, ``+ 4``, ...) while the check passes or down
    (``start - 1``, ``- 2``, ...) until it does, then bisects between the
    last batch that passed and the first that failed.  When the check is
    monotone (a batch passes whenever a larger one does: memory grows with
    the batch) ``n`` is the largest batch that passes; when it is not,
    ``n`` still passes and ``n + 1`` still fails, but a larger batch might
    pass.  ``known`` (batch -> answer) seeds the memo, e.g. a batch already
    refused; it is filled with every answer the search gets.

    A good guess costs about two checks (``start`` passes, ``start + 1``
    fails); a guess ``d`` away about ``2 log2(d)``.
    """
    if limit < 1:
        return 0
    memo: Dict[int, bool] = known if known is not None else {}

    def check(n: int) -> bool:
        if n not in memo:
            memo[n] = bool(passes(n))
        return memo[n]

    n = min(max(int(start), 1), limit)
    if check(n):
        lo, step = n, 1  # lo passes; look for a failing hi above it
        while True:
            hi = lo + step
            if hi > limit:
                if lo == limit or check(limit):
                    return limit
                hi = limit
                break
            if not check(hi):
                break
            lo, step = hi, step * 2
    else:
        hi, step = n, 1  # hi fails; look for a passing lo below it
        while True:
            lo = hi - step
            if lo < 1:
                if hi == 1 or not check(1):
                    return 0
                lo = 1
                break
            if check(lo):
                break
            hi, step = lo, step * 2
    while hi - lo > 1:  # lo passes, hi fails
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if check(mid) else (lo, mid)
    return lo
