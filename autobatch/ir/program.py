"""Programs (functions plus an entry point) and TFP's Module.

A :class:`Program` is a set of :class:`~autobatch.ir.graph.Function` s, one
of them the entry point (``main``), built autobatch's way (``Program(functions,
main)``) or TFP's (``Program(graph, functions, var_defs, vars_in, vars_out)``,
blocks and functions referred to by object; the constructor names them).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from autobatch.errors import ProgramError
from autobatch.ir.graph import Block, ControlFlowGraph, Function
from autobatch.ir.lowered_by_hand import HandLowered, is_hand_lowered
from autobatch.ir.ops import BranchOp, FunctionCallOp, GotoOp, PopOp, ReturnOp, pc_var
from autobatch.ir.patterns import pattern_map
from autobatch.ir.text import layout as _layout
from autobatch.ir.tfp_text import tfp_program_text
from autobatch.ir.types import Type, VariableAllocation, _as_allocation, single_type


@dataclass(eq=False, init=False)
class Program:
    """Functions plus the name of the entry point.

    ``pc_alloc`` is the allocation of the program counter, set by the
    allocation strategy: FULL where some call must come back (a stack of
    return addresses), REGISTER otherwise.
    """

    functions: Tuple[Function, ...]
    main: str
    pc_alloc: Optional[VariableAllocation] = None
    #: A program built TFP's way from a graph lowered by hand (push-goto,
    #: indirect goto, pops; no functions): its
    #: :class:`~autobatch.hand_lowered.HandLowered` form, which
    #: :func:`autobatch.virtual_machine.execute` and :func:`interpret` run;
    #: ``functions`` is then empty.  None otherwise.
    lowered_by_hand: Any = None
    #: The ``var_defs`` a TFP-style program was built with (None otherwise).
    given_var_defs: Optional[Dict[str, Any]] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        first = args[0] if args else kwargs.get("graph", kwargs.get("functions"))
        if "graph" in kwargs or isinstance(first, ControlFlowGraph) or (
                isinstance(first, (list, tuple)) and first
                and all(isinstance(b, Block) for b in first)):
            # TFP: Program(graph, functions, var_defs, vars_in, vars_out, var_alloc=None);
            # the graph is the entry point, a function named "main".
            names = ("graph", "functions", "var_defs", "vars_in", "vars_out", "var_alloc")
            values = dict(zip(names, args))
            values.update(kwargs)
            functions = list(values.get("functions") or ())
            graph = values["graph"]
            blocks = list(graph.blocks if isinstance(graph, ControlFlowGraph) else graph)
            var_defs = values.get("var_defs")
            if var_defs is not None:
                # As TFP's Program, the program counter joins the caller's dict.
                var_defs.setdefault(pc_var, single_type(np.int32, ()))
            if not functions and is_hand_lowered(blocks):
                _name_unnamed(blocks, "block")
                self.functions, self.main, self.pc_alloc = (), None, None
                self.lowered_by_hand = HandLowered(
                    blocks, var_defs, values.get("vars_in") or (), values.get("vars_out"),
                    values.get("var_alloc"))
                self.given_var_defs = self.lowered_by_hand.var_defs
                return
            self.given_var_defs = var_defs
            taken = {fn.name for fn in functions}
            main_name = "main"
            while main_name in taken:
                main_name += "_"
            main = Function(values["graph"], values.get("vars_in") or (),
                            values.get("vars_out"), None, name=main_name)
            self.functions, self.main, self.pc_alloc = (main, *functions), main_name, None
        else:
            names = ("functions", "main", "pc_alloc")
            values = dict(zip(names, args))
            values.update(kwargs)
            self.functions = tuple(values["functions"])
            self.main = values["main"]
            self.pc_alloc = values.get("pc_alloc")
        _resolve_references(self.functions)
        if isinstance(self.main, Function):
            self.main = self.main.name

    def function(self, name: str) -> Function:
        for fn in self.functions:
            if fn.name == name:
                return fn
        known = ", ".join(sorted(f.name for f in self.functions))
        raise ProgramError(f"program has no function {name!r} (functions: {known})")

    def main_function(self) -> Function:
        """The entry point as a :class:`Function` (TFP's
        ``Program.main_function()``).  A method, as TFP's."""
        if self.lowered_by_hand is not None:
            hl = self.lowered_by_hand
            main = Function(ControlFlowGraph(list(hl.blocks)), hl.vars_in, hl.vars_out, None,
                            name="main")
            main.blocks = list(hl.blocks)
            return main
        return self.function(self.main)

    @property
    def graph(self) -> "ControlFlowGraph":
        """TFP's ``Program.graph``: the entry point's blocks."""
        return self.main_function().graph

    @property
    def vars_in(self) -> List[str]:
        """TFP's ``Program.vars_in``: the entry point's parameters."""
        if self.lowered_by_hand is not None:
            return list(self.lowered_by_hand.vars_in)
        return list(self.function(self.main).params)

    @property
    def vars_out(self) -> Any:
        """TFP's ``Program.vars_out``: the pattern the entry point returns
        (None for a program of autobatch's own form, whose functions return
        with ``ReturnOp`` s)."""
        if self.lowered_by_hand is not None:
            return self.lowered_by_hand.vars_out
        return self.function(self.main).vars_out

    @property
    def var_alloc(self) -> Dict[str, VariableAllocation]:
        """TFP's ``Program.var_alloc``: ``{variable: VariableAllocation}``
        over every function (main's first; where two functions use one
        name, the first listed wins), plus :data:`pc_var` when the program
        counter's allocation is known (``pc_alloc``).  Empty before
        allocation; a program lowered by hand has every variable's (FULL
        unless given)."""
        if self.lowered_by_hand is not None:
            return self.lowered_by_hand.var_alloc
        out: Dict[str, VariableAllocation] = {}
        for fn in sorted(self.functions, key=lambda f: f.name != self.main):
            for var, alloc in fn.var_alloc.items():
                out.setdefault(var, alloc)
        if self.pc_alloc is not None:
            out.setdefault(pc_var, self.pc_alloc)
        return out

    def replace(self, var_defs: Optional[Dict[str, Any]] = None,
                var_alloc: Optional[Dict[str, Any]] = None) -> "Program":
        """TFP's ``Program.replace``: a copy of the program with its
        ``var_defs`` and/or ``var_alloc`` replaced (a ValueError if both are
        None).  The program is not changed.

        Here types and allocations live per function: each function of the
        copy takes the entries of ``var_defs`` (``var_alloc``) for its own
        variables; a ``var_defs`` given before type inference is what the
        copy was "built with" (``given_var_defs``; see
        :meth:`with_declared_types`); ``var_alloc[pc_var]`` becomes
        ``pc_alloc``."""
        if var_defs is None and var_alloc is None:
            raise ValueError("Nothing to replace")
        if var_defs is not None:
            var_defs = {k: (v if isinstance(v, Type) else Type(v)) for k, v in var_defs.items()}
            var_defs.setdefault(pc_var, single_type(np.int32, ()))
        if var_alloc is not None:
            var_alloc = {k: _as_allocation(v) for k, v in var_alloc.items()}
        out = copy.copy(self)
        if self.lowered_by_hand is not None:
            hl = self.lowered_by_hand
            out.lowered_by_hand = HandLowered(
                hl.blocks, var_defs if var_defs is not None else hl.var_defs, hl.vars_in,
                hl.vars_out, var_alloc if var_alloc is not None else hl.var_alloc)
            out.given_var_defs = out.lowered_by_hand.var_defs
            return out
        functions = []
        for fn in self.functions:
            changes: Dict[str, Any] = {}
            names = fn.variables()
            if var_defs is not None and fn.var_types:
                changes["var_types"] = {v: var_defs.get(v, fn.var_types.get(v)) for v in names
                                        if v in var_defs or v in fn.var_types}
            if var_alloc is not None:
                changes["var_alloc"] = {v: var_alloc[v] for v in names if v in var_alloc}
            new = copy.copy(fn)
            for key, value in changes.items():
                setattr(new, key, value)
            functions.append(new)
        out.functions = tuple(functions)
        if var_defs is not None:
            out.given_var_defs = var_defs
        if var_alloc is not None and pc_var in var_alloc:
            out.pc_alloc = var_alloc[pc_var]
        return out

    @property
    def var_defs(self) -> Dict[str, Type]:
        """TFP's view of the inferred types: ``{variable: Type}`` over every
        function (main's first; where two functions use one name, the first
        listed wins), plus the program counter :data:`pc_var` (int32).
        Before type inference: the ``var_defs`` the program was built with,
        if any (a program lowered by hand keeps those)."""
        if self.lowered_by_hand is not None:
            return self.lowered_by_hand.var_defs
        out: Dict[str, Type] = {}
        for fn in sorted(self.functions, key=lambda f: f.name != self.main):
            for var, typ in fn.var_types.items():
                out.setdefault(var, typ)
        if not out:
            return dict(self.given_var_defs or {})
        out.setdefault(pc_var, single_type(np.int32, ()))
        return out

    def with_declared_types(self) -> Optional["Program"]:
        """TFP's programs carry their types in ``var_defs``: a copy typed from
        them (each function's ``var_types`` and ``return_type``), where the
        program is untyped and ``var_defs`` types every variable of every
        function fully; else None.  (TFP's lowering tests allocate and lower
        such programs without running type inference.)"""
        declared = self.given_var_defs or {}
        if not declared or any(fn.var_types for fn in self.functions):
            return None

        def full(name: str) -> Optional[Type]:
            typ = declared.get(name)
            if not isinstance(typ, Type) or any(t is None for t in typ.leaves()):
                return None
            return typ

        functions = []
        for fn in self.functions:
            types = {v: full(v) for v in fn.variables()}
            returns = [b.terminator.vars for b in fn.blocks
                       if isinstance(b.terminator, ReturnOp)]
            if None in types.values() or not returns:
                return None
            ret = pattern_map(lambda v: types[v].tensors, returns[0])
            functions.append(replace(fn, var_types=types, return_type=Type(ret)))
        return self.replace_functions(functions)

    def replace_functions(self, functions: Sequence[Function], **changes: Any) -> "Program":
        """A copy with new functions (same order) and other fields changed."""
        return replace(self, functions=tuple(functions), **changes)

    def validate(self) -> "Program":
        """Check names, targets and arities; return self or raise ProgramError."""
        if self.lowered_by_hand is not None:
            raise ProgramError(
                "this program was lowered by hand (its graph has PushGotoOp, IndirectGotoOp "
                "or PopOp): type inference, allocation and lowering take programs whose "
                "calls are FunctionCallOp; run it as it is with virtual_machine.execute("
                "program, args, max_stack_depth, backend) or instructions.interpret("
                "program, *inputs)")
        names = [fn.name for fn in self.functions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ProgramError(f"program defines function(s) {dup} more than once")
        self.function(self.main)
        by_name = {fn.name: fn for fn in self.functions}
        for fn in self.functions:
            if not fn.blocks:
                raise ProgramError(f"function {fn.name!r} has no blocks")
            if len(set(fn.params)) != len(fn.params):
                raise ProgramError(f"function {fn.name!r} repeats a parameter name: "
                                   f"{fn.params}")
            blocks = {}
            for block in fn.blocks:
                if block.name in blocks:
                    raise ProgramError(f"function {fn.name!r} has two blocks named "
                                       f"{block.name!r}")
                blocks[block.name] = block
            for block in fn.blocks:
                where = f"function {fn.name!r}, block {block.name!r}"
                if block.terminator is None:
                    raise ProgramError(f"{where} has no terminator (missing return?)")
                for target in block.terminator.targets:
                    if target not in blocks:
                        raise ProgramError(f"{where} jumps to unknown block {target!r}")
                for op in block.instructions:
                    if isinstance(op, FunctionCallOp):
                        callee = by_name.get(op.function)
                        if callee is None:
                            raise ProgramError(f"{where} calls unknown function "
                                               f"{op.function!r}")
                        if len(op.vars_in) != len(callee.params):
                            raise ProgramError(
                                f"{where}: {op.function!r} takes {len(callee.params)} "
                                f"argument(s) {callee.params}, the call passes "
                                f"{len(op.vars_in)}")
        return self

    def format(self) -> str:
        if self.lowered_by_hand is not None:
            # TFP's layout: the variable declarations, then the graph as "main".
            hl = self.lowered_by_hand
            lines = [f"{var} :: {hl.var_alloc[var].name}, {hl.var_defs[var]}"
                     for var in sorted(hl.var_defs)]
            return "\n".join(lines + ["", self.main_function().format()])
        head = f"program main={self.main}"
        if self.pc_alloc is not None:
            head += f" pc={self.pc_alloc}"
        return "\n\n".join([head] + [fn.format() for fn in self.functions])

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        """TFP's ``__str__(indent=0, width=80)``.  A program built TFP's way
        (from a graph and ``var_defs``, or lowered by hand) prints TFP's
        text (:func:`tfp_program_text`); any other, :meth:`format`
        indented ``indent`` spaces, lines broken to fit ``width``."""
        if self.lowered_by_hand is not None or self.given_var_defs is not None:
            return tfp_program_text(self, indent, width)
        return _layout(self.format(), indent, width)


def _name_unnamed(items, prefix: str) -> None:
    """Give each item of ``items`` (functions or blocks) whose ``name`` is
    None the name ``<prefix>_<its index>``, with ``_`` appended until it
    differs from every name already taken among them."""
    taken = {item.name for item in items if item.name is not None}
    for k, item in enumerate(items):
        if item.name is None:
            name = f"{prefix}_{k}"
            while name in taken:
                name += "_"
            item.name = name
            taken.add(name)


def _keep_block(term: Any, block: Block) -> str:
    """``block``'s name, for a terminator that named it by object; the
    object is kept on the terminator, so that TFP's attribute names
    (``true_block``, ``block``...) still give it."""
    term.__dict__.setdefault("_tfp_blocks", {})[block.name] = block
    return block.name


def _resolve_references(functions: Sequence[Function]) -> None:
    """Turn TFP-style references into autobatch's names, in place: unnamed
    functions and blocks get names (``function_<k>``, ``block_<k>``), a call
    of a Function object calls its name, a jump to a Block object jumps to
    its name, TFP's halt (``GotoOp(None)``, :func:`halt_op`) returns the
    function's ``vars_out``, and the ``PopOp`` s TFP writes in function
    bodies ("done with x") are dropped (variables here are local to their
    function: a pop restores nothing).  Programs written with names are left
    as they are."""
    _name_unnamed(functions, "function")
    for fn in functions:
        _name_unnamed(fn.blocks, "block")
        for block in fn.blocks:
            if fn.vars_out is not None:
                # TFP marks "done with x" by PopOp in function bodies; with
                # variables local to their function it restores nothing.
                block.instructions = [op for op in block.instructions
                                      if not isinstance(op, PopOp)]
            for op in block.instructions:
                if isinstance(op, FunctionCallOp) and isinstance(op.function, Function):
                    op.function = op.function.name
            term = block.terminator
            if isinstance(term, GotoOp):
                if term.target is None:
                    if fn.vars_out is None:
                        raise ProgramError(f"function {fn.name!r}, block {block.name!r} "
                                           f"halts, but the function has no vars_out to "
                                           f"return")
                    block.terminator = ReturnOp(fn.vars_out)
                elif isinstance(term.target, Block):
                    term.target = _keep_block(term, term.target)
            elif isinstance(term, BranchOp):
                if isinstance(term.true_target, Block):
                    term.true_target = _keep_block(term, term.true_target)
                if isinstance(term.false_target, Block):
                    term.false_target = _keep_block(term, term.false_target)


class Module:
    """TFP's ``Module``: functions that may call one another, no entry point
    yet.  ``functions`` are :class:`Function` s, built either way (by
    :class:`~autobatch.dsl.ProgramBuilder` or TFP's object graph);
    ``var_defs`` the types given with them (TFP's builder gives ``Type(None)``
    for each variable; here what the caller passes, default empty)."""

    def __init__(self, functions: Sequence[Function],
                 var_defs: Optional[Dict[str, Any]] = None) -> None:
        self.functions = list(functions)
        self.var_defs = dict(var_defs or {})

    def lookup(self, func_name: Any) -> Optional[Function]:
        """The function named ``func_name`` (or that Function), else None."""
        for fn in self.functions:
            if fn is func_name or (fn.name is not None and str(fn.name) == str(func_name)):
                return fn
        return None

    def program(self, main: Any) -> "Program":
        """The program entering this module at ``main`` (a name, a Function or
        a :class:`~autobatch.dsl.FunctionHandle`), with the functions it can
        reach.  Raises ProgramError naming the known functions when there is
        no such function."""
        name = getattr(main, "name", main)
        fn = self.lookup(main) or self.lookup(name)
        if fn is None:
            known = sorted(str(f.name) for f in self.functions if f.name is not None)
            raise ProgramError(f"module has no function {name!r} (functions: {known}); "
                               f"pass one of them to Module.program")
        everything = Program(functions=tuple(self.functions), main=fn)
        used = reachable(call_graph(everything), everything.main)
        program = Program(functions=tuple(f for f in everything.functions if f.name in used),
                          main=everything.main)
        program.given_var_defs = dict(self.var_defs) or None
        return program.validate()

    def function_names(self) -> List[str]:
        """The functions' names, in order (TFP's ``Context.function_names``)."""
        return [str(fn.name) for fn in self.functions]

    def __str__(self) -> str:
        return "\n\n".join(fn.format() for fn in self.functions)


def call_graph(program: Program) -> Dict[str, List[str]]:
    """``{function: sorted callees}`` for every function of ``program``."""
    return {fn.name: fn.callees() for fn in program.functions}


def reachable(graph: Dict[str, List[str]], start: str) -> Set[str]:
    """Functions reachable from ``start`` by calls, ``start`` included."""
    seen = {start}
    todo = [start]
    while todo:
        for callee in graph.get(todo.pop(), ()):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen
