"""Write autobatch programs by hand: :class:`ProgramBuilder`.

Example (``x ** k`` by squaring)::

    ab = ProgramBuilder()
    with ab.function("power", params=["x", "k"]):
        ab.primop(lambda k: k == 0, "done")            # inputs: the lambda's parameters
        with ab.if_("done"):
            ab.primop(lambda x: x * 0 + 1, "one")
            ab.return_("one")
        ab.primop(lambda k: k // 2, "half_k")
        ab.call("power", ["x", "half_k"], "half")      # recursion
        ab.primop(lambda half: half * half, "result")
        ab.primop(lambda k: k % 2 == 1, "odd")
        with ab.if_("odd"):
            ab.primop(lambda result, x: result * x, "result")
        ab.return_("result")
    program = ab.program(main="power")

Functions call each other by name, so recursion and mutual recursion need no
forward declarations.  Control flow: :meth:`~ProgramBuilder.if_` /
:meth:`~ProgramBuilder.else_`, :meth:`~ProgramBuilder.while_`,
:meth:`~ProgramBuilder.loop` with :meth:`~ProgramBuilder.break_` /
:meth:`~ProgramBuilder.continue_`, and :meth:`~ProgramBuilder.return_`.
Code after a ``return_``/``break_`` is unreachable and dropped.  A function
whose end can be reached without a ``return_`` is an error.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from autobatch.errors import ProgramError
from autobatch.instructions import (
    Block, BranchOp, FunctionCallOp, Function, GotoOp, Pattern, PrimOp, Program,
    ReturnOp,
)

__all__ = ["ProgramBuilder", "FunctionHandle"]


@dataclass(frozen=True)
class FunctionHandle:
    """What :meth:`ProgramBuilder.function` yields: a name to call."""

    name: str


@dataclass
class _Loop:
    head: str
    exit: str


@dataclass
class _PendingIf:
    branch: BranchOp
    join: Block


@dataclass
class _FunctionState:
    name: str
    params: Tuple[str, ...]
    type_inference: Optional[Callable]
    blocks: List[Block] = field(default_factory=list)
    current: Optional[Block] = None
    counter: int = 0
    loops: List[_Loop] = field(default_factory=list)
    pending_if: Optional[_PendingIf] = None


def _input_names(function: Callable, where: str) -> Tuple[str, ...]:
    """The parameter names of ``function`` (the variables a primop reads)."""
    try:
        sig = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise ProgramError(f"{where}: cannot read the parameters of {function!r}; "
                           f"pass vars_in explicitly") from exc
    names = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ProgramError(f"{where}: {function!r} takes *args/**kwargs; pass "
                               f"vars_in explicitly")
        names.append(p.name)
    return tuple(names)


class ProgramBuilder:
    """Builds a :class:`~autobatch.instructions.Program` one instruction at a time.

    All methods that emit code must be called inside ``with
    builder.function(...)``.  Variable names are plain strings local to the
    function being built.
    """

    def __init__(self) -> None:
        self._functions: List[Function] = []
        self._state: Optional[_FunctionState] = None

    # -- functions -------------------------------------------------------------
    @contextlib.contextmanager
    def function(self, name: str, params: Sequence[str] = (),
                 type_inference: Optional[Callable] = None) -> Iterator[FunctionHandle]:
        """Define function ``name`` with parameters ``params`` (variable names).

        ``type_inference`` (optional) maps the list of parameter Types to the
        return Type; see :class:`~autobatch.instructions.Function`.
        """
        if self._state is not None:
            raise ProgramError(f"function {name!r} is defined inside function "
                               f"{self._state.name!r}; define functions one after another")
        if any(fn.name == name for fn in self._functions):
            raise ProgramError(f"function {name!r} is defined twice")
        params = (params,) if isinstance(params, str) else tuple(params)
        state = _FunctionState(name=name, params=params, type_inference=type_inference)
        self._state = state
        self._enter(self._new_block("entry"))
        try:
            yield FunctionHandle(name)
        except BaseException:
            self._state = None
            raise
        self._state = None
        self._functions.append(self._finish(state))

    def program(self, main: Union[str, FunctionHandle]) -> Program:
        """The program built so far, entering at ``main``."""
        if self._state is not None:
            raise ProgramError(f"program() called inside function {self._state.name!r}")
        main_name = main.name if isinstance(main, FunctionHandle) else main
        return Program(functions=tuple(self._functions), main=main_name).validate()

    # -- straight-line code -------------------------------------------------------
    def primop(self, function: Callable, vars_out: Pattern,
               vars_in: Optional[Sequence[str]] = None, name: Optional[str] = None) -> Pattern:
        """Emit ``vars_out = function(*vars_in)``.

        ``vars_in`` defaults to the parameter names of ``function``, so
        ``primop(lambda n: n - 1, "m")`` reads variable ``n``.  ``vars_out`` is a
        name or a nested tuple of names (to take a tuple result apart).
        Returns ``vars_out``.
        """
        state = self._require("primop")
        if vars_in is None:
            vars_in = _input_names(function, f"function {state.name!r}")
        self._emit(PrimOp(tuple(vars_in) if not isinstance(vars_in, str) else (vars_in,),
                          vars_out, function, name))
        return vars_out

    def const(self, value: Any, var: str) -> str:
        """Emit ``var = value`` (a constant; scalars are broadcast to every thread)."""
        self.primop(lambda: value, var, vars_in=(), name=repr(value))
        return var

    def call(self, function: Union[str, FunctionHandle], vars_in: Sequence[str],
             vars_out: Pattern) -> Pattern:
        """Emit ``vars_out = function(*vars_in)``; ``function`` is a name or handle."""
        self._require("call")
        name = function.name if isinstance(function, FunctionHandle) else function
        vars_in = (vars_in,) if isinstance(vars_in, str) else tuple(vars_in)
        self._emit(FunctionCallOp(name, vars_in, vars_out))
        return vars_out

    # -- control flow ---------------------------------------------------------------
    def return_(self, vars: Pattern) -> None:
        """Return the value of ``vars`` (a name or nested tuple of names)."""
        self._require("return_")
        self._terminate(ReturnOp(vars))

    @contextlib.contextmanager
    def if_(self, cond: str) -> Iterator[None]:
        """Run the body where variable ``cond`` is true; may be followed by
        :meth:`else_`."""
        state = self._require("if_")
        k = self._next_id()
        then = self._new_block(f"if{k}.then")
        join = self._new_block(f"if{k}.join")
        branch = BranchOp(cond, then.name, join.name)
        self._terminate(branch)
        self._enter(then)
        yield
        self._close(join.name)
        self._enter(join)
        state.pending_if = _PendingIf(branch, join)

    @contextlib.contextmanager
    def else_(self) -> Iterator[None]:
        """The body run where the condition of the ``if_`` just closed is false."""
        state = self._require("else_")
        pending = state.pending_if
        if (pending is None or state.current is not pending.join
                or pending.join.instructions or pending.join.terminator is not None):
            raise ProgramError(f"function {state.name!r}: else_() must come right "
                               f"after an if_() block")
        state.pending_if = None
        join = pending.join
        state.blocks.remove(join)
        other = self._new_block(join.name.replace(".join", ".else"))
        pending.branch.false_target = other.name
        self._enter(other)
        yield
        self._close(join.name)
        self._enter(join)

    @contextlib.contextmanager
    def while_(self, cond: Union[str, Callable],
               vars_in: Optional[Sequence[str]] = None) -> Iterator[None]:
        """Repeat the body while the condition holds, tested before each pass.

        ``cond`` is a variable name (the body must update it) or a callable
        evaluated at the head of every pass (its inputs are its parameter
        names, or ``vars_in``).
        """
        state = self._require("while_")
        k = self._next_id()
        head = self._new_block(f"loop{k}.head")
        body = self._new_block(f"loop{k}.body")
        exit_ = self._new_block(f"loop{k}.exit")
        self._close(head.name)
        self._enter(head)
        if callable(cond):
            cond = self.primop(cond, f"loop{k}.cond", vars_in)
        self._terminate(BranchOp(cond, body.name, exit_.name))
        self._enter(body)
        with self._looping(state, head, exit_):
            yield

    @contextlib.contextmanager
    def loop(self) -> Iterator[None]:
        """Repeat the body until a :meth:`break_` (or a return)."""
        state = self._require("loop")
        k = self._next_id()
        body = self._new_block(f"loop{k}.body")
        exit_ = self._new_block(f"loop{k}.exit")
        self._close(body.name)
        self._enter(body)
        with self._looping(state, body, exit_):
            yield

    @contextlib.contextmanager
    def _looping(self, state: _FunctionState, head: Block, exit_: Block) -> Iterator[None]:
        """The body of a loop whose passes start at ``head``; code after the
        loop goes into ``exit_``."""
        state.loops.append(_Loop(head.name, exit_.name))
        yield
        state.loops.pop()
        self._close(head.name)
        self._enter(exit_)

    def break_(self) -> None:
        """Leave the innermost loop."""
        self._terminate(GotoOp(self._innermost_loop("break_").exit))

    def continue_(self) -> None:
        """Start the next pass of the innermost loop."""
        self._terminate(GotoOp(self._innermost_loop("continue_").head))

    # -- internals ----------------------------------------------------------------------
    def _require(self, what: str) -> _FunctionState:
        if self._state is None:
            raise ProgramError(f"{what}() must be called inside `with builder.function(...)`")
        return self._state

    def _innermost_loop(self, what: str) -> _Loop:
        state = self._require(what)
        if not state.loops:
            raise ProgramError(f"function {state.name!r}: {what}() outside a loop")
        return state.loops[-1]

    def _next_id(self) -> int:
        state = self._state
        state.counter += 1
        return state.counter

    def _new_block(self, name: str) -> Block:
        return Block(name)

    def _enter(self, block: Block) -> None:
        """Make ``block`` the one code goes into (blocks are laid out in the
        order they are entered)."""
        state = self._state
        state.blocks.append(block)
        state.current = block
        state.pending_if = None

    def _emit(self, op: Any) -> None:
        state = self._state
        if state.current is None or state.current.terminator is not None:
            # Code after a return/break: unreachable, kept in a block that
            # _finish drops.
            self._enter(self._new_block(f"dead{self._next_id()}"))
        state.pending_if = None
        state.current.instructions.append(op)

    def _terminate(self, terminator: Any) -> None:
        state = self._state
        if state.current is None or state.current.terminator is not None:
            self._enter(self._new_block(f"dead{self._next_id()}"))
        state.pending_if = None
        state.current.terminator = terminator

    def _close(self, target: str) -> None:
        """End the current block with a jump to ``target`` unless it has ended."""
        state = self._state
        if state.current is not None and state.current.terminator is None:
            state.current.terminator = GotoOp(target)

    def _finish(self, state: _FunctionState) -> Function:
        by_name: Dict[str, Block] = {b.name: b for b in state.blocks}
        reachable = set()
        order = [state.blocks[0]]
        while order:
            block = order.pop()
            if block.name in reachable:
                continue
            reachable.add(block.name)
            if block.terminator is None:
                raise ProgramError(
                    f"function {state.name!r} can reach its end without return_ "
                    f"(block {block.name!r}); end every path with return_()")
            for target in block.terminator.targets:
                order.append(by_name[target])
        blocks = [b for b in state.blocks if b.name in reachable]
        return Function(name=state.name, params=state.params, blocks=blocks,
                        type_inference=state.type_inference)
