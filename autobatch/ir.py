"""The instruction language of autobatch (the IR its passes and executors share).

Users (and TFP code) import it as :mod:`autobatch.instructions`, which adds
TFP's one-example :func:`~autobatch.instructions.interpret`; the passes
import this module, below the interpreters, so that nothing imports in a
circle.

A :class:`Program` is a set of :class:`Function` s, one of them the entry
point (``main``).  A function has parameters (variable names) and a list of
:class:`Block` s; the first block is its entry.  A block is straight-line
code (a list of instructions) ended by one terminator.  Every variable is
local to its function: two functions may use the same name for different
variables.

Values and patterns
-------------------
A *value* is one array or a nested tuple of values (a tuple-typed variable
holds a tuple).  A *pattern* of variable names (a ``str`` or a nested tuple
of patterns) says where the parts of a value go: ``vars_out='t'`` stores the
whole value in ``t``; ``vars_out=('a', ('b', 'c'))`` takes a value
``(x, (y, z))`` apart.  Patterns are used by :class:`PrimOp` outputs,
:class:`FunctionCallOp` outputs and :class:`ReturnOp`.

Semantics (one example; :mod:`autobatch.reference` is the executable
definition, and the batched executors must agree with it thread by thread)
---------------------------------------------------------------------------
- :class:`PrimOp` ``vars_out = function(*vars_in)``.  ``function`` works on
  batched arrays: each input has a leading batch dimension and each output
  must have the same leading dimension, or be a scalar (broadcast to every
  thread).  It must act on each batch member independently.
- :class:`FunctionCallOp` calls another function (or itself) with the values
  of ``vars_in`` as arguments and binds the returned value to ``vars_out``.
- :class:`GotoOp` jumps; :class:`BranchOp` jumps to ``true_block`` where its
  condition (a boolean scalar per thread) holds and to ``false_block``
  elsewhere; :class:`ReturnOp` returns the value of its pattern.

Lowered programs (:mod:`autobatch.lowering`) replace calls by explicit stack
operations: :class:`PushOp` saves variables in the current stack frame,
:class:`PopOp` restores them, :class:`CopyOp` copies values between
variables, :class:`PushGotoOp` saves a return address and jumps,
:class:`IndirectGotoOp` jumps to the saved return address.

Types and allocations
---------------------
:class:`TensorType` is a dtype and a shape *without* the batch dimension;
:class:`Type` is a pattern of them.  :class:`VariableAllocation` says how the
batched executor stores a variable (NULL < TEMPORARY < REGISTER < FULL);
:mod:`autobatch.allocation_strategy` chooses it.
"""
from __future__ import annotations

import copy
import enum
import numbers
import textwrap
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from memopt.liveness import FlowNode, Liveness, analyze

from autobatch.errors import ProgramError

__all__ = [
    "Pattern",
    "pattern_leaves",
    "pattern_map",
    "pattern_flatten",
    "pattern_traverse",
    "pattern_zip",
    "pattern_map2",
    "is_namedtuple",
    "rebuild",
    "tuple_expr",
    "pattern_unflatten",
    "bind_pattern",
    "as_pattern",
    "TensorType",
    "Type",
    "VariableAllocation",
    "PrimOp",
    "prim_op",
    "single_type",
    "BroadcastOutputs",
    "broadcast_op",
    "push_op",
    "pop_op",
    "FunctionCallOp",
    "PushOp",
    "PopOp",
    "CopyOp",
    "GotoOp",
    "BranchOp",
    "ReturnOp",
    "PushGotoOp",
    "IndirectGotoOp",
    "Block",
    "Function",
    "Program",
    "ControlFlowGraph",
    "halt_op",
    "halt",
    "pc_var",
    "Module",
    "PC_VAR",
    "HandLowered",
    "format_pattern",
    "tfp_program_text",
    "tfp_op_text",
    "numpy_type_of",
    "describe_function",
    "Instruction",
    "broadcast_leaf",
    "Terminator",
    "is_hand_lowered",
    "is_return_op",
    "extract_referenced_variables",
    "FunctionFlow",
    "function_flow",
    "call_graph",
    "drop_repushes",
    "reachable",
    "check_defined",
]

