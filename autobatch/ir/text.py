"""How IR objects print: TFP's ``__str__(indent=0, width=80)``.

:func:`layout` indents a text and breaks lines longer than ``width`` at
spaces; :class:`Printed` is the base of instructions and terminators (their
text is ``_text()``); :func:`tfp_field_names` gives an IR dataclass TFP's
keyword and attribute names beside autobatch's.
"""
from __future__ import annotations

import textwrap
from typing import Any, Callable


def layout(text: str, indent: int = 0, width: int = 80) -> str:
    """``text`` laid out as TFP prints its IR (``__str__(indent, width)``):
    every line indented ``indent`` more spaces, and a line longer than
    ``width`` (counting the indentation) broken at spaces, its continuation
    lines indented two more than it (words are never split)."""
    lines = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if not body:
            lines.append("")
            continue
        lead = " " * (indent + len(line) - len(body))
        if len(lead) + len(body) <= width or " " not in body:
            lines.append(lead + body)
            continue
        lines.extend(textwrap.wrap(body, width=max(width, len(lead) + 10),
                                   initial_indent=lead, subsequent_indent=lead + "  ",
                                   break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)


def label(target: Any) -> str:
    """How a jump target prints: a block's name (TFP-style targets are
    Block objects), ``halt`` for TFP's halt (None)."""
    if target is None:
        return "halt"
    name = getattr(target, "name", target)
    return str(name)


class Printed:
    """TFP's printing entry point for instructions and terminators:
    ``__str__(indent=0, width=80)``; the text is :meth:`_text`'s."""

    def _text(self) -> str:
        raise NotImplementedError

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        return layout(self._text(), indent, width)


def tfp_field_names(**aliases: str) -> Callable[[type], type]:
    """Class decorator for IR dataclasses whose fields TFP names otherwise
    (``aliases[tfp_name] = our_name``): the constructor also takes TFP's
    keyword names, the attributes read and write under them too, and the
    class declares TFP's constructor signature as ``__tfp_signature__``."""
    import functools
    import inspect

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for tfp, ours in aliases.items():
                if tfp in kwargs:
                    if ours in kwargs:
                        raise TypeError(f"{cls.__name__} got both {ours!r} and its TFP "
                                        f"name {tfp!r}; pass one")
                    kwargs[ours] = kwargs.pop(tfp)
            init(self, *args, **kwargs)
        cls.__init__ = __init__
        reverse = {ours: tfp for tfp, ours in aliases.items()}
        def getter(self: Any, ours: str) -> Any:
            # A Block named by object, turned into its name by the Program
            # holding it, reads back as the Block (as in TFP).
            value = getattr(self, ours)
            return self.__dict__.get("_tfp_blocks", {}).get(value, value) \
                if isinstance(value, str) else value
        for tfp, ours in aliases.items():
            setattr(cls, tfp, property(lambda self, o=ours: getter(self, o),
                                       lambda self, v, o=ours: setattr(self, o, v),
                                       doc=f"TFP's name for ``{ours}`` (a Block where "
                                           f"the terminator was given one)."))
        sig = inspect.signature(cls)
        cls.__tfp_signature__ = sig.replace(parameters=[
            p.replace(name=reverse.get(p.name, p.name)) for p in sig.parameters.values()])
        return cls
    return decorate
