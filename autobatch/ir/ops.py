"""Instructions and terminators: what a block does and where it goes next.

Semantics for one example (:mod:`autobatch.reference` is the executable
definition; the batched executors agree with it thread by thread):

- :class:`PrimOp` ``vars_out = function(*vars_in)``.  ``function`` works on
  batched arrays: each input has a leading batch dimension and each output
  must have the same leading dimension, or be a scalar (broadcast to every
  thread).  It must act on each batch member independently.
- :class:`FunctionCallOp` calls another function (or itself) with the values
  of ``vars_in`` as arguments and binds the returned value to ``vars_out``.
- :class:`GotoOp` jumps; :class:`BranchOp` jumps to ``true_target`` where its
  condition (a boolean scalar per thread) holds and to ``false_target``
  elsewhere; :class:`ReturnOp` returns the value of its pattern.

Lowered programs (:mod:`autobatch.lowering`) replace calls by explicit stack
operations: :class:`PushOp` saves variables in the current stack frame,
:class:`PopOp` restores them, :class:`CopyOp` copies values between
variables, :class:`PushGotoOp` saves a return address and jumps,
:class:`IndirectGotoOp` jumps to the saved return address.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

from autobatch.ir.patterns import (
    Pattern,
    as_pattern,
    format_pattern,
    pattern_leaves,
    pattern_unflatten,
)
from autobatch.ir.text import Printed as _Printed
from autobatch.ir.text import label as _label
from autobatch.ir.text import tfp_field_names
from autobatch.ir.types import _as_dtype

_DESCRIPTIONS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def describe_function(function: Callable) -> str:
    """A short text for a primop's function: a lambda's body when its source
    can be read (``n - 1``), else the function's name (cached)."""
    try:
        return _DESCRIPTIONS[function]
    except (KeyError, TypeError):
        pass
    text = _describe(function)
    try:
        _DESCRIPTIONS[function] = text
    except TypeError:  # not weakly referenceable
        pass
    return text


def _describe(function: Callable) -> str:
    name = getattr(function, "__name__", None) or type(function).__name__
    if name != "<lambda>":
        return name
    try:
        import ast
        import inspect
        import textwrap
        source = textwrap.dedent(inspect.getsource(function)).strip()
        code = function.__code__
        params = list(code.co_varnames[:code.co_argcount])
        found = []
        try:
            tree = ast.parse(source)
        except SyntaxError:  # the header of a compound statement: `with ...:`
            tree = ast.parse(source + "\n    pass")
        for node in ast.walk(tree):
            if isinstance(node, ast.Lambda) and [a.arg for a in node.args.args] == params:
                found.append(ast.unparse(node.body))
        if len(set(found)) == 1:
            return found[0]
    except Exception:  # no source (REPL, exec), or unparsable: fall back
        pass
    return name


def _names(vars_: Sequence[str]) -> Tuple[str, ...]:
    if isinstance(vars_, str):
        return (vars_,)
    return tuple(vars_)


class _Assignment(_Printed):
    """An instruction that reads ``vars_in`` and writes the pattern ``vars_out``."""

    vars_in: Any
    vars_out: Any

    @property
    def reads(self) -> Tuple[str, ...]:
        return tuple(pattern_leaves(self.vars_in))

    @property
    def writes(self) -> Tuple[str, ...]:
        return tuple(pattern_leaves(self.vars_out))


@dataclass(eq=False)
class PrimOp(_Assignment):
    """``vars_out = function(*vars_in)`` on the whole batch of threads.

    ``name`` is a short description for printing (``"n > 1"``); by default
    the lambda's source or the function's ``__name__``.
    """

    vars_in: Tuple[str, ...]
    vars_out: Pattern
    function: Callable[..., Any]
    #: TFP's: variables of ``vars_out`` written in place rather than pushed.
    #: Only programs lowered by hand (:mod:`autobatch.hand_lowered`) push on
    #: writes; elsewhere a write always replaces the value.  Fourth, as in
    #: TFP's ``PrimOp(vars_in, vars_out, function, skip_push_mask)``.
    skip_push_mask: frozenset = frozenset()
    name: Optional[str] = None

    def __post_init__(self) -> None:
        self.vars_in = _names(self.vars_in)
        self.vars_out = as_pattern(self.vars_out)
        if isinstance(self.skip_push_mask, str):
            raise TypeError(f"PrimOp's fourth argument is TFP's skip_push_mask (a set of "
                            f"variable names), got the string {self.skip_push_mask!r}; pass "
                            f"a primop's description as name=...")
        self.skip_push_mask = frozenset(self.skip_push_mask or ())

    def replace(self, vars_out: Pattern = None) -> "PrimOp":
        """TFP's: a copy writing ``vars_out`` (ValueError "Nothing to
        replace" without it, as TFP's)."""
        if vars_out is None:
            raise ValueError("Nothing to replace: pass vars_out")
        return replace(self, vars_out=as_pattern(vars_out))

    def _text(self) -> str:
        label = self.name or describe_function(self.function)
        return f"{format_pattern(self.vars_out)} = primop({', '.join(self.vars_in)}): {label}"


