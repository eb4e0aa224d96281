"""Blocks, functions and TFP's ControlFlowGraph.

A function has parameters (variable names) and a list of :class:`Block` s;
the first block is its entry.  A block is straight-line code (a list of
instructions) ended by one terminator.  Every variable is local to its
function: two functions may use the same name for different variables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from autobatch.errors import ProgramError
from autobatch.ir.ops import (
    FunctionCallOp,
    GotoOp,
    IndirectGotoOp,
    PushGotoOp,
    ReturnOp,
    _Assignment,
    _FrameOp,
    _names,
    _Terminator,
    pc_var,
)
from autobatch.ir.patterns import as_pattern
from autobatch.ir.text import layout as _layout
from autobatch.ir.types import Type, VariableAllocation


@dataclass(eq=False, init=False)
class Block:
    """Straight-line ``instructions`` then one ``terminator``.

    ``Block(name, instructions, terminator)``, or TFP's positional order
    ``Block(instructions=None, terminator=None, name=None)`` (a first
    positional argument that is not a string).  A TFP-style block may be
    unnamed and its terminator may name blocks by object (``GotoOp(block)``):
    the :class:`Function` holding it names it (``block_<k>``) and turns
    such references into names.
    """

    name: str
    instructions: List[Any]
    terminator: Optional[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        order = ("name", "instructions", "terminator") if args and isinstance(args[0], str) \
            else ("instructions", "terminator", "name")
        if len(args) > 3:
            raise TypeError(f"Block takes at most 3 positional arguments, got {len(args)}")
        values = dict(zip(order, args))
        for key, value in kwargs.items():
            if key not in order or key in values:
                raise TypeError(f"Block got an unexpected or repeated argument {key!r}")
            values[key] = value
        self.name = values.get("name")
        instructions = values.get("instructions")
        self.instructions = list(instructions) if instructions is not None else []
        self.terminator = values.get("terminator")

    @property
    def label_str(self) -> str:
        """TFP's: how the block is referred to in printed output (its name;
        ``block-<hash>`` for an unnamed block, as TFP's)."""
        return str(self.name) if self.name is not None else f"block-{hash(self)}"

    def assign_instructions(self, instructions: Sequence[Any]) -> None:
        """TFP's: set the instructions; a last one that is a terminator
        (goto, branch, return...) becomes the terminator."""
        instructions = list(instructions)
        if instructions and isinstance(instructions[-1], _Terminator):
            self.terminator = instructions.pop()
        self.instructions = instructions

    def tail_call(self) -> Optional[FunctionCallOp]:
        """The block's last instruction if it is a call whose value the block
        returns unchanged (``x = call g(..); return x``), else None.  A tail call
        needs no stack frame: the callee returns straight to our caller."""
        if (self.instructions and isinstance(self.instructions[-1], FunctionCallOp)
                and isinstance(self.terminator, ReturnOp)
                and self.terminator.vars == self.instructions[-1].vars_out):
            return self.instructions[-1]
        return None

    def format(self, indent: str = "  ") -> str:
        lines = [f"{self.name}:"]
        lines += [f"{indent}{op}" for op in self.instructions]
        lines.append(f"{indent}{self.terminator if self.terminator else '<no terminator>'}")
        return "\n".join(lines)

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        """TFP's ``__str__(indent=0, width=80)``: :meth:`format` indented
        ``indent`` spaces, lines broken to fit ``width``."""
        return _layout(self.format(), indent, width)