#: A variable name or a nested tuple of them.
Pattern = Union[str, Tuple[Any, ...]]


# -- patterns ------------------------------------------------------------------

def pattern_leaves(pattern: Any) -> List[Any]:
    """The leaves of a pattern (anything but a tuple is a leaf), in order."""
    if isinstance(pattern, tuple):
        out: List[Any] = []
        for part in pattern:
            out.extend(pattern_leaves(part))
        return out
    return [pattern]


def is_namedtuple(value: Any) -> bool:
    """Whether ``value`` is a namedtuple (a tuple with ``_fields``)."""
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def rebuild(like: Any, parts: Iterator[Any]) -> Tuple[Any, ...]:
    """A tuple of ``parts`` of the kind of ``like``: the same namedtuple class
    where ``like`` is a namedtuple (namedtuples are values as in TFP: their
    class travels in patterns and types), else a plain tuple."""
    if is_namedtuple(like):
        return type(like)(*parts)
    return tuple(parts)


def tuple_expr(pattern: Any, inner: Sequence[str], constant: Callable[[Any], str]) -> str:
    """Python source building ``pattern``'s kind of tuple from the source
    texts ``inner``: ``(a, b)``, or ``<class>(a, b)`` for a namedtuple, the
    class named by ``constant(cls)`` (generated code)."""
    joined = ", ".join(inner)
    if is_namedtuple(pattern):
        return f"{constant(type(pattern))}({joined})"
    return f"({joined},)" if len(inner) == 1 else f"({joined})"


def pattern_map(f: Callable[[Any], Any], pattern: Any, leaf_type: Any = ()) -> Any:
    """``pattern`` with every leaf replaced by ``f(leaf)``.  Tuples and lists
    are structure, as in TFP (a tuple stays a tuple of its kind, namedtuples
    keeping their class; a list a list), except instances of ``leaf_type``
    (TFP's argument: a class or tuple of classes that are leaves)."""
    if isinstance(pattern, tuple) and not (leaf_type and isinstance(pattern, leaf_type)):
        return rebuild(pattern, (pattern_map(f, part, leaf_type) for part in pattern))
    if isinstance(pattern, list) and not (leaf_type and isinstance(pattern, leaf_type)):
        return [pattern_map(f, part, leaf_type) for part in pattern]
    return f(pattern)


def _is_structure(value: Any, leaf_type: Any) -> bool:
    """Lists and tuples are structure in TFP's pattern functions, except
    instances of ``leaf_type``."""
    return isinstance(value, (list, tuple)) and not (leaf_type and isinstance(value, leaf_type))


def pattern_flatten(pattern: Any, leaf_type: Any = ()) -> List[Any]:
    """TFP's: the leaves of ``pattern`` in order (lists and tuples are
    structure, instances of ``leaf_type`` leaves)."""
    return list(pattern_traverse(pattern, leaf_type))


def pattern_traverse(pattern: Any, leaf_type: Any = ()) -> Iterator[Any]:
    """TFP's: the leaves of ``pattern`` one by one (lists and tuples are
    structure, instances of ``leaf_type`` leaves)."""
    if _is_structure(pattern, leaf_type):
        for part in pattern:
            yield from pattern_traverse(part, leaf_type)
    else:
        yield pattern


def pattern_zip(pattern1: Any, pattern2: Any, leaf_type: Any = ()) -> List[Tuple[Any, Any]]:
    """TFP's: pairs of corresponding leaves of two patterns of one structure
    (lists and tuples are structure, instances of ``leaf_type`` leaves);
    where ``pattern1`` has a leaf, it is paired with the whole of
    ``pattern2`` there.  ValueError where ``pattern1`` has structure
    ``pattern2`` lacks."""
    if _is_structure(pattern1, leaf_type):
        if not _is_structure(pattern2, leaf_type) or len(pattern1) != len(pattern2):
            raise ValueError(f"patterns of different structure: {pattern1!r} and {pattern2!r}")
        return [pair for a, b in zip(pattern1, pattern2)
                for pair in pattern_zip(a, b, leaf_type)]
    return [(pattern1, pattern2)]