@dataclass(eq=False)
class FunctionCallOp(_Assignment):
    """``vars_out = function(*vars_in)`` where ``function`` names a Function."""

    function: str
    vars_in: Tuple[str, ...]
    vars_out: Pattern

    def __post_init__(self) -> None:
        self.vars_in = _names(self.vars_in)

    def replace(self, vars_out: Pattern = None) -> "FunctionCallOp":
        """TFP's: a copy writing ``vars_out`` (ValueError "Nothing to
        replace" without it, as TFP's)."""
        if vars_out is None:
            raise ValueError("Nothing to replace: pass vars_out")
        return replace(self, vars_out=as_pattern(vars_out))

    def _text(self) -> str:
        return (f"{format_pattern(self.vars_out)} = call {self.function}"
                f"({', '.join(self.vars_in)})")


@dataclass(eq=False)
class CopyOp(_Assignment):
    """``vars_out = vars_in``, both patterns (lowered programs).

    The value built from the ``vars_in`` pattern is bound to the ``vars_out``
    pattern, so one CopyOp copies several variables at once (all read before
    any is written), packs variables into a tuple-typed one, or unpacks one.
    """

    vars_in: Pattern
    vars_out: Pattern

    def _text(self) -> str:
        return f"{format_pattern(self.vars_out)} = copy {format_pattern(self.vars_in)}"


@dataclass(eq=False)
class _FrameOp(_Printed):
    vars: Tuple[str, ...]

    def __post_init__(self) -> None:
        self.vars = _names(self.vars)

    @property
    def reads(self) -> Tuple[str, ...]:
        return ()

    @property
    def writes(self) -> Tuple[str, ...]:
        return ()


@dataclass(eq=False)
class PushOp(_FrameOp):
    """Save ``vars`` in the current stack frame of each thread (lowered)."""

    @property
    def reads(self) -> Tuple[str, ...]:
        return self.vars

    def _text(self) -> str:
        return f"push {', '.join(self.vars)}"


@dataclass(eq=False)
class PopOp(_FrameOp):
    """Restore ``vars`` from the current stack frame of each thread (lowered)."""

    @property
    def writes(self) -> Tuple[str, ...]:
        return self.vars

    def _text(self) -> str:
        return f"pop {', '.join(self.vars)}"


Instruction = Union[PrimOp, FunctionCallOp, CopyOp, PushOp, PopOp]


# TFP's helper names (tfp.experimental.auto_batching.instructions).

def prim_op(vars_in: Sequence[str], vars_out: Pattern, function: Callable[..., Any],
            skip_push_mask: Any = None) -> PrimOp:
    """TFP's ``prim_op``: a :class:`PrimOp`.  ``skip_push_mask`` (variables
    written in place, not pushed) matters in programs lowered by hand
    (:mod:`autobatch.hand_lowered`); elsewhere the allocation strategy
    decides what is saved across calls from liveness."""
    return PrimOp(vars_in, vars_out, function, skip_push_mask=skip_push_mask or ())


def push_op(vars_in: Pattern, vars_out: Pattern) -> PrimOp:
    """TFP's ``push_op``: despite the name, an instruction that copies the
    values of ``vars_in`` into ``vars_out`` (a pattern of the same shape); in
    TFP's VM a write to a stacked variable pushes.  Here the copy is a
    :class:`PrimOp`, as in TFP; what is saved on a stack is the allocation
    strategy's choice (:class:`PushOp` is the lowered, explicit save)."""
    def assign(*values: Any) -> Any:
        return values if len(values) != 1 or isinstance(as_pattern(vars_out), tuple) \
            else values[0]
    # Printed as TFP's copy is written (``str(program)`` gives TFP's text).
    assign.__tfp_source__ = "def assign(*x):\n  return x"
    return PrimOp(_names(pattern_leaves(as_pattern(vars_in))), vars_out, assign, name="copy")


def pop_op(vars: Sequence[str]) -> "PopOp":
    """TFP's ``PopOp(vars)``, as a function: restore ``vars`` from the stack."""
    return PopOp(_names(pattern_leaves(as_pattern(vars))))


class BroadcastOutputs:
    """A primop function whose outputs are broadcast to their variables' shapes.

    Type inference gives a variable written with shapes that broadcast
    together (``()``, ``(1, 3, 1)``, ``(5, 3, 2)``) their broadcast shape, as
    TFP does; where one write has a smaller shape, the writing primop is
    wrapped in this so that the value stored (and any temporary) has the
    variable's shape.  ``have``/``want`` are patterns of :class:`TensorType`
    matching ``function``'s result.  Works on NumPy, TensorFlow and JAX arrays
    (indexing with ``None`` and a product with ones, which changes no value).
    """

    def __init__(self, function: Callable[..., Any], have: Any, want: Any) -> None:
        self.function = function
        self.have = have
        self.want = want
        self.__name__ = f"broadcast({describe_function(function)})"

    def __call__(self, *args: Any) -> Any:
        return _broadcast_pattern(self.function(*args), self.have, self.want)


