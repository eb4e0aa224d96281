"""TFP's printed text of a program built TFP's way.

What TFP 0.25's ``str(program)`` prints, written from the layout its
docstrings describe: the variable declarations (``name :: allocation,
Type(tensors=...)``, sorted), a blank line, each function (``def
f(params):``, ``returns <pattern>``, its blocks) followed by a blank line,
then the entry graph as the function ``main``.  Instructions print as ``out
= prim(in) by`` plus the primitive's source lines, ``out = call(f, in)``,
``pop(a, b)``, ``branch(c, yes, no)``, ``goto(b)``, ``return`` (a halt),
``push_goto(r, b)``, ``indirect_jump``; a line too long for ``width`` breaks
after its open paren, the rest wrapped two further in.
"""
from __future__ import annotations

import textwrap
from typing import Any, Callable, List, Sequence

from autobatch.ir.graph import Block, Function
from autobatch.ir.ops import (
    BranchOp,
    FunctionCallOp,
    GotoOp,
    IndirectGotoOp,
    PopOp,
    PrimOp,
    PushGotoOp,
    ReturnOp,
)
from autobatch.ir.patterns import pattern_map
from autobatch.ir.types import TensorType, Type, VariableAllocation

def _tfp_comma_list(prefix: str, items: Sequence[str], suffix: str, indent: int,
                    width: int) -> List[str]:
    """``prefix + ", ".join(items) + suffix`` on one line indented ``indent``
    where it fits in ``width``; else ``prefix`` alone, then the items and
    suffix wrapped at spaces, indented ``indent + 2``."""
    body = ", ".join(str(item) for item in items) + suffix
    if len(prefix) + len(body) <= width - indent:
        return [" " * indent + prefix + body]
    pad = " " * (indent + 2)
    return [" " * indent + prefix] + textwrap.wrap(
        body, width=width, initial_indent=pad, subsequent_indent=pad,
        break_long_words=False, break_on_hyphens=False)


def _tfp_pattern(pattern: Any, nested: bool = False) -> str:
    """``a``, ``a, b`` at the top, ``(a, b)`` nested."""
    if isinstance(pattern, (list, tuple)):
        inner = ", ".join(_tfp_pattern(p, True) for p in pattern)
        return f"({inner})" if nested else inner
    return str(pattern)


def _tfp_label(target: Any) -> str:
    """A jump target as TFP names it: ``exit`` for a halt (None)."""
    if target is None:
        return "exit"
    return target.label_str if isinstance(target, Block) else str(target)


def _tfp_source(function: Callable) -> str:
    """The source lines defining ``function`` (whole lines, dedented; its
    ``__tfp_source__`` where it has one), or its ``str`` where Python has no
    source for it."""
    import inspect
    if isinstance(getattr(function, "__tfp_source__", None), str):
        return function.__tfp_source__
    try:
        return textwrap.dedent(inspect.getsource(function)).rstrip()
    except (OSError, TypeError):
        return str(function).strip()


def _tfp_type_repr(typ: Any) -> str:
    """``Type(tensors=TensorType(int64()))`` (tuples of TensorTypes inside)."""
    def leaf(t: Any) -> str:
        if isinstance(t, TensorType):
            return f"TensorType({t.dtype.name}{t.shape})"
        return repr(t)

    def walk(p: Any) -> str:
        if isinstance(p, tuple) and not isinstance(p, TensorType):
            parts = [walk(q) for q in p]
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        return leaf(p)
    tensors = typ.tensors if isinstance(typ, Type) else typ
    return f"Type(tensors={walk(tensors)})"


def tfp_op_text(op: Any, indent: int = 0, width: int = 80) -> str:
    """One instruction or terminator as TFP prints it (see the module doc);
    autobatch's own lowered instructions (push, copy) in autobatch's text."""
    if isinstance(op, PrimOp):
        if op.vars_out or op.vars_out == 0:
            written = pattern_map(lambda v: v + ("!" if v in op.skip_push_mask else ""),
                                  op.vars_out)
            prefix = _tfp_pattern(written) + " = prim("
        else:
            prefix = "prim("
        lines = _tfp_comma_list(prefix, list(op.vars_in), ") by", indent, width)
        code = _tfp_source(op.function)
        return "\n".join(lines + [" " * (indent + 2) + line for line in code.split("\n")])
    if isinstance(op, FunctionCallOp):
        prefix = (_tfp_pattern(op.vars_out) + " = call(") if op.vars_out else "call("
        name = getattr(op.function, "name", op.function)
        return "\n".join(_tfp_comma_list(prefix, [str(name)] + list(op.vars_in), ")",
                                         indent, width))
    if isinstance(op, PopOp):
        return "\n".join(_tfp_comma_list("pop(", list(op.vars), ")", indent, width))
    if isinstance(op, BranchOp):
        return "\n".join(_tfp_comma_list(
            "branch(", [op.cond, _tfp_label(op.true_target), _tfp_label(op.false_target)],
            ")", indent, width))
    if isinstance(op, ReturnOp) or (isinstance(op, GotoOp) and op.target is None):
        return " " * indent + "return"
    if isinstance(op, GotoOp):
        return "\n".join(_tfp_comma_list("goto(", [_tfp_label(op.target)], ")", indent, width))
    if isinstance(op, PushGotoOp):
        return "\n".join(_tfp_comma_list(
            "push_goto(", [_tfp_label(op.return_target), _tfp_label(op.target)], ")",
            indent, width))
    if isinstance(op, IndirectGotoOp):
        return " " * indent + "indirect_jump"
    return op.__str__(indent, width)


def _tfp_block_text(block: Block, indent: int, width: int) -> str:
    lines = [" " * indent + block.label_str + ":"]
    lines += [tfp_op_text(op, indent + 2, width) for op in block.instructions]
    lines.append(tfp_op_text(block.terminator, indent + 2, width))
    return "\n".join(lines)


def _tfp_function_text(fn: Function, name: str, indent: int, width: int) -> str:
    header = _tfp_comma_list(f"def {name}(", list(fn.params), "):", indent, width)
    returns = " " * (indent + 2) + "returns " + _tfp_pattern(fn.vars_out)
    blocks = [_tfp_block_text(block, indent + 2, width) for block in fn.blocks]
    return "\n".join(header + [returns] + blocks)


def tfp_program_text(program: Any, indent: int = 0, width: int = 80) -> str:
    """``program`` (built TFP's way) as TFP 0.25's ``str(program)`` prints
    it (see the module doc).  Blocks TFP would print as ``block-<hash>`` (unnamed)
    print under the names the Program gave them (``block_<k>``), and
    function bodies print without the "done with" pops the Program dropped."""
    var_defs = program.given_var_defs or {}
    alloc = program.var_alloc
    declarations = [" " * indent + f"{var} :: "
                    f"{alloc.get(var, VariableAllocation.FULL).name.lower()}, "
                    f"{_tfp_type_repr(var_defs[var])}" for var in sorted(var_defs)]
    main = program.main_function()
    others = [fn for fn in program.functions if fn.name != main.name]
    functions = [_tfp_function_text(fn, str(fn.name), indent, width) + "\n" for fn in others]
    return "\n".join(declarations + [""] + functions
                     + [_tfp_function_text(main, "main", indent, width)])
