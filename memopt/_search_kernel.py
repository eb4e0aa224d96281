"""The hot loops of the arena search (:class:`memopt.arena.CanonicalSearch`).

Two recursive functions, one per branching rule -- :func:`solve_range`
(lowest section first, with a memo) and :func:`place_in_order` (MiniMalloc's
order of placements) -- written in the subset of Python that numba compiles:
scalar loops over int64 numpy arrays, no Python objects.  When numba imports
they are compiled (``njit(cache=True)``: the machine code is cached next to
this file, or in numba's user-wide cache where that is read-only, so only the
first process on a machine pays the compile); without numba the very same
functions run as plain Python -- identical results, 50 to 120 times
slower (measured on problem E: 2,300 against 118,000 nodes/s for
:func:`solve_range`, 250 against 30,000 for :func:`place_in_order`).  :data:`JIT` says which.

The search itself (what a node does, why it is complete) is described in
:class:`memopt.arena.CanonicalSearch`; this module only holds its data layout:

Static arrays (buffers numbered in order of their first section)

``s0, s1``      sections ``[s0, s1)`` covered by each buffer;
``size``        bytes;
``rank``        position of each buffer in the value order (lower first);
``buf_at``      ``buf_at[s]``: the first buffer whose ``s0 >= s`` (``S + 1``
                entries), so the buffers starting in ``[lo, hi)`` are
                ``buf_at[lo]:buf_at[hi]``;
``sec_ptr, sec_buf``  the buffers covering each section (CSR);
``ovl_ptr, ovl_buf``  the buffers overlapping each buffer in time (CSR).

State arrays (changed in place, restored on backtracking)

``floor``       per section: the top of what is placed there (or higher,
                when the search decided nothing sits lower);
``load``        per section: bytes of the unplaced buffers covering it;
``crossing``    per section boundary ``k | k+1``: unplaced buffers spanning it;
``min_off``     per buffer: the lowest offset it can still take;
``placed``      per buffer: 1 once placed; ``offsets``: where.

Control array ``ctl``: :data:`CAPACITY`, :data:`NODES` (nodes used),
:data:`LIMIT_AT` (stop when ``NODES`` exceeds it), :data:`LEAST_SLACK` (section
rule), :data:`MEMO_USED` (entries in the memo).  The memo of failed
sub-problems is an open-addressing table of two independent hashes
(``memo_a``, ``memo_b``; 0 marks an empty slot) whose length is a power of two.
"""
from __future__ import annotations

import numpy as np

try:  # numba is optional: the same code runs as plain Python without it
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised where numba is absent
    _njit = None

#: True when the kernel is compiled by numba.
JIT = _njit is not None

# results of solve_range
FAIL, FOUND, LIMIT = 0, 1, 2

# slots of the control array
CAPACITY, NODES, LIMIT_AT, LEAST_SLACK, MEMO_USED = 0, 1, 2, 3, 4
CONTROL_SLOTS = 5

_BIG = np.iinfo(np.int64).max
# two multiplicative hashes kept below 2**40 with multipliers below 2**21: no
# int64 overflow anywhere, so plain Python and numba compute the same numbers
_MASK = (1 << 40) - 1
_M1, _M2 = 1048573, 1048391


def _jit(fn):
    return _njit(cache=True, nogil=True)(fn) if JIT else fn


@_jit
def _hash(lo, hi, floor, placed, blo, bhi, mult):
    h = (lo * 7919 + hi) & _MASK
    for s in range(lo, hi):
        h = ((h ^ (floor[s] & _MASK)) * mult) & _MASK
        h ^= h >> 20
    for b in range(blo, bhi):
        h = ((h ^ placed[b]) * mult) & _MASK
        h ^= h >> 20
    return h


@_jit
def _memo_slot(memo_a, memo_b, h1, h2):
    """Index of the slot holding ``(h1, h2)`` or of the empty slot to put it in."""
    mask = len(memo_a) - 1
    i = h1 & mask
    while memo_a[i] != 0 and not (memo_a[i] == h1 + 1 and memo_b[i] == h2):
        i = (i + 1) & mask
    return i