@dataclass(eq=False, init=False)
class Function:
    """A function: ``params`` (variable names) and ``blocks`` (entry first).

    ``type_inference``, when given, maps the list of parameter :class:`Type` s
    to the return :class:`Type`; it is needed only when the return type cannot
    be inferred from the body (a recursion with no base case).
    ``var_types``/``return_type`` are filled by
    :func:`autobatch.type_inference.infer_types`, ``var_alloc`` by
    :func:`autobatch.allocation_strategy.optimize`.
    """

    name: str
    params: Tuple[str, ...]
    blocks: List[Block]
    type_inference: Optional[Callable[[List[Type]], Any]] = None
    var_types: Dict[str, Type] = field(default_factory=dict)
    return_type: Optional[Type] = None
    var_alloc: Dict[str, VariableAllocation] = field(default_factory=dict)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        tfp = (args and not isinstance(args[0], str)) or "graph" in kwargs \
            or "vars_in" in kwargs
        if tfp:
            # TFP: Function(graph, vars_in, vars_out, type_inference, name=None)
            names = ("graph", "vars_in", "vars_out", "type_inference", "name")
            values = dict(zip(names, args))
            values.update(kwargs)
            self.name = values.get("name")
            self.params = _names(values.get("vars_in") or ())
            self.vars_out = as_pattern(values.get("vars_out"))
            self.type_inference = values.get("type_inference")
            self.var_types, self.return_type, self.var_alloc = {}, None, {}
            self.blocks = []
            self.graph = values.get("graph")
            return
        names = ("name", "params", "blocks", "type_inference", "var_types", "return_type",
                 "var_alloc")
        values = dict(zip(names, args))
        values.update(kwargs)
        self.name = values["name"]
        self.params = _names(values["params"])
        self.blocks = list(values["blocks"])
        self.type_inference = values.get("type_inference")
        self.var_types = dict(values.get("var_types") or {})
        self.return_type = values.get("return_type")
        self.var_alloc = dict(values.get("var_alloc") or {})
        self.vars_out = None

    # -- TFP's view --------------------------------------------------------------------
    @property
    def vars_in(self) -> Tuple[str, ...]:
        """TFP's name for :attr:`params`."""
        return self.params

    @property
    def graph(self) -> "ControlFlowGraph":
        """TFP's view of :attr:`blocks`; assigning one (TFP builds recursive
        functions first and gives them their graph later) sets the blocks."""
        return ControlFlowGraph(self.blocks)

    @graph.setter
    def graph(self, graph: Any) -> None:
        if graph is None:
            self.blocks = []
        else:
            self.blocks = list(graph.blocks if isinstance(graph, ControlFlowGraph) else graph)

    @property
    def entry(self) -> Block:
        return self.blocks[0]

    def block(self, name: str) -> Block:
        for block in self.blocks:
            if block.name == name:
                return block
        raise ProgramError(f"function {self.name!r} has no block {name!r}")

    def variables(self) -> List[str]:
        """Every variable of the function: parameters first, then the others
        in order of first appearance."""
        seen: Dict[str, None] = dict.fromkeys(self.params)
        for block in self.blocks:
            for op in block.instructions:
                seen.update(dict.fromkeys(op.reads))
                seen.update(dict.fromkeys(op.writes))
            if block.terminator is not None:
                seen.update(dict.fromkeys(block.terminator.reads))
        return list(seen)

    def callees(self) -> List[str]:
        """Names of the functions this one calls, sorted."""
        return sorted({op.function for block in self.blocks
                       for op in block.instructions if isinstance(op, FunctionCallOp)})

    def format(self) -> str:
        ret = f" -> {self.return_type}" if self.return_type is not None else ""
        lines = [f"function {self.name}({', '.join(self.params)}){ret}:"]
        if self.var_types or self.var_alloc:
            for var in self.variables():
                parts = [str(p) for p in (self.var_types.get(var), self.var_alloc.get(var))
                         if p is not None]
                lines.append(f"  # {var}: {' '.join(parts)}")
        for block in self.blocks:
            lines.extend("  " + line for line in block.format(indent="  ").split("\n"))
        return "\n".join(lines)

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        """TFP's ``__str__(indent=0, width=80)``: :meth:`format` indented
        ``indent`` spaces, lines broken to fit ``width``."""
        return _layout(self.format(), indent, width)

class ControlFlowGraph:
    """TFP's ``ControlFlowGraph``: a list of blocks, the first the entry."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._blocks = list(blocks)

    @property
    def blocks(self) -> List[Block]:
        return self._blocks

    def block(self, index: int) -> Block:
        return self._blocks[index]

    def block_index(self, block: Block) -> int:
        for i, candidate in enumerate(self._blocks):
            if candidate is block:
                return i
        raise ValueError(f"block {block.name!r} is not in this graph")

    def exit_index(self) -> int:
        return len(self._blocks)

    def enter_block(self) -> Block:
        return self._blocks[0]

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        """TFP's: the blocks, one after another."""
        return "\n".join(block.__str__(indent, width) for block in self._blocks)

def extract_referenced_variables(node: Any) -> Set[str]:
    """TFP's ``extract_referenced_variables``: the names of the variables an
    instruction, a terminator, a Block, a ControlFlowGraph or a list of them
    reads or writes (a jump references the program counter :data:`pc_var`).
    ValueError for anything else."""
    if isinstance(node, ControlFlowGraph):
        node = node.blocks
    if isinstance(node, Block):
        node = list(node.instructions) + ([node.terminator] if node.terminator else [])
    if isinstance(node, (GotoOp, PushGotoOp, IndirectGotoOp)):
        return {pc_var}
    if isinstance(node, (_Assignment, _FrameOp, _Terminator)):
        return set(node.reads) | set(getattr(node, "writes", ()))
    if isinstance(node, (list, tuple)):
        out: Set[str] = set()
        for item in node:
            out |= extract_referenced_variables(item)
        return out
    raise ValueError(f"extract_referenced_variables: unexpected {type(node).__name__}")
