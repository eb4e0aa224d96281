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

TFP's style works too (``tfp.experimental.auto_batching.dsl``)::

    ab = ProgramBuilder()
    with ab.function(type_inference=lambda types: [types[0]]) as fib:
        n = ab.param("n")                              # a fresh variable, "n_1"
        ab.var.cond = ab.primop(lambda n: n > 1)       # lambda names: ab.var names
        with ab.if_(ab.var.cond):
            ab.var.nm1 = ab.primop(lambda n: n - 1)
            ab.var.fibm1 = ab.call(fib, [ab.var.nm1])
            ab.var.nm2 = ab.primop(lambda n: n - 2)
            ab.var.fibm2 = ab.call(fib, [ab.var.nm2])
            ab.var.ans = ab.primop(lambda fibm1, fibm2: fibm1 + fibm2)
        with ab.else_():
            ab.var.ans = ab.const(1)
        ab.return_(ab.var.ans)
    program = ab.program(main=fib)

``param``, ``local``, ``locals_``, ``var`` (``ab.var.x = op`` binds ``op``'s
output; reading ``ab.var.x`` gives the variable), pattern assignment
(``ab((a, b)).pattern = ab.primop(lambda: (1, 2))``), ``declare_function`` /
``define_function`` for mutual recursion.  Variables made by ``param``,
``local`` and ``var`` get unique names (``n_1``); a primop's lambda
parameter names the variable ``ab.var.<name>`` (or ``param(name)``) made, or
else a variable of that very name.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from autobatch.errors import ProgramError
from autobatch.ir import (
    Block, BranchOp, FunctionCallOp, Function, GotoOp, Pattern, PrimOp, Program,
    ReturnOp, Module,
)

__all__ = ["ProgramBuilder", "FunctionHandle"]


@dataclass(frozen=True)
class FunctionHandle:
    """What :meth:`ProgramBuilder.function` and
    :meth:`ProgramBuilder.declare_function` give: a name to call (TFP gives
    its ``Function`` object; here functions are called by name)."""

    name: str
    type_inference: Optional[Callable] = field(default=None, compare=False)


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
    #: TFP-style user names -> unique variable names (``n`` -> ``n_1``).
    locals: Dict[str, str] = field(default_factory=dict)


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


def _primop_arguments(args: Sequence[Any], kwargs: Dict[str, Any]
                      ) -> Tuple[Any, Any, Optional[str]]:
    """``(vars_in, vars_out, name)`` of a :meth:`ProgramBuilder.primop` call
    written TFP's way (``f, vars_in, vars_out``: a list second) or
    autobatch's (``f, vars_out, vars_in, name``: a name or tuple second)."""
    unknown = sorted(set(kwargs) - {"vars_in", "vars_out", "name"})
    if unknown:
        raise TypeError(f"primop() got unexpected keyword argument(s) {unknown}")
    tfp_order = bool(args) and isinstance(args[0], list)
    names = ("vars_in", "vars_out") if tfp_order else ("vars_out", "vars_in", "name")
    if len(args) > len(names):
        raise TypeError(f"primop() takes at most {len(names) + 1} positional arguments "
                        f"here, got {len(args) + 1}")
    values = dict(kwargs)
    for key, value in zip(names, args):
        if key in values:
            raise TypeError(f"primop() got {key!r} both by position and by keyword")
        values[key] = value
    return values.get("vars_in"), values.get("vars_out"), values.get("name")


