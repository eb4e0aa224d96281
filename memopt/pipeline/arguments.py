"""memory_optimize's and release_memory's arguments checked and turned into
:class:`memopt.plan.Options` (names of variables or PIR Values)."""
from __future__ import annotations

from ..paddle.pir import program as pir
from ..plan import Options


def _name_of(item, index: int, argument: str = "skip_opt_set") -> str:
    """The variable name of a skip_opt_set / fetch_list item: a str, a legacy
    Variable, or a PIR Value (named as :func:`memopt.paddle.pir.program.value_name`
    does)."""
    if isinstance(item, str):
        return item
    if type(item).__name__ == "Value" and hasattr(item, "get_defining_op"):
        try:
            return pir.value_name(item)
        except ValueError as exc:
            raise TypeError(f"{argument}[{index}]: {exc}") from None
    try:
        name = getattr(item, "name", None)
    except Exception:  # a PIR Value without a name raises
        name = None
    if isinstance(name, str) and name:
        return name
    raise TypeError(
        f"{argument}[{index}] is a {type(item).__name__} with no variable name; "
        "pass variable names (str) or Variables")


def argument_names(value, argument: str) -> frozenset:
    """The names of a skip_opt_set / fetch_list argument (None: none; a
    single Variable or Value is accepted as a fetch_list)."""
    if value is None:
        return frozenset()
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{argument} must be a set, list or tuple of variable names, not the "
            f"string {value!r}: note that ({value!r}) is a string, not a "
            f"tuple; write ({value!r},) or {{{value!r}}}")
    if isinstance(value, (set, frozenset, list, tuple)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
        return frozenset(_name_of(item, i, argument) for i, item in enumerate(items))
    if argument == "fetch_list" and (pir.is_pir_value(value) or hasattr(value, "name")):
        return frozenset([_name_of(value, 0, argument)])
    raise TypeError(
        f"{argument} must be None or a set, list or tuple of variable names or "
        f"Variables, got {type(value).__name__}")


def resolve_options(skip_opt_set=None, skip_grads: bool = True, level: int = 0,
                    print_log: bool = False, fetch_list=None) -> Options:
    """Check memory_optimize's arguments and turn them into :class:`Options`.

    Raises
    ------
    TypeError
        ``skip_opt_set`` is a bare string (``("fc")`` is the string ``"fc"``,
        not a tuple) or not a set/list/tuple of names or Variables;
        ``skip_grads`` or ``print_log`` is not a bool.
    ValueError
        ``level`` is not 0, 1 or 2.
    """
    names = argument_names(skip_opt_set, "skip_opt_set")
    fetched = argument_names(fetch_list, "fetch_list")
    for arg, value in (("skip_grads", skip_grads), ("print_log", print_log)):
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise TypeError(f"{arg} must be True or False, got {value!r}")
    if isinstance(level, bool) or level not in (0, 1, 2):
        raise ValueError(
            f"level must be 0 (reuse only between variables of the same shape and "
            f"dtype), 1 (any variable of the same dtype whose memory is provably "
            f"large enough) or 2 (level 1 and a memory-aware op order), got {level!r}")
    return Options(names, bool(skip_grads), int(level), bool(print_log), fetched)