def pattern_map2(f: Callable[[Any, Any], Any], pattern1: Any, pattern2: Any,
                 leaf_type: Any = ()) -> Any:
    """TFP's: ``pattern1``'s structure with each leaf ``a`` replaced by
    ``f(a, b)``, ``b`` the part of ``pattern2`` there (lists and tuples are
    structure, instances of ``leaf_type`` leaves).  ValueError where
    ``pattern1`` has structure ``pattern2`` lacks."""
    if _is_structure(pattern1, leaf_type):
        if not _is_structure(pattern2, leaf_type) or len(pattern1) != len(pattern2):
            raise ValueError(f"patterns of different structure: {pattern1!r} and {pattern2!r}")
        parts = (pattern_map2(f, a, b, leaf_type) for a, b in zip(pattern1, pattern2))
        return list(parts) if isinstance(pattern1, list) else rebuild(pattern1, parts)
    return f(pattern1, pattern2)


def pattern_unflatten(pattern: Any, leaves: Sequence[Any]) -> Any:
    """Inverse of :func:`pattern_leaves`: ``leaves`` put into ``pattern``'s shape."""
    it = iter(leaves)
    out = pattern_map(lambda _: next(it), pattern)
    return out


def bind_pattern(pattern: Any, value: Any, where: str = "",
                 op: Any = None) -> Iterator[Tuple[str, Any]]:
    """``(name, part)`` for each variable of ``pattern`` bound to ``value``.

    A ``str`` pattern takes the whole value; a tuple pattern takes apart a
    tuple or list value of the same length.  Raises :class:`ProgramError`
    (naming ``where`` and the instruction ``op``, printed only then) when the
    value does not have the pattern's structure.
    """
    if isinstance(pattern, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(pattern):
            got = (f"a {len(value)}-tuple" if isinstance(value, (tuple, list))
                   else type(value).__name__)
            if op is not None:
                where = f"{where}: {op}"
            raise ProgramError(f"{where}: cannot unpack {got} into the pattern "
                               f"{format_pattern(pattern)}; return a {len(pattern)}-tuple "
                               f"or bind the value to one variable")
        for part, sub in zip(pattern, value):
            yield from bind_pattern(part, sub, where, op)
    else:
        yield pattern, value


def as_pattern(value: Any) -> Any:
    """``value`` with every list turned into a tuple (so that patterns treat
    user values given as lists as structure)."""
    if isinstance(value, tuple):
        return rebuild(value, (as_pattern(v) for v in value))
    if isinstance(value, list):
        return tuple(as_pattern(v) for v in value)
    return value


def format_pattern(pattern: Any) -> str:
    """``a`` or ``(a, (b, c))``."""
    if isinstance(pattern, tuple):
        return tuple_expr(pattern, [format_pattern(p) for p in pattern],
                          lambda cls: cls.__name__)
    return str(pattern)


# -- types ---------------------------------------------------------------------

def _layout(text: str, indent: int = 0, width: int = 80) -> str:
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


def _label(target: Any) -> str:
    """How a jump target prints: a block's name (TFP-style targets are
    Block objects), ``halt`` for TFP's halt (None)."""
    if target is None:
        return "halt"
    name = getattr(target, "name", target)
    return str(name)


class _Printed:
    """TFP's printing entry point for instructions and terminators:
    ``__str__(indent=0, width=80)``; the text is :meth:`_text`'s."""

    def _text(self) -> str:
        raise NotImplementedError

    def __str__(self, indent: int = 0, width: int = 80) -> str:
        return _layout(self._text(), indent, width)


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


def _as_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        numpy_dtype = getattr(dtype, "as_numpy_dtype", None)  # tf.DType
        if numpy_dtype is None:
            raise
        return np.dtype(numpy_dtype)


@dataclass(frozen=True)
class TensorType:
    """A dtype and a shape of one thread's value (no batch dimension).

    ``weak`` marks the type of a Python scalar constant (``1``, ``0.5``,
    ``True``): where a variable is also written with a value of a real dtype,
    the constant takes that dtype (as NumPy 2 does with Python scalars).
    Variables' final types are never weak.
    """

    dtype: np.dtype
    shape: Tuple[int, ...] = ()
    weak: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def strong(self) -> "TensorType":
        """The same type, not weak."""
        return replace(self, weak=False) if self.weak else self

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{'~' if self.weak else ''}{self.dtype.name}[{dims}]"


def numpy_type_of(value: Any, batch_size: int) -> TensorType:
    """The per-thread type of a NumPy value a primop returned for
    ``batch_size`` threads.

    A constant (no batch dimension: a Python scalar, a NumPy scalar, a 0-d
    array) has a *weak* type: where its variable is also written with, or
    declared as, another dtype of a compatible kind, the constant takes that
    dtype (TFP types constants by the dtype their variable prefers).  An
    array's leading dimension must be ``batch_size`` (TypeError otherwise).
    """
    if isinstance(value, (bool, numbers.Number)) and not isinstance(value, np.generic):
        return TensorType(np.asarray(value).dtype, (), weak=True)
    array = np.asarray(value)
    if array.ndim == 0:
        return TensorType(array.dtype, (), weak=True)
    if array.shape[0] != batch_size:
        raise TypeError(f"a primop returned an array of shape {array.shape} for "
                        f"{batch_size} thread(s); outputs must have the batch "
                        f"dimension first, or be scalars")
    return TensorType(array.dtype, array.shape[1:])


@dataclass(frozen=True)
class Type:
    """The type of a variable: a :class:`TensorType` or a nested tuple of them."""

    tensors: Any

    def __post_init__(self) -> None:
        # TFP writes patterns with lists too: they are structure, as tuples.
        object.__setattr__(self, "tensors", as_pattern(self.tensors))
        for leaf in pattern_leaves(self.tensors):
            if not isinstance(leaf, TensorType) and leaf is not None:
                raise TypeError(f"Type leaves must be TensorType (or None: not known yet, "
                                f"as TFP's Type(None)), got {leaf!r}")

    def leaves(self) -> List[TensorType]:
        """The tensor types, in pattern order (one per stored array)."""
        return pattern_leaves(self.tensors)

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.tensors, tuple)

    def strong(self) -> "Type":
        return Type(pattern_map(TensorType.strong, self.tensors))

    def _key(self) -> Any:
        # A namedtuple equals a plain tuple of the same parts; their Types must
        # not be equal (a primop reads fields by name).
        def kinds(p: Any) -> Any:
            if isinstance(p, tuple):
                return (type(p) if is_namedtuple(p) else tuple, tuple(kinds(q) for q in p))
            return None
        return self.tensors, kinds(self.tensors)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Type) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return format_pattern(pattern_map(str, self.tensors))