class ProgramBuilder:
    """Builds a :class:`~autobatch.instructions.Program` one instruction at a time.

    All methods that emit code must be called inside ``with
    builder.function(...)``.  Variable names are plain strings local to the
    function being built.
    """

    def __init__(self) -> None:
        self._functions: List[Function] = []
        self._state: Optional[_FunctionState] = None
        self._declared: Dict[str, FunctionHandle] = {}
        self._varcount = 0
        self._magic_vars = _MagicVars(self)

    # -- functions -------------------------------------------------------------
    def declare_function(self, name: Optional[str] = None,
                         type_inference: Optional[Callable] = None) -> FunctionHandle:
        """Declare a function to define later with :meth:`define_function`
        (TFP's forward declaration, for mutual recursion; calling by name
        needs none).  A missing ``name`` gets a fresh one."""
        if name is None:
            name = f"function_{len(self._functions) + len(self._declared) + 1}"
            while name in self._declared or any(f.name == name for f in self._functions):
                name += "_"
        handle = FunctionHandle(name, type_inference)
        self._declared[name] = handle
        return handle

    @contextlib.contextmanager
    def define_function(self, function: Union[str, FunctionHandle],
                        params: Sequence[str] = ()) -> Iterator[FunctionHandle]:
        """Define a function declared by :meth:`declare_function`; its
        parameters come from :meth:`param` calls in the body (or ``params``)."""
        handle = function if isinstance(function, FunctionHandle) else \
            self._declared.get(function, FunctionHandle(function))
        with self.function(handle.name, handle.type_inference, params=params) as defined:
            yield defined

    @contextlib.contextmanager
    def function(self, name: Optional[str] = None, type_inference: Optional[Callable] = None,
                 params: Sequence[str] = ()) -> Iterator[FunctionHandle]:
        """Define function ``name`` with parameters ``params`` (variable names;
        or declare them in the body with :meth:`param`, as in TFP).

        ``type_inference`` (optional) maps the list of parameter types to the
        return type; see :class:`~autobatch.instructions.Function`.  A missing
        ``name`` gets a fresh one.  The first two in TFP's order
        (``function(name=None, type_inference=None)``); ``params`` is
        autobatch's, by keyword.
        """
        if type_inference is not None and not callable(type_inference):
            raise TypeError(f"ProgramBuilder.function({name!r}, ...): the second argument "
                            f"is TFP's type_inference (a callable), got {type_inference!r}; "
                            f"pass the parameters as params=...")
        if name is None or name in self._declared:
            declared = self._declared.get(name) if name is not None else None
            if declared is None:
                declared = self.declare_function(None, type_inference)
            name = declared.name
            type_inference = type_inference or declared.type_inference
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
            yield FunctionHandle(name, type_inference)
        except BaseException:
            self._state = None
            raise
        self._state = None
        self._functions.append(self._finish(state))

    def module(self) -> Module:
        """TFP's ``module()``: the functions built so far, as an
        :class:`~autobatch.instructions.Module` (no entry point yet;
        ``module.program(main)`` makes the program entering at ``main``)."""
        if self._state is not None:
            raise ProgramError(f"module() called inside function {self._state.name!r}; "
                               f"call it after the last `with function(...)` block")
        self._check_defined(set())
        return Module(tuple(self._functions))

    def _check_defined(self, entry: set) -> None:
        undefined = sorted(set(self._declared) - {fn.name for fn in self._functions})
        called = {op.function for fn in self._functions for b in fn.blocks
                  for op in b.instructions if isinstance(op, FunctionCallOp)}
        if set(undefined) & (called | entry):
            raise ProgramError(f"function(s) {sorted(set(undefined) & (called | entry))} "
                               f"declared and called but never defined; define them "
                               f"with define_function")

    def program(self, main: Union[str, FunctionHandle]) -> Program:
        """The program built so far, entering at ``main``."""
        if self._state is not None:
            raise ProgramError(f"program() called inside function {self._state.name!r}")
        main_name = main.name if isinstance(main, FunctionHandle) else main
        self._check_defined({main_name})
        return Program(functions=tuple(self._functions), main=main_name).validate()

    # -- straight-line code -------------------------------------------------------
    def primop(self, f: Callable, *args: Any, **kwargs: Any) -> Any:
        """Emit ``vars_out = f(*vars_in)``: TFP's ``primop(f, vars_in=None,
        vars_out=None)``, or autobatch's ``primop(f, vars_out, vars_in=None,
        name=None)``.

        The second positional argument is TFP's ``vars_in`` where it is a
        list (of variable names), autobatch's ``vars_out`` where it is a name
        or a tuple (a pattern); by keyword both read the same.  ``vars_in``
        defaults to the parameter names of ``f``, so ``primop(lambda n: n -
        1, "m")`` reads variable ``n`` (or the variable ``ab.var.n`` /
        ``param("n")`` made).  ``vars_out`` is a name or a nested tuple of
        names (to take a tuple result apart); returns ``vars_out``.  Without
        ``vars_out`` (TFP's style) the instruction is returned, to be bound
        by ``ab.var.x = ...`` or ``ab(pattern).pattern = ...``.  ``name``
        (keyword) describes the primop in printed programs.
        """
        vars_in, vars_out, name = _primop_arguments(args, kwargs)
        state = self._require("primop")
        if vars_in is None:
            vars_in = tuple(state.locals.get(v, v) for v in
                            _input_names(f, f"function {state.name!r}"))
        op = PrimOp(tuple(vars_in) if not isinstance(vars_in, str) else (vars_in,),
                    _str_pattern(vars_out) if vars_out is not None else (), f,
                    name=name)
        self._emit(op)
        return op if vars_out is None else vars_out

    primop.__tfp_signature__ = inspect.signature(
        lambda f, vars_in=None, vars_out=None: None)

    def const(self, value: Any, vars_out: Optional[Pattern] = None) -> Any:
        """Emit ``vars_out = value`` (a constant; scalars are broadcast to every
        thread).  Without ``vars_out``, returns the instruction (TFP's style)."""
        return self.primop(lambda: value, vars_out, vars_in=(), name=repr(value))

    def call(self, function: Union[str, FunctionHandle], vars_in: Sequence[str],
             vars_out: Optional[Pattern] = None) -> Any:
        """Emit ``vars_out = function(*vars_in)``; ``function`` is a name or
        handle.  Without ``vars_out``, returns the instruction (TFP's style)."""
        self._require("call")
        name = function.name if isinstance(function, FunctionHandle) else function
        vars_in = (vars_in,) if isinstance(vars_in, str) else tuple(str(v) for v in vars_in)
        op = FunctionCallOp(name, vars_in, _str_pattern(vars_out) if vars_out is not None
                            else ())
        self._emit(op)
        return op if vars_out is None else vars_out

    # -- TFP's variables ------------------------------------------------------------
    @property
    def var(self) -> "_MagicVars":
        """TFP's variable scope: ``ab.var.x = op`` binds ``op``'s output to the
        variable ``x`` (made on first use), ``ab.var.x`` is its name."""
        return self._magic_vars

    def __call__(self, pattern: Pattern) -> "_MagicPattern":
        """TFP's pattern assignment: ``ab((a, b)).pattern = op`` binds ``op``'s
        output to the pattern ``(a, b)``."""
        return _MagicPattern(self, pattern)

    def local(self, name: Optional[str] = None, define: bool = True) -> str:
        """A fresh variable of the function being built (``name_k``, or
        ``var_k``); the first one made for ``name`` is what ``ab.var.<name>``
        and a lambda parameter ``name`` refer to.  ``define`` is accepted for
        TFP's signature (reads before writes are caught when the program is
        checked)."""
        state = self._require("local")
        self._varcount += 1
        var = f"{name if name is not None else 'var'}_{self._varcount}"
        if name is not None and name not in state.locals:
            state.locals[name] = var
        return var

    def locals_(self, count: int, name: Optional[str] = None) -> List[str]:
        """``count`` fresh variables (see :meth:`local`)."""
        return [self.local(name) for _ in range(count)]

    def param(self, name: Optional[str] = None) -> str:
        """A fresh variable (see :meth:`local`) that is also the next
        parameter of the function being built."""
        state = self._require("param")
        var = self.local(name)
        state.params = state.params + (var,)
        return var

    def _bind_last(self, op: Any, pattern: Pattern) -> None:
        """Give the instruction ``op`` (the last emitted) the outputs ``pattern``."""
        state = self._require("var")
        if op is None:
            return
        if not hasattr(op, "vars_out") or op.vars_out not in ((), [], None):
            raise ProgramError(f"function {state.name!r}: outputs should be given either "
                               f"as vars_out or through ab.var / ab(pattern), not both "
                               f"({op})")
        block = state.current
        if block is None or not block.instructions or block.instructions[-1] is not op:
            raise ProgramError(f"function {state.name!r}: bind an instruction's outputs "
                               f"right after emitting it ({op})")
        op.vars_out = _str_pattern(pattern)

    # -- control flow ---------------------------------------------------------------
    def return_(self, vars_out: Pattern) -> None:
        """Return the value of ``vars_out`` (a name or nested tuple of names;
        TFP's argument name)."""
        self._require("return_")
        self._terminate(ReturnOp(vars_out))

    @contextlib.contextmanager
    def if_(self, condition: str, then_name: Optional[str] = None,
            else_name: Optional[str] = None,
            continue_name: Optional[str] = None) -> Iterator[None]:
        """Run the body where variable ``condition`` is true; may be followed
        by :meth:`else_`.  The block names TFP takes are accepted and not
        used (blocks are named ``ifK.then`` ...)."""
        cond = condition
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
    def else_(self, else_name: Optional[str] = None,
              continue_name: Optional[str] = None) -> Iterator[None]:
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


def _str_pattern(pattern: Any) -> Any:
    """A pattern of variable names, lists taken as tuples (TFP writes lists)."""
    if isinstance(pattern, (tuple, list)):
        return tuple(_str_pattern(p) for p in pattern)
    return str(pattern)


class _MagicVars:
    """``ab.var``: attribute writes bind outputs, reads give variable names."""

    def __init__(self, builder: ProgramBuilder) -> None:
        object.__setattr__(self, "_builder", builder)

    def __setattr__(self, name: str, op: Any) -> None:
        builder = self._builder
        state = builder._require("var")
        var = state.locals.get(name) or builder.local(name)
        builder._bind_last(op, var)

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        builder = self._builder
        state = builder._require("var")
        return state.locals.get(name) or builder.local(name, define=False)


class _MagicPattern:
    """``ab(pattern)``: ``.pattern = op`` binds ``op``'s outputs to ``pattern``."""

    def __init__(self, builder: ProgramBuilder, pattern: Pattern) -> None:
        self._builder = builder
        self._pattern = pattern

    @property
    def pattern(self) -> Pattern:
        return self._pattern

    @pattern.setter
    def pattern(self, op: Any) -> None:
        self._builder._bind_last(op, self._pattern)