@_jit
def _place(b, m, s0, s1, size, ovl_ptr, ovl_buf, floor, load, crossing, min_off,
           placed, offsets):
    """Put buffer ``b`` at offset ``m``."""
    top = m + size[b]
    for s in range(s0[b], s1[b]):
        floor[s] = top
        load[s] -= size[b]
    for s in range(s0[b], s1[b] - 1):
        crossing[s] -= 1
    for k in range(ovl_ptr[b], ovl_ptr[b + 1]):
        c = ovl_buf[k]
        if placed[c] == 0 and min_off[c] < top:
            min_off[c] = top
    placed[b] = 1
    offsets[b] = m


@_jit
def _raise_floor(s, value, sec_ptr, sec_buf, floor, min_off, placed):
    """Nothing sits in section ``s`` below ``value``."""
    floor[s] = value
    for k in range(sec_ptr[s], sec_ptr[s + 1]):
        c = sec_buf[k]
        if placed[c] == 0 and min_off[c] < value:
            min_off[c] = value


@_jit
def _closing_floor(s, m, s0, s1, size, sec_ptr, sec_buf, ovl_ptr, ovl_buf, min_off, placed):
    """Lowest offset of the next buffer in section ``s`` if none sits at ``m``.

    In a compacted plan every buffer rests on offset 0 or on the top of a
    buffer it overlaps.  A buffer covering ``s`` whose floor is above ``m``
    sits at least on its floor; one whose floor is ``m`` must rest on an
    unplaced buffer that does not cover ``s``: at least that buffer's floor
    plus its size.  A huge number when nothing can occupy ``s``.
    """
    best = _BIG
    for k in range(sec_ptr[s], sec_ptr[s + 1]):
        b = sec_buf[k]
        if placed[b] != 0:
            continue
        if min_off[b] > m:
            if min_off[b] < best:
                best = min_off[b]
        else:
            for j in range(ovl_ptr[b], ovl_ptr[b + 1]):
                c = ovl_buf[j]
                if placed[c] == 0 and (s0[c] > s or s1[c] <= s):
                    top = min_off[c] + size[c]
                    if top < best:
                        best = top
    return best


@_jit
def _save(lo, hi, blo, bhi, floor, load, crossing, min_off, placed):
    return (floor[lo:hi].copy(), load[lo:hi].copy(), crossing[lo:hi].copy(),
            min_off[blo:bhi].copy(), placed[blo:bhi].copy())


@_jit
def _restore(lo, hi, blo, bhi, saved, floor, load, crossing, min_off, placed):
    floor[lo:hi] = saved[0]
    load[lo:hi] = saved[1]
    crossing[lo:hi] = saved[2]
    min_off[blo:bhi] = saved[3]
    placed[blo:bhi] = saved[4]