def broadcast_leaf(value: Any, have: Tuple[int, ...], want: Tuple[int, ...]) -> Any:
    """``value`` (batch dimension first, per-thread shape ``have``) with each
    thread's part broadcast to ``want``.  A constant (no batch dimension) is
    left as it is: the executors broadcast constants to every thread."""
    if tuple(have) == tuple(want) or np.ndim(value) == 0:
        return value
    extra = len(want) - len(have)
    if extra > 0:
        value = value[(slice(None),) + (None,) * extra]
    dtype = _as_dtype(value.dtype)
    if dtype == np.bool_:
        return value | np.zeros((1,) + tuple(want), dtype)
    return value * np.ones((1,) + tuple(want), dtype)


def _broadcast_pattern(value: Any, have: Any, want: Any) -> Any:
    if isinstance(have, tuple):
        return tuple(_broadcast_pattern(v, h, w) for v, h, w in zip(value, have, want))
    return broadcast_leaf(value, have.shape, want.shape)


def broadcast_op(vars_in: Pattern, vars_out: Pattern, have: Any, want: Any) -> PrimOp:
    """``vars_out = vars_in`` with each part broadcast from ``have`` to ``want``
    (patterns of TensorType shaped like ``vars_in``)."""
    names = _names(pattern_leaves(as_pattern(vars_in)))
    pattern = as_pattern(vars_in)

    def pack(*values: Any) -> Any:
        return pattern_unflatten(pattern, values)
    return PrimOp(names, vars_out, BroadcastOutputs(pack, have, want), name="broadcast")

# -- terminators -----------------------------------------------------------------

class _Terminator(_Printed):
    """Defaults: reads nothing, jumps nowhere (the program or function ends)."""

    @property
    def reads(self) -> Tuple[str, ...]:
        return ()

    @property
    def targets(self) -> Tuple[str, ...]:
        return ()


@tfp_field_names(block="target")
@dataclass(eq=False)
class GotoOp(_Terminator):
    """Jump to ``target`` (a block name)."""

    target: str

    @property
    def targets(self) -> Tuple[str, ...]:
        return (self.target,)

    def _text(self) -> str:
        return f"goto {_label(self.target)}"


@tfp_field_names(cond_var="cond", true_block="true_target", false_block="false_target")
@dataclass(eq=False)
class BranchOp(_Terminator):
    """Jump to ``true_target`` where ``cond`` holds, else to ``false_target``."""

    cond: str
    true_target: str
    false_target: str

    @property
    def reads(self) -> Tuple[str, ...]:
        return (self.cond,)

    @property
    def targets(self) -> Tuple[str, ...]:
        return (self.true_target, self.false_target)

    def _text(self) -> str:
        return (f"branch {self.cond} ? {_label(self.true_target)} : "
                f"{_label(self.false_target)}")


@dataclass(eq=False)
class ReturnOp(_Terminator):
    """Return the value of ``vars`` (a pattern) to the caller."""

    vars: Pattern

    @property
    def reads(self) -> Tuple[str, ...]:
        return tuple(pattern_leaves(self.vars))

    def _text(self) -> str:
        return f"return {format_pattern(self.vars)}"


@tfp_field_names(push_block="return_target", goto_block="target")
@dataclass(eq=False)
class PushGotoOp(_Terminator):
    """Save ``return_target`` as the return address, then jump to ``target``
    (lowered programs: a call)."""

    return_target: str
    target: str

    @property
    def targets(self) -> Tuple[str, ...]:
        return (self.target,)

    def _text(self) -> str:
        return f"push-goto {_label(self.return_target)}, {_label(self.target)}"


@dataclass(eq=False)
class IndirectGotoOp(_Terminator):
    """Jump to the return address saved by the matching :class:`PushGotoOp`
    (lowered programs: a return; with no saved address the thread halts)."""

    def _text(self) -> str:
        return "indirect-goto"


Terminator = Union[GotoOp, BranchOp, ReturnOp, PushGotoOp, IndirectGotoOp]


#: TFP's ``instructions.pc_var``: the program counter's variable name.
PC_VAR = "__program_counter__"
#: TFP's ``pc_var``: the name of the program counter's variable.  Programs
#: built TFP's way list it in ``var_defs`` (int32); in a program lowered by
#: hand it is the stack ``PushGotoOp`` pushes return blocks on.  No
#: instruction may read or write it.
pc_var = PC_VAR


def halt_op() -> GotoOp:
    """TFP's ``halt_op``: the end of a function built TFP's way (it returns
    the function's ``vars_out``)."""
    return GotoOp(None)


def halt() -> None:
    """TFP's ``halt``: None, the block a jump to which ends the graph (the
    return address of main's ``PushGotoOp(halt(), entry)``)."""
    return None


def is_return_op(op: Any) -> bool:
    """TFP's ``is_return_op``: whether ``op`` leaves the graph (a halt,
    ``GotoOp(None)``; an ``IndirectGotoOp``; autobatch's ``ReturnOp``)."""
    return (isinstance(op, GotoOp) and op.target is None) or isinstance(
        op, (IndirectGotoOp, ReturnOp))
