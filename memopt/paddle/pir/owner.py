"""The PIR Values a user passes to memory_optimize, checked against the program.

``skip_opt_set`` and ``fetch_list`` Values are turned into names (``%N``)
read in the Value's own program.  A Value of another program -- typically of
the program a clone was made from, or of the training program when the
inference clone is optimized -- names some other value of this one, or none:
memopt would keep the wrong value's memory (Paddle itself cannot fetch it
from this program: ``IndexError: list index out of range``).
:func:`require_own_values` refuses such a Value before anything changes.

A Value an earlier ``memory_optimize`` of the program replaced (its op
turned into the in-place variant) is erased: touching it crashes the
process (Paddle 3.3.1: SIGSEGV in ``get_defining_op``).  :func:`live_values`
swaps each for its replacement, found by id in the rewrite's record, and
refuses one an in-place op of that rewrite writes over (its memory holds
another value after the op: too late to keep it).
"""
from __future__ import annotations

from . import program as pir


def _items(argument):
    if argument is None or isinstance(argument, (str, bytes)):
        return []
    if isinstance(argument, (set, frozenset)):
        return sorted(argument, key=str)
    if isinstance(argument, (list, tuple)):
        return list(argument)
    return [argument]  # a single Value as fetch_list


def live_values(program, argument, name: str):
    """``argument`` (a ``skip_opt_set`` / ``fetch_list``: set, list, tuple,
    one Value, names, None) with every Value an earlier rewrite of
    ``program`` erased swapped for its replacement; ValueError naming
    ``name`` and the index for a Value an in-place op of an earlier rewrite
    writes over."""
    from .later_ops import live_ids
    from .rewrite import RECORD_ATTR, overwritten_by

    replaced = (getattr(program, RECORD_ATTR, None) or {}).get("replaced") or {}
    if argument is None or isinstance(argument, (str, bytes)):
        return argument
    single = not isinstance(argument, (set, frozenset, list, tuple))
    items = [argument] if single else list(argument)  # no str() of an erased Value
    live = None
    out = []
    # a set's index is its iteration order here
    for i, item in enumerate(items):
        if pir.is_pir_value(item):
            if item.id in replaced:
                live = live_ids(program) if live is None else live
                if item.id not in live:
                    item = replaced[item.id]
            found = overwritten_by(item) if _in_program(program, item) else None
            if found is not None:
                raise ValueError(
                    f"{name}[{i}] ({pir.value_label(item)}) is written over in place by "
                    f"{found[0].name()}, which an earlier memory_optimize of this program "
                    "made: its memory cannot be kept now. Rebuild the program and pass "
                    f"it in {name} of the first memory_optimize call; nothing was changed")
        out.append(item)
    if single:
        return out[0]
    return type(argument)(out) if not isinstance(argument, frozenset) else frozenset(out)


def _in_program(program, value) -> bool:
    try:
        return pir.owning_program(value).global_block() == program.global_block()
    except ValueError:
        return False


def require_own_values(program, **arguments) -> None:
    """ValueError when a PIR Value among ``arguments`` (``skip_opt_set=``,
    ``fetch_list=`` ...: sets, lists, tuples or one Value) is defined in a
    program other than ``program``; the message names the Value, the
    argument and its index, and how to map a Value into a clone."""
    block = program.global_block()
    for argument, value in arguments.items():
        for i, item in enumerate(_items(value)):
            if not pir.is_pir_value(item):
                continue
            try:
                owner = pir.owning_program(item)
            except ValueError:
                continue  # a free Value: resolve_options names it
            if owner.global_block() == block:
                continue
            raise ValueError(
                f"{argument}[{i}] is a Value of another program ({pir.value_label(item)} "
                "there), not of the program being optimized: pass this program's "
                "Values or names (for a clone: m = paddle.pir.IrMapping(); "
                "c = program.clone(m); then m.look_up(value)); nothing was changed")