@_jit
def solve_range(lo, hi, s0, s1, size, rank, buf_at, sec_ptr, sec_buf, ovl_ptr, ovl_buf,
                floor, load, crossing, min_off, placed, offsets, bottom, counts,
                ctl, memo_a, memo_b):
    """Place every unplaced buffer of sections ``[lo, hi)``: FOUND, FAIL or LIMIT.

    On FOUND the state holds the plan; on FAIL it is as on entry; on LIMIT
    (``ctl[NODES]`` passed ``ctl[LIMIT_AT]``) it is garbage.
    """
    ctl[NODES] += 1
    if ctl[NODES] > ctl[LIMIT_AT]:
        return LIMIT
    busy = False
    for s in range(lo, hi):
        if load[s] > 0:
            busy = True
            break
    if not busy:
        return FOUND
    blo, bhi = buf_at[lo], buf_at[hi]

    # -- decomposition: no unplaced buffer spans a cut ---------------------------
    cuts = 0
    for k in range(lo, hi - 1):
        if crossing[k] == 0:
            cuts += 1
    if cuts > 0:
        parts = np.empty(2 * (cuts + 1), dtype=np.int64)
        nparts = 0
        start = lo
        for k in range(lo, hi):
            if k == hi - 1 or crossing[k] == 0:  # a part ends with section k
                a, z = start, k + 1
                while a < z and load[a] == 0:
                    a += 1
                while z > a and load[z - 1] == 0:
                    z -= 1
                if a < z:
                    parts[2 * nparts] = a
                    parts[2 * nparts + 1] = z
                    nparts += 1
                start = k + 1
        if not (nparts == 1 and parts[0] == lo and parts[1] == hi):
            saved = _save(lo, hi, blo, bhi, floor, load, crossing, min_off, placed)
            for p in range(nparts):
                r = solve_range(parts[2 * p], parts[2 * p + 1], s0, s1, size, rank, buf_at,
                                sec_ptr, sec_buf, ovl_ptr, ovl_buf, floor, load, crossing,
                                min_off, placed, offsets, bottom, counts, ctl, memo_a, memo_b)
                if r == LIMIT:
                    return LIMIT
                if r == FAIL:
                    _restore(lo, hi, blo, bhi, saved, floor, load, crossing, min_off, placed)
                    return FAIL
            return FOUND

    # -- memo of failed sub-problems ---------------------------------------------
    h1 = _hash(lo, hi, floor, placed, blo, bhi, _M1)
    h2 = _hash(lo, hi, floor, placed, blo, bhi, _M2)
    slot = _memo_slot(memo_a, memo_b, h1, h2)
    if memo_a[slot] != 0:
        return FAIL

    cap = ctl[CAPACITY]
    saved = _save(lo, lo, blo, blo, floor, load, crossing, min_off, placed)  # empty
    raised = False
    while True:
        # -- bounds: the unplaced bytes of every section fit under the capacity
        for s in range(lo, hi):
            bottom[s] = _BIG
            counts[s] = 0
        for b in range(blo, bhi):
            if placed[b] == 0:
                mo = min_off[b]
                for s in range(s0[b], s1[b]):
                    if mo < bottom[s]:
                        bottom[s] = mo
        m = _BIG
        pruned = False
        for s in range(lo, hi):
            if load[s] > 0:
                low = floor[s] if floor[s] > bottom[s] else bottom[s]
                if low + load[s] > cap:
                    pruned = True
                    break
                if floor[s] < m:
                    m = floor[s]
        if pruned:
            break
        # -- candidates: unplaced buffers that can sit at the lowest floor m
        for b in range(blo, bhi):
            if placed[b] == 0 and min_off[b] == m:
                for s in range(s0[b], s1[b]):
                    counts[s] += 1
        empty = False
        for s in range(lo, hi):
            if load[s] > 0 and floor[s] == m and counts[s] == 0:
                empty = True
        if empty:  # nobody can sit at m there: the floor rises to the next occupant
            if not raised:
                saved = _save(lo, hi, blo, bhi, floor, load, crossing, min_off, placed)
                raised = True
            for s in range(lo, hi):
                if load[s] > 0 and floor[s] == m and counts[s] == 0:
                    _raise_floor(s, bottom[s], sec_ptr, sec_buf, floor, min_off, placed)
            continue
        # -- the most constrained section at m
        best_s, key1, key2 = -1, _BIG, _BIG
        for s in range(lo, hi):
            if load[s] > 0 and floor[s] == m:
                slack = cap - floor[s] - load[s]
                k1, k2 = (slack, counts[s]) if ctl[LEAST_SLACK] else (counts[s], slack)
                if k1 < key1 or (k1 == key1 and k2 < key2):
                    best_s, key1, key2 = s, k1, k2
        s = best_s
        # candidates covering s, in the value order (insertion sort: few of them)
        cand = np.empty(counts[s], dtype=np.int64)
        nc = 0
        for k in range(sec_ptr[s], sec_ptr[s + 1]):
            b = sec_buf[k]
            if placed[b] == 0 and min_off[b] == m:
                j = nc
                while j > 0 and rank[cand[j - 1]] > rank[b]:
                    cand[j] = cand[j - 1]
                    j -= 1
                cand[j] = b
                nc += 1
        closing = _closing_floor(s, m, s0, s1, size, sec_ptr, sec_buf, ovl_ptr, ovl_buf,
                                 min_off, placed)
        here = _save(lo, hi, blo, bhi, floor, load, crossing, min_off, placed)
        for i in range(nc + 1):
            if i < nc:  # candidate i sits at m
                b = cand[i]
                if m + size[b] > cap:
                    continue
                _place(b, m, s0, s1, size, ovl_ptr, ovl_buf, floor, load, crossing, min_off,
                       placed, offsets)
            else:  # nothing sits at (s, m): the section's floor rises to its next occupant
                if closing == _BIG or closing + load[s] > cap:
                    break
                _raise_floor(s, closing, sec_ptr, sec_buf, floor, min_off, placed)
            r = solve_range(lo, hi, s0, s1, size, rank, buf_at, sec_ptr, sec_buf, ovl_ptr,
                            ovl_buf, floor, load, crossing, min_off, placed, offsets, bottom,
                            counts, ctl, memo_a, memo_b)
            if r != FAIL:
                return r
            _restore(lo, hi, blo, bhi, here, floor, load, crossing, min_off, placed)
        break
    if raised:
        _restore(lo, hi, blo, bhi, saved, floor, load, crossing, min_off, placed)
    # remember the failure (the table stays at most three quarters full)
    if 4 * (ctl[MEMO_USED] + 1) <= 3 * len(memo_a):
        slot = _memo_slot(memo_a, memo_b, h1, h2)  # the search may have filled it
        memo_a[slot] = h1 + 1
        memo_b[slot] = h2
        ctl[MEMO_USED] += 1
    return FAIL


