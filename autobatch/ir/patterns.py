"""Patterns: a variable name or a nested tuple of them, and the values they bind.

A *pattern* of variable names (a ``str`` or a nested tuple of patterns) says
where the parts of a value go: ``'t'`` takes the whole value; ``('a', ('b',
'c'))`` takes a value ``(x, (y, z))`` apart.  Namedtuples are tuples that
keep their class.  TFP's pattern functions (``pattern_map``,
``pattern_map2``, ``pattern_flatten``...) treat lists and tuples as
structure, instances of a ``leaf_type`` as leaves.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Sequence, Tuple, Union

from autobatch.errors import ProgramError

#: A variable name or a nested tuple of them.
Pattern = Union[str, Tuple[Any, ...]]


# -- patterns ------------------------------------------------------------------

def pattern_leaves(pattern: Any) -> List[Any]:
    """The leaves of a pattern (anything but a tuple is a leaf), in order."""
    if isinstance(pattern, tuple):
        out: List[Any] = []
        for part in pattern:
            out.extend(pattern_leaves(part))
        return out
    return [pattern]


def is_namedtuple(value: Any) -> bool:
    """Whether ``value`` is a namedtuple (a tuple with ``_fields``)."""
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def rebuild(like: Any, parts: Iterator[Any]) -> Tuple[Any, ...]:
    """A tuple of ``parts`` of the kind of ``like``: the same namedtuple class
    where ``like`` is a namedtuple (namedtuples are values as in TFP: their
    class travels in patterns and types), else a plain tuple."""
    if is_namedtuple(like):
        return type(like)(*parts)
    return tuple(parts)


def tuple_expr(pattern: Any, inner: Sequence[str], constant: Callable[[Any], str]) -> str:
    """Python source building ``pattern``'s kind of tuple from the source
    texts ``inner``: ``(a, b)``, or ``<class>(a, b)`` for a namedtuple, the
    class named by ``constant(cls)`` (generated code)."""
    joined = ", ".join(inner)
    if is_namedtuple(pattern):
        return f"{constant(type(pattern))}({joined})"
    return f"({joined},)" if len(inner) == 1 else f"({joined})"


def pattern_map(f: Callable[[Any], Any], pattern: Any, leaf_type: Any = ()) -> Any:
    """``pattern`` with every leaf replaced by ``f(leaf)``.  Tuples and lists
    are structure, as in TFP (a tuple stays a tuple of its kind, namedtuples
    keeping their class; a list a list), except instances of ``leaf_type``
    (TFP's argument: a class or tuple of classes that are leaves)."""
    if isinstance(pattern, tuple) and not (leaf_type and isinstance(pattern, leaf_type)):
        return rebuild(pattern, (pattern_map(f, part, leaf_type) for part in pattern))
    if isinstance(pattern, list) and not (leaf_type and isinstance(pattern, leaf_type)):
        return [pattern_map(f, part, leaf_type) for part in pattern]
    return f(pattern)


def _is_structure(value: Any, leaf_type: Any) -> bool:
    """Lists and tuples are structure in TFP's pattern functions, except
    instances of ``leaf_type``."""
    return isinstance(value, (list, tuple)) and not (leaf_type and isinstance(value, leaf_type))


def pattern_flatten(pattern: Any, leaf_type: Any = ()) -> List[Any]:
    """TFP's: the leaves of ``pattern`` in order (lists and tuples are
    structure, instances of ``leaf_type`` leaves)."""
    return list(pattern_traverse(pattern, leaf_type))


def pattern_traverse(pattern: Any, leaf_type: Any = ()) -> Iterator[Any]:
    """TFP's: the leaves of ``pattern`` one by one (lists and tuples are
    structure, instances of ``leaf_type`` leaves)."""
    if _is_structure(pattern, leaf_type):
        for part in pattern:
            yield from pattern_traverse(part, leaf_type)
    else:
        yield pattern


def pattern_zip(pattern1: Any, pattern2: Any, leaf_type: Any = ()) -> List[Tuple[Any, Any]]:
    """TFP's: pairs of corresponding leaves of two patterns of one structure
    (lists and tuples are structure, instances of ``leaf_type`` leaves);
    where ``pattern1`` has a leaf, it is paired with the whole of
    ``pattern2`` there.  ValueError where ``pattern1`` has structure
    ``pattern2`` lacks."""
    if _is_structure(pattern1, leaf_type):
        if not _is_structure(pattern2, leaf_type) or len(pattern1) != len(pattern2):
            raise ValueError(f"patterns of different structure: {pattern1!r} and {pattern2!r}")
        return [pair for a, b in zip(pattern1, pattern2)
                for pair in pattern_zip(a, b, leaf_type)]
    return [(pattern1, pattern2)]


def pattern_map2(f: Callable[[Any, Any], Any], pattern1: Any, pattern2: Any,
                 leaf_type: Any = ()) -> Any:
    """TFP's: ``pattern1``'s structure with each leaf ``a`` replaced by
    ``f(a, b)``, ``b`` the part of ``pattern2`` there (lists and tuples are
    structure, instances of ``leaf_type`` leaves).  ValueError where
    ``pattern1`` has structure ``pattern2`` lacks."""
    if _is_structure(pattern1, leaf_type):
        if not _is_structure(pattern2, leaf_type) or len(pattern1) != len(pattern2):
            raise ValueError(f"patterns of different structure: {pattern1!r} and {pattern2!r}")
        parts = (pattern_map2(f, a, b, leaf_type) for a, b in zip(pattern1, pattern2))
        return list(parts) if isinstance(pattern1, list) else rebuild(pattern1, parts)
    return f(pattern1, pattern2)


def pattern_unflatten(pattern: Any, leaves: Sequence[Any]) -> Any:
    """Inverse of :func:`pattern_leaves`: ``leaves`` put into ``pattern``'s shape."""
    it = iter(leaves)
    out = pattern_map(lambda _: next(it), pattern)
    return out


def bind_pattern(pattern: Any, value: Any, where: str = "",
                 op: Any = None) -> Iterator[Tuple[str, Any]]:
    """``(name, part)`` for each variable of ``pattern`` bound to ``value``.

    A ``str`` pattern takes the whole value; a tuple pattern takes apart a
    tuple or list value of the same length.  Raises :class:`ProgramError`
    (naming ``where`` and the instruction ``op``, printed only then) when the
    value does not have the pattern's structure.
    """
    if isinstance(pattern, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(pattern):
            got = (f"a {len(value)}-tuple" if isinstance(value, (tuple, list))
                   else type(value).__name__)
            if op is not None:
                where = f"{where}: {op}"
            raise ProgramError(f"{where}: cannot unpack {got} into the pattern "
                               f"{format_pattern(pattern)}; return a {len(pattern)}-tuple "
                               f"or bind the value to one variable")
        for part, sub in zip(pattern, value):
            yield from bind_pattern(part, sub, where, op)
    else:
        yield pattern, value


def as_pattern(value: Any) -> Any:
    """``value`` with every list turned into a tuple (so that patterns treat
    user values given as lists as structure)."""
    if isinstance(value, tuple):
        return rebuild(value, (as_pattern(v) for v in value))
    if isinstance(value, list):
        return tuple(as_pattern(v) for v in value)
    return value


def format_pattern(pattern: Any) -> str:
    """``a`` or ``(a, (b, c))``."""
    if isinstance(pattern, tuple):
        return tuple_expr(pattern, [format_pattern(p) for p in pattern],
                          lambda cls: cls.__name__)
    return str(pattern)