def single_type(dtype: Any, shape: Sequence[int]) -> Type:
    """TFP's ``single_type``: the Type of one tensor."""
    return Type(TensorType(dtype, tuple(shape)))


class VariableAllocation(enum.IntEnum):
    """How the batched executor stores a variable; ordered, so ``max`` upgrades.

    NULL: holds nothing; writes are dropped and a read raises
        :class:`~autobatch.errors.NullVariableError` (nothing reads it).
    TEMPORARY: one value per thread that lives only inside one block run:
        never live across a block boundary, so it needs no storage.
    REGISTER: one value per thread, kept across blocks; not live across a
        call that may overwrite it.
    FULL: a register plus one slot per stack frame, per thread: live across a
        call to a function that may (transitively) write it.
    """

    NULL = 0
    TEMPORARY = 1
    REGISTER = 2
    FULL = 3

    @classmethod
    def _missing_(cls, value: Any) -> Optional["VariableAllocation"]:
        """TFP's ``VariableAllocation('full')``: a name (any case) gives the member."""
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        return None

    def __str__(self) -> str:
        return self.name


# -- instructions ----------------------------------------------------------------

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


# -- blocks, functions, programs ---------------------------------------------------

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


# -- TFP's printed text ---------------------------------------------------------------
# What TFP 0.25's ``str(program)`` prints for a program built TFP's way,
# written from the layout its docstrings describe: the variable declarations
# (``name :: allocation, Type(tensors=...)``, sorted), a blank line, each
# function (``def f(params):``, ``returns <pattern>``, its blocks) followed by
# a blank line, then the entry graph as the function ``main``.  Instructions
# print as ``out = prim(in) by`` plus the primitive's source lines,
# ``out = call(f, in)``, ``pop(a, b)``, ``branch(c, yes, no)``, ``goto(b)``,
# ``return`` (a halt), ``push_goto(r, b)``, ``indirect_jump``; a line too long
# for ``width`` breaks after its open paren, the rest wrapped two further in.

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
    """One instruction or terminator as TFP prints it (see above);
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


def tfp_program_text(program: "Program", indent: int = 0, width: int = 80) -> str:
    """``program`` (built TFP's way) as TFP 0.25's ``str(program)`` prints
    it (see above).  Blocks TFP would print as ``block-<hash>`` (unnamed)
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


# -- programs lowered by hand (TFP's per-variable stacks; their one-example
# meaning is autobatch.hand_lowered.interpret, their batched run autobatch.stack_vm)

#: TFP's ``instructions.pc_var``: the program counter's variable name.
PC_VAR = "__program_counter__"


def is_hand_lowered(blocks: List[Any]) -> bool:
    """Whether a graph's blocks use the lowered instructions (push-goto,
    indirect goto, pop), i.e. were lowered by hand."""
    for block in blocks:
        if isinstance(block.terminator, (PushGotoOp, IndirectGotoOp)):
            return True
        if any(isinstance(op, PopOp) for op in block.instructions):
            return True
    return False


@dataclass(eq=False)
class HandLowered:
    """One graph of a program lowered by hand (see the module doc).

    ``blocks`` are TFP-style :class:`~autobatch.instructions.Block` s, the
    first the entry; jump targets are Block objects, block names, or None
    (halt).  ``var_defs`` always holds :data:`PC_VAR` (int32 scalar), and
    ``var_alloc`` every variable of ``var_defs``.
    """

    blocks: List[Any]
    var_defs: Dict[str, Any]
    vars_in: List[str]
    vars_out: Any
    var_alloc: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vars_in = [str(v) for v in self.vars_in]
        self.vars_out = as_pattern(self.vars_out)
        for block in self.blocks:
            for op in block.instructions:
                if isinstance(op, FunctionCallOp):
                    raise ProgramError(
                        f"block {block.name!r} calls {getattr(op.function, 'name', op.function)!r}"
                        f" in a program lowered by hand (it has push-goto, indirect goto or "
                        f"pop instructions): lower that call by hand too, or write the "
                        f"program with FunctionCallOp only and let lowering make the stacks")
        self.var_defs = {k: (v if isinstance(v, Type) else Type(v))
                         for k, v in dict(self.var_defs or {}).items()}
        self.var_defs.setdefault(PC_VAR, single_type(np.int32, ()))
        alloc = dict(self.var_alloc or {})
        for name in self.var_defs:
            alloc.setdefault(name, VariableAllocation.FULL)
        self.var_alloc = {k: VariableAllocation(v) if not isinstance(v, str)
                          else VariableAllocation[v.upper()] for k, v in alloc.items()}

    def block_index(self, target: Any) -> int:
        """The index of a jump target (a Block, a block name; None: the
        halt index, ``len(blocks)``)."""
        if target is None:
            return len(self.blocks)
        for i, block in enumerate(self.blocks):
            if block is target or (isinstance(target, str) and block.name == target):
                return i
        name = getattr(target, "name", target)
        raise ProgramError(f"a jump targets block {name!r}, which is not in the program's "
                           f"graph; add it to the ControlFlowGraph")

    def variables(self) -> List[str]:
        """Every variable the graph reads or writes (without the pc)."""
        seen: Dict[str, None] = dict.fromkeys(self.vars_in)
        for block in self.blocks:
            for op in block.instructions:
                names = op.vars if isinstance(op, PopOp) else \
                    list(op.vars_in) + pattern_leaves(op.vars_out)
                seen.update(dict.fromkeys(pattern_leaves(tuple(names))))
            if isinstance(block.terminator, BranchOp):
                seen[block.terminator.cond] = None
        seen.update(dict.fromkeys(pattern_leaves(self.vars_out)))
        return list(seen)

    def check_types(self) -> None:
        """Raise ProgramError unless every variable has a full Type (the
        batched run allocates its storage from them)."""
        missing = [v for v in self.variables() if v not in self.var_defs
                   or any(leaf is None for leaf in self.var_defs[v].leaves())]
        if missing:
            raise ProgramError(
                f"variable(s) {missing} of a program lowered by hand have no Type in "
                f"var_defs; give each one (instructions.single_type(dtype, shape)): the "
                f"batched run allocates every variable's stack before it starts")


def _as_allocation(value: Any) -> "VariableAllocation":
    """A VariableAllocation from itself, its value or its name."""
    if isinstance(value, str):
        return VariableAllocation[value.upper()]
    return VariableAllocation(value)


#: TFP's ``pc_var``: the name of the program counter's variable.  Programs
#: built TFP's way list it in ``var_defs`` (int32); in a program lowered by
#: hand it is the stack ``PushGotoOp`` pushes return blocks on.  No
#: instruction may read or write it.
pc_var = PC_VAR


# -- flow facts the passes share -----------------------------------------------------
# Here, beside the IR, so that every pass (type_inference, allocation_strategy,
# lowering) imports only this module (and memopt.liveness), never another pass.

@dataclass
class FunctionFlow:
    """One function as a flow graph for :func:`memopt.liveness.analyze`.

    ``positions[i]`` is ``(block name, k)`` for node ``i``: the ``k``-th
    instruction of that block, or its terminator where ``k`` equals the
    number of instructions.  ``block_start[name]`` is the block's first node.
    """

    function: Function
    nodes: List[FlowNode]
    positions: List[Tuple[str, int]]
    block_start: Dict[str, int]
    liveness: Liveness

    def node(self, block: str, k: int) -> int:
        """The node index of the ``k``-th instruction (or terminator) of ``block``."""
        return self.block_start[block] + k


def function_flow(fn: Function) -> FunctionFlow:
    """Build ``fn``'s flow graph and its liveness.

    A call is one node that reads its arguments and writes its results; a
    ``return`` reads what it returns and has no successor.
    """
    block_start: Dict[str, int] = {}
    positions: List[Tuple[str, int]] = []
    for block in fn.blocks:
        block_start[block.name] = len(positions)
        positions.extend((block.name, k) for k in range(len(block.instructions) + 1))
    nodes: List[FlowNode] = []
    for block in fn.blocks:
        for k, op in enumerate(block.instructions):
            nodes.append(FlowNode(op.reads, op.writes, (block_start[block.name] + k + 1,)))
        term = block.terminator
        if term is None:
            raise ProgramError(f"function {fn.name!r}, block {block.name!r} has no terminator")
        succ = tuple(dict.fromkeys(block_start[t] for t in term.targets))
        nodes.append(FlowNode(term.reads, (), succ))
    liveness = analyze(nodes, live_at_exit=(), entry=0)
    return FunctionFlow(fn, nodes, positions, block_start, liveness)


def drop_repushes(block: Block) -> None:
    """Remove from each ``push`` of a lowered ``block`` the variables popped
    earlier in the block and not written since: their frame slot still holds
    the value (TFP's pop+push fusion; see :mod:`autobatch.stack_optimization`)."""
    intact: Set[str] = set()
    kept = []
    for op in block.instructions:
        if isinstance(op, PushOp):
            rest = tuple(v for v in op.vars if v not in intact)
            if rest:
                kept.append(PushOp(rest))
            continue
        if isinstance(op, PopOp):
            intact.update(op.vars)
        else:
            intact.difference_update(op.writes)
        kept.append(op)
    block.instructions = kept


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


def check_defined(flow: FunctionFlow) -> None:
    """Raise ProgramError for a variable that may be read before it is written.

    Such a variable is live on entry to the function without being a
    parameter.
    """
    fn = flow.function
    if not flow.nodes:
        return
    undefined = sorted(set(flow.liveness.live_in(0)) - set(fn.params))
    if undefined:
        var = undefined[0]
        readers = [f"{b}" for i, (b, k) in enumerate(flow.positions)
                   if var in flow.nodes[i].reads]
        raise ProgramError(
            f"function {fn.name!r}: variable {var!r} may be read before it is "
            f"written (read in block(s) {sorted(set(readers))}); assign it on every "
            f"path first" + (f" (also undefined: {undefined[1:]})" if len(undefined) > 1
                             else ""))