# -- the second search: MiniMalloc's order of placements -----------------------

@_jit
def _lowest_floors(lo, hi, blo, bhi, s0, s1, min_off, placed):
    """The lowest ``min_off`` of the unplaced buffers covering each section of
    ``[lo, hi)`` (index ``s - lo``; huge if none)."""
    bottom = np.full(hi - lo, _BIG, dtype=np.int64)
    for b in range(blo, bhi):
        if placed[b] == 0:
            mo = min_off[b]
            for s in range(s0[b], s1[b]):
                if mo < bottom[s - lo]:
                    bottom[s - lo] = mo
    return bottom


@_jit
def _fits(lo, hi, offset, top, ta, tz, a, z, sec_ptr, sec_buf, floor, load, min_off, placed,
          bottom, rise, fall, cap):
    """Every section of ``[lo, hi)`` can still hold its unplaced bytes above
    ``offset``, its floor and the lowest floor of its unplaced buffers.

    The arrays describe the node before the last placement, which changed
    floors, loads and lowest floors in sections ``[ta, tz)`` only: ``bottom``,
    the lowest floors (:func:`_lowest_floors`); ``rise[k]`` and ``fall[k]``,
    the largest load in ``[lo, lo + k)`` and in ``[lo + k, hi)``.  Then every
    section passed with a lower offset, so outside ``[ta, tz)`` only the
    offset plus the load can fail.  The placed buffer covers ``[a, z)`` up to
    ``top``; elsewhere a lowest floor rose to ``top`` at most, so a section
    that passes with that needs no closer look.
    """
    if offset + max(rise[ta - lo], fall[tz - lo]) > cap:
        return False
    for s in range(ta, tz):
        if load[s] > 0:
            if (s < a or s >= z) and max(offset, floor[s], bottom[s - lo], top) + load[s] <= cap:
                continue
            lowest = _BIG
            for k in range(sec_ptr[s], sec_ptr[s + 1]):
                c = sec_buf[k]
                if placed[c] == 0 and min_off[c] < lowest:
                    lowest = min_off[c]
            if max(offset, floor[s], lowest) + load[s] > cap:
                return False
    return True


