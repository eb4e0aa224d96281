"""Lower calls to explicit stack operations and jumps: :func:`lower`.

The result, a :class:`LoweredProgram`, is one flat list of blocks over
variables with program-wide names (``"fib/n"``), ready for the batched VM.

A call ``out = call g(args)`` in function ``f`` becomes::

    push <f's variables live across the call that g may overwrite>   (FULL ones)
    g/params = copy args
    push-goto <continuation>, g/entry        # saves the return address
  continuation:
    pop <the same variables>
    out = copy <ret:T>                        # T: g's return type

and ``return v`` becomes ``<ret:T> = copy v; indirect-goto``.  Return values
travel in one register per return type (``<ret:int64[]>``), shared by all
functions, so a *tail call* (``x = call g(..); return x``) is just ``g/params =
copy args; goto g/entry``: ``g`` returns straight to ``f``'s caller.

Frames: every stack is indexed by the thread's call depth, so all variables
saved by one call share one frame slot (one depth counter per thread, no
per-variable stack pointers).  A ``push x`` right after ``pop x`` of the same
call depth, with ``x`` unchanged between them, is dropped: the frame still
holds that value (two calls in a row that both keep ``x``).

Blocks that only jump on (``goto``, no instructions) are skipped: jumps to
them go straight to their target.

The lowered program also carries, per block, the variables live at its end
(:attr:`LoweredProgram.live_out`), from :mod:`memopt.liveness` run over the
whole lowered flow graph (a return goes to every continuation of a call that
can end in that function).  The VM writes a block's results to their
registers only where they are live after the block, so a pop whose value is
only used inside its block, or a write that is immediately pushed, never
touches the register.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from memopt.liveness import FlowNode, analyze

from autobatch.errors import ProgramError
from autobatch.ir import (
    ControlFlowGraph,
    Block, BranchOp, CopyOp, Function, FunctionCallOp, GotoOp, IndirectGotoOp, PopOp,
    PrimOp, Program, PushGotoOp, PushOp, ReturnOp, Type, VariableAllocation, call_graph,
    drop_repushes, function_flow, pattern_map, reachable,
)

__all__ = ["LoweredProgram", "lower", "lower_function_calls", "return_register"]


def return_register(typ: Type) -> str:
    """The name of the register that carries return values of type ``typ``."""
    return f"<ret:{typ}>"


@dataclass(eq=False)
class LoweredProgram:
    """A program with calls lowered to stack operations (see the module doc).

    Attributes
    ----------
    blocks : every block, in scheduling order (the VM runs the lowest-index
        block any thread is at); names are ``"function/block"``.
    entry : the block where every thread starts (main's entry).
    var_types, var_alloc : per program-wide variable name.
    inputs : main's parameters (program-wide names).
    output : the register holding main's return value when a thread halts.
    pc_alloc : FULL where return addresses need a stack.
    live_out : per block name, the variables live after it.
    callee : per block that ends in a push-goto, the function it calls.
    source : the typed, allocated program this was lowered from.
    """

    blocks: List[Block]
    entry: str
    var_types: Dict[str, Type]
    var_alloc: Dict[str, VariableAllocation]
    inputs: Tuple[str, ...]
    output: str
    pc_alloc: VariableAllocation
    live_out: Dict[str, frozenset] = field(default_factory=dict)
    callee: Dict[str, str] = field(default_factory=dict)
    source: Optional[Program] = None

    def block_index(self) -> Dict[str, int]:
        return {b.name: i for i, b in enumerate(self.blocks)}

    @property
    def graph(self) -> ControlFlowGraph:
        """TFP's view of a lowered program's blocks: a
        :class:`~autobatch.ir.ControlFlowGraph` (``exit_index()``,
        ``block(i)``, each block's ``terminator``), as TFP's tests inspect
        ``ctx.lowered_for_args(...).graph``."""
        return ControlFlowGraph(self.blocks)

    def format(self) -> str:
        lines = [f"lowered program: inputs ({', '.join(self.inputs)}) -> {self.output}, "
                 f"pc {self.pc_alloc}"]
        for var in sorted(self.var_types):
            lines.append(f"  # {var}: {self.var_types[var]} {self.var_alloc[var]}")
        for i, block in enumerate(self.blocks):
            text = block.format(indent="    ").split("\n")
            lines.append(f"  [{i}] {text[0]}")
            lines.extend(text[1:])
            live = sorted(self.live_out.get(block.name, ()))
            lines.append(f"      live out: {', '.join(live) if live else '-'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _require_prepared(program: Program, in_use: Set[str]) -> None:
    if program.pc_alloc is None:
        raise ProgramError("lower() needs an allocated program: run "
                           "allocation_strategy.optimize first")
    for fn in program.functions:
        if fn.name in in_use and (fn.return_type is None or not fn.var_alloc):
            raise ProgramError(f"function {fn.name!r} is not typed and allocated: run "
                               f"type_inference.infer_types and "
                               f"allocation_strategy.optimize before lower()")


def lower(program: Program) -> LoweredProgram:
    """Lower a typed, allocated program (see the module doc).

    Only functions reachable from ``main`` are kept.  The steps:
    :class:`_Lowering` rewrites each function's blocks (calls, returns,
    jumps), :func:`~autobatch.instructions.drop_repushes` and :func:`_skip_empty_blocks` tidy the
    result, :func:`_live_out` computes what the VM must write back.
    """
    program.validate()
    graph = call_graph(program)
    in_use = reachable(graph, program.main)
    _require_prepared(program, in_use)
    functions = [fn for fn in program.functions if fn.name in in_use]
    functions.sort(key=lambda fn: fn.name != program.main)  # main first, stable
    lowering = _Lowering(program, {name: reachable(graph, name) for name in in_use})
    for fn in functions:
        lowering.function(fn)
    for block in lowering.blocks:
        drop_repushes(block)
    main = program.main_function()
    blocks, entry = _skip_empty_blocks(lowering.blocks, f"{main.name}/{main.entry.name}")
    lowered = LoweredProgram(
        blocks=blocks, entry=entry, var_types=lowering.var_types,
        var_alloc=lowering.var_alloc, inputs=tuple(f"{main.name}/{p}" for p in main.params),
        output=lowering.ret_reg(main.return_type), pc_alloc=_pc_alloc(program),
        callee=lowering.callee_of, source=program)
    lowered.live_out = _live_out(lowered, lowering.owner, lowering.continuation_of,
                                 lowering.tail_edges, main.name)
    return lowered


def lower_function_calls(program: Program) -> LoweredProgram:
    """TFP's name for :func:`lower`."""
    return lower(program)


def _qualify(fn_name: str, pattern: Any) -> Any:
    """Program-wide names: ``n`` of ``fib`` is ``fib/n``."""
    return pattern_map(lambda v: f"{fn_name}/{v}", pattern)


def terminator_of(block: Block) -> Any:
    """``block``'s terminator; a block of a lowered program always has one
    (a missing one is a ProgramError naming the block)."""
    if block.terminator is None:
        raise ProgramError(f"block {block.name!r} has no terminator")
    return block.terminator


def _pc_alloc(program: Program) -> VariableAllocation:
    """The program counter's allocation, which allocation_strategy.optimize sets."""
    if program.pc_alloc is None:
        raise ProgramError("the program has no program-counter allocation: run "
                           "allocation_strategy.optimize before lowering")
    return program.pc_alloc


class _Lowering:
    """The block rewriting of :func:`lower`, one function at a time.

    Attributes (the lowered program being built)
    ----------
    blocks : lowered blocks, in order.
    var_types, var_alloc : per program-wide variable (return registers included).
    owner : lowered block -> the function it belongs to.
    continuation_of : continuation block -> the function whose call returns there.
    callee_of : block ending in a push-goto -> the function it calls.
    tail_edges : function -> the functions it tail-calls.
    """

    def __init__(self, program: Program, reach: Dict[str, Set[str]]) -> None:
        self.program = program
        self.reach = reach
        self.var_types: Dict[str, Type] = {}
        self.var_alloc: Dict[str, VariableAllocation] = {}
        self.blocks: List[Block] = []
        self.owner: Dict[str, str] = {}
        self.continuation_of: Dict[str, str] = {}
        self.callee_of: Dict[str, str] = {}
        self.tail_edges: Dict[str, Set[str]] = {name: set() for name in reach}

    def ret_reg(self, typ: Optional[Type]) -> str:
        """The return register for values of ``typ`` (declared on first use)."""
        if typ is None:
            raise ProgramError("a function without a return type: run "
                               "type_inference.infer_types before lowering")
        name = return_register(typ)
        self.var_types[name] = typ
        self.var_alloc[name] = VariableAllocation.REGISTER
        return name

    def new_block(self, name: str, fn: Function) -> Block:
        block = Block(name)
        self.blocks.append(block)
        self.owner[name] = fn.name
        return block

    def function(self, fn: Function) -> None:
        """Declare ``fn``'s variables and lower its blocks."""
        for var, typ in fn.var_types.items():
            self.var_types[_qualify(fn.name, var)] = typ
            self.var_alloc[_qualify(fn.name, var)] = fn.var_alloc.get(
                var, VariableAllocation.NULL)
        flow = function_flow(fn)
        for block in fn.blocks:
            self.block(fn, block, flow)

    def block(self, fn: Function, block: Block, flow: Any) -> None:
        """One source block: its primops, each call (which ends the lowered
        block and opens a continuation), then its terminator."""
        current = self.new_block(_qualify(fn.name, block.name), fn)
        tail = block.tail_call()
        conts = 0
        for k, op in enumerate(block.instructions):
            if isinstance(op, PrimOp):
                current.instructions.append(PrimOp(
                    _qualify(fn.name, op.vars_in), _qualify(fn.name, op.vars_out),
                    op.function, name=op.name))
                continue
            if not isinstance(op, FunctionCallOp):
                raise ProgramError(f"function {fn.name!r}, block {block.name!r}: "
                                   f"{type(op).__name__} cannot be lowered")
            callee = self.program.function(op.function)
            if op is tail and callee.return_type == fn.return_type:
                self.tail_call(fn, op, callee, current)
                return
            conts += 1
            current = self.call(fn, block, k, op, callee, current, flow, conts)
        self.terminator(fn, block, current)

    def copy_args(self, fn: Function, op: FunctionCallOp, callee: Function
                  ) -> Optional[CopyOp]:
        if not callee.params:
            return None
        return CopyOp(_qualify(fn.name, op.vars_in), _qualify(callee.name, callee.params))

    def tail_call(self, fn: Function, op: FunctionCallOp, callee: Function,
                  current: Block) -> None:
        """``x = call g(..); return x``: copy the arguments, jump to g's entry."""
        copy = self.copy_args(fn, op, callee)
        if copy:
            current.instructions.append(copy)
        current.terminator = GotoOp(f"{callee.name}/{callee.entry.name}")
        self.tail_edges[fn.name].add(callee.name)

    def saved_across(self, fn: Function, block: Block, k: int, op: FunctionCallOp,
                     callee: Function, flow: Any) -> Tuple[str, ...]:
        """What the call must push: ``fn``'s variables live across it, where
        the callee may run ``fn`` again (each must be allocated FULL)."""
        if fn.name not in self.reach[callee.name]:
            return ()
        across = set(flow.liveness.live_out(flow.node(block.name, k))) - set(op.writes)
        saved: Tuple[str, ...] = tuple(f"{fn.name}/{v}" for v in sorted(across))
        for var in saved:
            if self.var_alloc[var] != VariableAllocation.FULL:
                raise ProgramError(
                    f"variable {var!r} is live across a recursive call but allocated "
                    f"{self.var_alloc[var]}; run allocation_strategy.optimize on the "
                    f"typed program")
        return saved

    def call(self, fn: Function, block: Block, k: int, op: FunctionCallOp,
             callee: Function, current: Block, flow: Any, conts: int) -> Block:
        """A returning call: push, copy the arguments, push-goto; the new
        continuation block pops and takes the return value.  Returns it."""
        saved = self.saved_across(fn, block, k, op, callee, flow)
        if saved:
            current.instructions.append(PushOp(saved))
        copy = self.copy_args(fn, op, callee)
        if copy:
            current.instructions.append(copy)
        cont_name = f"{_qualify(fn.name, block.name)}.ret{conts}"
        current.terminator = PushGotoOp(cont_name, f"{callee.name}/{callee.entry.name}")
        self.callee_of[current.name] = callee.name
        self.continuation_of[cont_name] = callee.name
        cont = self.new_block(cont_name, fn)
        if saved:
            cont.instructions.append(PopOp(saved))
        cont.instructions.append(CopyOp(self.ret_reg(callee.return_type),
                                        _qualify(fn.name, op.vars_out)))
        return cont

    def terminator(self, fn: Function, block: Block, current: Block) -> None:
        """Jumps keep their (qualified) targets; a return copies its value to
        the return register and jumps back (indirect-goto)."""
        term = block.terminator
        if isinstance(term, GotoOp):
            current.terminator = GotoOp(_qualify(fn.name, term.target))
        elif isinstance(term, BranchOp):
            current.terminator = BranchOp(_qualify(fn.name, term.cond),
                                          _qualify(fn.name, term.true_target),
                                          _qualify(fn.name, term.false_target))
        elif isinstance(term, ReturnOp):
            current.instructions.append(CopyOp(_qualify(fn.name, term.vars),
                                               self.ret_reg(fn.return_type)))
            current.terminator = IndirectGotoOp()
        else:
            raise ProgramError(f"function {fn.name!r}, block {block.name!r}: "
                               f"{type(term).__name__} cannot be lowered")


def _skip_empty_blocks(blocks: List[Block], entry: str) -> Tuple[List[Block], str]:
    """Make jumps to a block that only jumps on go straight to its target, and
    drop the blocks nothing jumps to any more (a VM step saved per pass)."""
    by_name = {b.name: b for b in blocks}

    def final(name: str) -> str:
        seen = set()
        while name not in seen:
            seen.add(name)
            block = by_name[name]
            if block.instructions or not isinstance(block.terminator, GotoOp):
                return name
            name = block.terminator.target
        return name  # a cycle of empty blocks (an endless loop): leave it

    for block in blocks:
        term = block.terminator
        if isinstance(term, GotoOp):
            term.target = final(term.target)
        elif isinstance(term, BranchOp):
            term.true_target = final(term.true_target)
            term.false_target = final(term.false_target)
        elif isinstance(term, PushGotoOp):
            term.target = final(term.target)
            term.return_target = final(term.return_target)
    entry = final(entry)
    used = {entry}
    for block in blocks:
        term = terminator_of(block)
        used.update(term.targets)
        if isinstance(term, PushGotoOp):
            used.add(term.return_target)
    return [b for b in blocks if b.name in used], entry


def _live_out(lowered: LoweredProgram, owner: Dict[str, str],
              continuation_of: Dict[str, str], tail_edges: Dict[str, Set[str]],
              main: str) -> Dict[str, frozenset]:
    """Variables live after each block, by :func:`memopt.liveness.analyze` on
    the lowered flow graph (one node per instruction and terminator, plus an
    exit node that reads the output)."""
    # Where can a return in function g land?  At the continuation of any call
    # to a function h that reaches g by tail calls (h itself included).
    tail_reach = {h: reachable({k: sorted(v) for k, v in tail_edges.items()}, h)
                  for h in tail_edges}
    returns_to: Dict[str, List[str]] = {g: [] for g in tail_edges}
    for cont, h in continuation_of.items():
        for g in sorted(tail_reach[h]):
            returns_to[g].append(cont)
    halts = tail_reach[main]

    start: Dict[str, int] = {}
    n = 0
    for block in lowered.blocks:
        start[block.name] = n
        n += len(block.instructions) + 1
    exit_node = n
    nodes: List[FlowNode] = []
    terminators: Dict[str, int] = {}
    for block in lowered.blocks:
        for k, op in enumerate(block.instructions):
            nodes.append(FlowNode(op.reads, op.writes, (start[block.name] + k + 1,)))
        term = terminator_of(block)
        if isinstance(term, IndirectGotoOp):
            fn = owner[block.name]
            succ = [start[c] for c in returns_to[fn]]
            if fn in halts:
                succ.append(exit_node)
        else:
            succ = [start[t] for t in term.targets]
        terminators[block.name] = len(nodes)
        nodes.append(FlowNode(term.reads, (), tuple(dict.fromkeys(succ))))
    nodes.append(FlowNode((lowered.output,), (), ()))
    liveness = analyze(nodes, live_at_exit=(), entry=0)
    return {name: liveness.live_out(i) for name, i in terminators.items()}
