"""Whether the PIR Values a user passes belong to the program being rewritten.

``skip_opt_set`` and ``fetch_list`` Values are turned into names (``%N``)
read in the Value's own program.  A Value of another program -- typically of
the program a clone was made from, or of the training program when the
inference clone is optimized -- names some other value of this one, or none:
memopt would keep the wrong value's memory (Paddle itself cannot fetch it
from this program: ``IndexError: list index out of range``).
:func:`require_own_values` refuses such a Value before anything changes.
"""
from __future__ import annotations

from . import pir


def _items(argument):
    if argument is None or isinstance(argument, (str, bytes)):
        return []
    if isinstance(argument, (set, frozenset)):
        return sorted(argument, key=str)
    if isinstance(argument, (list, tuple)):
        return list(argument)
    return [argument]  # a single Value as fetch_list


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