@_jit
def place_in_order(lo, hi, last_off, last_rank, split, s0, s1, size, rank, by_rank, buf_at,
                   sec_ptr, sec_buf, ovl_ptr, ovl_buf, floor, load, crossing, min_off, placed,
                   offsets, ctl):
    """Place every unplaced buffer of sections ``[lo, hi)``: FOUND, FAIL or LIMIT.

    The search of MiniMalloc (Moffitt, ASPLOS 2023), written from its paper:
    buffers are placed in order of offset, then of value order (``rank``),
    each at its lowest offset (``min_off``), so ``(offset, rank)`` never
    decreases along a path (``last_off``, ``last_rank``).  A node tries the
    unplaced buffers by that key and skips one whose offset is at or above
    the lowest top any unplaced buffer could reach (it would leave a useless
    gap); a buffer with nothing unplaced above it that fails ends the node
    (its position cannot matter).  After each placement every section must
    hold its unplaced bytes above the current offset.  ``split`` (0 or 1): first cut
    the range where no unplaced buffer spans a section boundary and solve the
    pieces one after the other, each from offset 0.

    ``by_rank`` lists the buffers in value order.  On FOUND the state holds
    the plan; on FAIL it is as on entry; on LIMIT it is garbage.
    """
    blo, bhi = buf_at[lo], buf_at[hi]
    # arguments of recursive calls are never literals: numba's cache mishandles
    # the casts they need (a crash when the cached code is loaded)
    zero = lo - lo
    if split != zero:
        saved = _save(lo, hi, blo, bhi, floor, load, crossing, min_off, placed)
        start = lo
        for k in range(lo, hi):
            if k == hi - 1 or crossing[k] == 0:
                busy = False
                for s in range(start, k + 1):
                    if load[s] > 0:
                        busy = True
                        break
                if busy:
                    r = place_in_order(start, k + 1, zero, zero - 1, zero, s0, s1, size, rank,
                                       by_rank, buf_at, sec_ptr, sec_buf, ovl_ptr, ovl_buf, floor,
                                       load, crossing, min_off, placed, offsets, ctl)
                    if r == LIMIT:
                        return LIMIT
                    if r == FAIL:
                        _restore(lo, hi, blo, bhi, saved, floor, load, crossing, min_off,
                                 placed)
                        return FAIL
                start = k + 1
        return FOUND

    ctl[NODES] += 1
    if ctl[NODES] > ctl[LIMIT_AT]:
        return LIMIT
    cap = ctl[CAPACITY]
    # the unplaced buffers of the range by (lowest offset, rank)
    count = 0
    for b in range(blo, bhi):
        if placed[b] == 0:
            count += 1
    if count == 0:
        return FOUND
    todo = np.empty(count, dtype=np.int64)
    keys = np.empty(count, dtype=np.int64)
    count = 0
    lowest_top = _BIG
    for i in range(len(by_rank)):
        b = by_rank[i]
        if blo <= b < bhi and placed[b] == 0:
            todo[count] = b
            keys[count] = min_off[b] * len(by_rank) + count  # unique: no stable sort needed
            count += 1
            if min_off[b] + size[b] < lowest_top:
                lowest_top = min_off[b] + size[b]
    todo = todo[np.argsort(keys)]
    bottom = _lowest_floors(lo, hi, blo, bhi, s0, s1, min_off, placed)
    rise = np.zeros(hi - lo + 1, dtype=np.int64)
    fall = np.zeros(hi - lo + 1, dtype=np.int64)
    for k in range(hi - lo):
        rise[k + 1] = max(rise[k], load[lo + k])
        fall[hi - lo - 1 - k] = max(fall[hi - lo - k], load[hi - 1 - k])
    for i in range(count):
        b = todo[i]
        offset = min_off[b]
        if offset >= lowest_top:
            break  # it would leave a gap nothing can fill
        if offset < last_off or (offset == last_off and rank[b] < last_rank):
            continue  # the same plan is reached in canonical order
        top = offset + size[b]
        if top > cap:
            continue
        # place b, keeping what is needed to take it back
        old_floor = floor[s0[b]:s1[b]].copy()
        old_min = np.empty(ovl_ptr[b + 1] - ovl_ptr[b], dtype=np.int64)
        hatless = True
        ta, tz = s0[b], s1[b]  # the sections whose lowest floors change
        for k in range(ovl_ptr[b], ovl_ptr[b + 1]):
            c = ovl_buf[k]
            old_min[k - ovl_ptr[b]] = min_off[c]
            if placed[c] == 0:
                hatless = False
                if min_off[c] < top:
                    min_off[c] = top
                    ta, tz = min(ta, s0[c]), max(tz, s1[c])
        new_cut = zero
        for s in range(s0[b], s1[b]):
            floor[s] = top
            load[s] -= size[b]
        for s in range(s0[b], s1[b] - 1):
            crossing[s] -= 1
            if crossing[s] == 0:
                new_cut = zero + 1
        placed[b] = 1
        offsets[b] = offset
        r = FAIL
        if _fits(lo, hi, offset, top, ta, tz, s0[b], s1[b], sec_ptr, sec_buf, floor, load,
                 min_off, placed, bottom, rise, fall, cap):
            r = place_in_order(lo, hi, offset, rank[b], new_cut, s0, s1, size, rank, by_rank,
                               buf_at, sec_ptr, sec_buf, ovl_ptr, ovl_buf, floor, load, crossing,
                               min_off, placed, offsets, ctl)
        if r != FAIL:
            return r
        placed[b] = 0
        for s in range(s0[b], s1[b] - 1):
            crossing[s] += 1
        for s in range(s0[b], s1[b]):
            load[s] += size[b]
        floor[s0[b]:s1[b]] = old_floor
        for k in range(ovl_ptr[b], ovl_ptr[b + 1]):
            min_off[ovl_buf[k]] = old_min[k - ovl_ptr[b]]
        if hatless:
            break  # nothing rests on b: no other choice here can do better
    return FAIL
