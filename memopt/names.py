"""Checking the variable names a user hands in (``skip_opt_set``, ``fetch_list``,
the CLI's ``--skip`` / ``--fetch``) against the names a program has.

A name the program does not have is almost always a typo or a name from
another program (the README once said ``--skip loss``, which names nothing in
a real legacy program): silently ignoring it would leave the variable the
user meant to protect unprotected.  :func:`check_known` raises a
``ValueError`` naming every such name and, for each, the closest names the
program does have (:func:`difflib.get_close_matches`), before anything is
changed.  Pure Python: no Paddle.
"""
from __future__ import annotations

import difflib
from typing import Collection, Iterable, List, Mapping, Optional, Sequence

__all__ = ["check_known", "closest"]


def closest(name: str, known: Collection[str], n: int = 3,
            aliases: Optional[Mapping[str, Sequence[str]]] = None) -> List[str]:
    """Up to ``n`` names of ``known`` closest to ``name`` (best first; may be
    empty when nothing is similar).  ``aliases`` maps a word a user may
    write (``"loss"``) to the names that word means in this program (the
    variables the loss op writes): those come first."""
    named = list((aliases or {}).get(name.lower(), ()))
    if named:
        return named[:n]
    found = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    if not found:
        # a short name that is a part of real ones ("loss" in "mean_0.tmp_0"
        # would not match, "fc" in "fc_0.tmp_0" would)
        found = sorted((k for k in known if name and name in k), key=len)[:n]
    return found


def check_known(names: Iterable[str], known: Collection[str], argument: str,
                where: str = "the program",
                aliases: Optional[Mapping[str, Sequence[str]]] = None) -> None:
    """Raise ``ValueError`` if any of ``names`` is not in ``known``.

    ``argument`` names what the user passed (``"skip_opt_set"``,
    ``"fetch_list"``, ``"--skip"``); the message lists every unknown name
    with its closest known names (``aliases``: see :func:`closest`), or
    says there are none.
    """
    known_set = known if isinstance(known, (set, frozenset, dict)) else set(known)
    unknown = sorted({n for n in names if n not in known_set})
    if not unknown:
        return
    parts = []
    for name in unknown:
        near = closest(name, known_set, aliases=aliases)
        hint = (f"closest: {', '.join(repr(k) for k in near)}" if near
                else "no similar name")
        parts.append(f"{name!r} ({hint})")
    noun = "a name" if len(unknown) == 1 else f"{len(unknown)} names"
    raise ValueError(
        f"{argument} has {noun} that {where} does not have: {'; '.join(parts)}. "
        f"Pass names (or Variables) of this program; nothing was changed")
