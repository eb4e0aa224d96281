"""Infer the type of every variable: :func:`infer_types`.

Given the types of ``main``'s arguments, every primop is run once on
placeholder inputs made by the backend (its own values: NumPy arrays, or
TensorFlow tensors, graph tensors inside a graph, filled with its
``placeholder_fill``) to learn the type of its outputs.  Backends with
``inference_sees_a_batch`` (TensorFlow) give the placeholders TFP's batch
size, one larger than any per-thread dimension (:func:`inference_batch`), so
that a primop mixing up the batch and a per-thread dimension is caught; the
others (NumPy, JAX) give one thread, which is as sound for primops that act
on each thread independently and cheaper for large ones;
argument types flow into callees, return types flow back to call sites.
This is iterated to a fixed point, so a recursive function gets its return
type from its base case (``return 1``) and then types the recursive path.
A function's ``type_inference`` callable, where given, supplies its return
type directly (needed only where no path returns without recursing).

Weak types: a Python scalar constant (``1``, ``0.5``, ``True``) has a *weak*
type that takes the dtype of the other values written to the same variable
(``x = 0`` then ``x = x + n`` with ``n`` int32 makes ``x`` int32), and
primops meet weak values as Python scalars, as NumPy 2 does (``n - 1`` with
``n`` int32 is int32).  A variable only ever given weak values gets NumPy's
default dtype for the kind (int64, float64, bool): ``fib`` built from ``1``
returns int64 whatever the type of ``n``.  Two different real dtypes for one
variable are an error, as are different shapes or tuple structures.

At run time every stored value has its variable's final dtype; a weak value
kept only inside one block stays a Python scalar there, so an intermediate
result may be computed in a wider dtype than inferred before it is stored.

Branch conditions must be boolean scalars per thread.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from autobatch.errors import ProgramError, TypeInferenceError
from autobatch.ir import (
    Block, BroadcastOutputs, broadcast_op, BranchOp, CopyOp, FunctionCallOp, Function, PrimOp,
    Program, ReturnOp, TensorType,
    Type, as_pattern, bind_pattern, call_graph, check_defined, function_flow, pattern_map,
    is_namedtuple, numpy_type_of, pattern_leaves, pattern_unflatten, reachable, rebuild,
)

__all__ = ["infer_types", "merge_types", "as_type", "type_of_value", "is_inferring",
           "signature", "infer_types_from_signature", "type_of_pattern"]

log = logging.getLogger(__name__)

_KIND_ORDER = "biufc"  # bool < int < uint < float < complex, for weak values


def _merge_leaf(a: TensorType, b: TensorType, what: str,
                merge_dtypes: Optional[Callable[[Any, Any], Any]] = None) -> TensorType:
    if a.shape != b.shape:
        # As TFP: shapes that broadcast together give the broadcast shape (the
        # variable's storage has it; smaller values are broadcast when written).
        try:
            shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise TypeInferenceError(f"{what} has shape {a.shape} in one place and "
                                     f"{b.shape} in another, which do not broadcast "
                                     f"together; reshape so that they agree") from None
        a, b = replace(a, shape=shape), replace(b, shape=shape)
    if a == b:
        return a
    if a.weak and b.weak:
        kind = max(a.dtype.kind, b.dtype.kind, key=_KIND_ORDER.index)
        dtype = a.dtype if a.dtype.kind == kind else b.dtype
        return TensorType(dtype, a.shape, weak=True)
    if a.weak or b.weak:
        weak, strong = (a, b) if a.weak else (b, a)
        fits = {"b": "biufc", "i": "iufc", "u": "iufc", "f": "fc", "c": "c"}
        if strong.dtype.kind in fits.get(weak.dtype.kind, ""):
            return strong
        raise TypeInferenceError(f"{what} is a Python {weak.dtype.kind!r}-kind constant in "
                                 f"one place and {strong.dtype.name} in another; write the "
                                 f"constant with a matching type")
    if merge_dtypes is not None and a.shape == b.shape:
        # As TFP: the backend's merge_dtypes decides (NumPy promotes: int32
        # and int64 give int64; TensorFlow raises ValueError, reported below).
        try:
            return TensorType(np.dtype(merge_dtypes(a.dtype, b.dtype)), a.shape)
        except ValueError:
            pass
    raise TypeInferenceError(f"{what} is {a.dtype.name} in one place and {b.dtype.name} "
                             f"in another; cast one of them so that they agree")


def merge_types(a: Optional[Type], b: Optional[Type], what: str,
                merge_dtypes: Optional[Callable[[Any, Any], Any]] = None) -> Optional[Type]:
    """The type that covers ``a`` and ``b`` (None: unknown yet); raises
    TypeInferenceError naming ``what`` where they disagree.  Two different
    dtypes merge by ``merge_dtypes`` (a backend's: NumPy promotes) where
    given, else (or where it raises ValueError) disagree."""
    if a is None:
        return b
    if b is None:
        return a

    def merge(x: Any, y: Any) -> Any:
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not (isinstance(x, tuple) and isinstance(y, tuple)) or len(x) != len(y):
                raise TypeInferenceError(f"{what} is {Type(x)} in one place and {Type(y)} "
                                         f"in another (different tuple structure)")
            if is_namedtuple(x) and is_namedtuple(y) and type(x) is not type(y):
                raise TypeInferenceError(f"{what} is a {type(x).__name__} in one place and "
                                         f"a {type(y).__name__} in another")
            return rebuild(x if is_namedtuple(x) else y, (merge(p, q) for p, q in zip(x, y)))
        return _merge_leaf(x, y, what, merge_dtypes)

    return Type(merge(a.tensors, b.tensors))


def as_type(value: Any) -> Type:
    """A Type from a Type, a TensorType, a pattern of them, or a one-element
    list (the ``[type]`` convention of TFP's ``type_inference`` callables; a
    longer list is a tuple)."""
    if isinstance(value, Type):
        return value
    if isinstance(value, list):
        if len(value) == 1:
            return as_type(value[0])
        return Type(tuple(as_type(v).tensors for v in value))
    if isinstance(value, tuple):
        return Type(rebuild(value, (as_type(v).tensors for v in value)))
    if isinstance(value, TensorType):
        return Type(value)
    raise TypeError(f"expected a Type, TensorType or list of them, got {value!r}")


def type_of_value(value: Any, backend: Any, batch_size: int) -> Type:
    """The Type of a (possibly tuple) value for ``batch_size`` threads."""
    def leaf(v: Any) -> TensorType:
        return backend.type_of(v, batch_size)
    return Type(pattern_map(leaf, as_pattern(value)))


def inference_batch(types: Sequence[Type]) -> int:
    """TFP's batch size for running a primop on placeholders: one more than
    every dimension of its inputs' types (at least 2), so that no per-thread
    dimension can pass for the batch one (a primop that reduces or
    broadcasts across the batch by mistake then fails, or shows in its
    output's type, instead of passing on one thread)."""
    dims = [d for t in types for leaf in t.leaves() for d in leaf.shape]
    return max([2] + [d + 1 for d in dims])


_INFERRING = threading.local()


def is_inferring() -> bool:
    """TFP's ``type_inference.is_inferring``: True while type inference runs
    a primitive's function on placeholders (so that a primitive can tell
    inference from a run: see also
    :func:`autobatch.virtual_machine.is_staging` and
    :func:`autobatch.stackless.is_running`), False elsewhere.  Per thread."""
    return getattr(_INFERRING, "depth", 0) > 0


@contextlib.contextmanager
def _inferring() -> Any:
    _INFERRING.depth = getattr(_INFERRING, "depth", 0) + 1
    try:
        yield
    finally:
        _INFERRING.depth -= 1


class _NumpyPlaceholders:
    """What type inference needs of a backend, on NumPy (the default; the
    passes import no backend)."""

    @staticmethod
    def placeholder(tensor_type: TensorType, batch_size: int) -> np.ndarray:
        return np.zeros((batch_size,) + tensor_type.shape, dtype=tensor_type.dtype)

    @staticmethod
    def type_of(value: Any, batch_size: int) -> TensorType:
        return numpy_type_of(value, batch_size)

    @staticmethod
    def run_on_dummies(function: Any, inputs: Sequence[Any]) -> Any:
        return function(*inputs)


class _Inference:
    def __init__(self, program: Program, backend: Any) -> None:
        self.program = program
        self.backend = backend
        #: How two different dtypes of one variable merge (TFP's backend
        #: ``merge_dtypes``: NumPy promotes, TensorFlow refuses).
        self.merge_dtypes = getattr(backend, "merge_dtypes", None)
        self.params: Dict[str, List[Optional[Type]]] = {}
        self.vars: Dict[str, Dict[str, Type]] = {fn.name: {} for fn in program.functions}
        self.ret: Dict[str, Optional[Type]] = {fn.name: None for fn in program.functions}
        self.primop_cache: Dict[Tuple[int, Tuple[Type, ...]], Type] = {}
        self.changed = False
        #: Whether a constants-only variable takes the dtype of what a primop
        #: combines it with (backends that do not mix dtypes: TensorFlow).
        self.unify_weak = not getattr(backend, "mixes_dtypes", True)
        #: Whether primops run on placeholders of a batch that cannot be
        #: mistaken for a per-thread dimension (TFP's way; see
        #: :func:`inference_batch`), or on one thread (autobatch's own).
        self.whole_batch = bool(getattr(backend, "inference_sees_a_batch", False))

    def adopt_partner_dtype(self, fn: str, reads: Sequence[str]) -> bool:
        """On a backend that does not mix dtypes: a scalar variable of
        ``reads`` only ever given Python constants (weak) takes the dtype of
        the other inputs of its kind, where they have exactly one
        (``i = 0; while i < k`` with an int32 ``k`` makes ``i`` int32, as
        TFP types constants on TensorFlow), so that the run does not meet
        int64 and int32 in one op.  True if a variable changed."""
        env = self.vars[fn]
        leaves = {v: env[v].leaves() for v in reads}
        weak = [v for v, ls in leaves.items() if len(ls) == 1 and ls[0].weak]
        changed = False
        for var in weak:
            leaf = leaves[var][0]
            partners = {other.dtype for v, ls in leaves.items() if v not in weak
                        for other in ls if not other.weak and other.dtype.kind == leaf.dtype.kind}
            if len(partners) == 1:
                self.set_var(fn, var, Type(TensorType(partners.pop(), leaf.shape)))
                changed = True
        return changed

    def set_var(self, fn: str, var: str, typ: Type) -> None:
        old = self.vars[fn].get(var)
        new = merge_types(old, typ, f"variable {var!r} of function {fn!r}", self.merge_dtypes)
        if new != old:
            self.vars[fn][var] = new
            self.changed = True

    def bind(self, fn: str, pattern: Any, typ: Type, where: str, op: Any) -> None:
        for var, part in bind_pattern(pattern, typ.tensors, where, op):
            self.set_var(fn, var, Type(part))

    def set_params(self, fn: Function, types: Sequence[Type], where: str) -> None:
        known = self.params.setdefault(fn.name, [None] * len(fn.params))
        for i, (name, typ) in enumerate(zip(fn.params, types)):
            new = merge_types(known[i], typ,
                              f"parameter {name!r} of function {fn.name!r} (called from {where})",
                              self.merge_dtypes)
            if new != known[i]:
                known[i] = new
                self.changed = True
            self.set_var(fn.name, name, new)

    def set_ret(self, fn: str, typ: Type) -> None:
        new = merge_types(self.ret[fn], typ, f"the return value of function {fn!r}",
                          self.merge_dtypes)
        if new != self.ret[fn]:
            self.ret[fn] = new
            self.changed = True

    def placeholder(self, tensor_type: TensorType, batch: int = 1) -> Any:
        """The backend's placeholder for ``batch`` threads; a weak type's is
        a Python scalar, so that the primop meets it as it would meet the
        constant, of the value the backend's placeholders hold
        (``placeholder_fill``: 0 on NumPy, 1 on TensorFlow, where ``n % d``
        raises on a zero ``d``)."""
        if tensor_type.weak:
            fill = getattr(self.backend, "placeholder_fill", 0)
            return np.full((), fill, tensor_type.dtype).item()
        return self.backend.placeholder(tensor_type, batch)

    def primop_type(self, fn: Function, op: PrimOp, types: Tuple[Type, ...],
                    where: str) -> Type:
        key = (id(op), types)
        cached = self.primop_cache.get(key)
        if cached is not None:
            return cached
        batch = inference_batch(types) if self.whole_batch else 1
        inputs = [pattern_map(lambda t: self.placeholder(t, batch), t.tensors) for t in types]
        try:
            with np.errstate(all="ignore"), _inferring():
                out = self.backend.run_on_dummies(op.function, inputs)
            typ = type_of_value(out, self.backend, batch)
        except TypeInferenceError:
            raise
        except Exception as exc:
            shown = ", ".join(f"{v}: {t}" for v, t in zip(op.vars_in, types))
            fill = getattr(self.backend, "placeholder_fill", 0)
            threads = "one thread" if batch == 1 else f"{batch} threads"
            raise TypeInferenceError(
                f"{where}: primop `{op}` failed on placeholder inputs ({threads} "
                f"of {fill}s; {shown}): {type(exc).__name__}: {exc}") from exc
        self.primop_cache[key] = typ
        return typ

    def visit(self, fn: Function) -> None:
        env = self.vars[fn.name]
        if fn.type_inference is not None and None not in self.params[fn.name]:
            try:
                # As TFP: a list of TensorType patterns (.dtype, .shape), one per
                # parameter.
                declared = as_type(fn.type_inference(
                    [t.strong().tensors for t in self.params[fn.name]]))
            except Exception as exc:
                raise TypeInferenceError(f"type_inference of function {fn.name!r} failed "
                                         f"on {[str(t) for t in self.params[fn.name]]}: "
                                         f"{exc}") from exc
            self.set_ret(fn.name, declared)
        for block in fn.blocks:
            where = f"function {fn.name!r}, block {block.name!r}"
            for op in block.instructions:
                if not all(v in env for v in op.reads):
                    continue
                types = tuple(env[v] for v in op.reads)
                if isinstance(op, PrimOp):
                    if self.unify_weak and self.adopt_partner_dtype(fn.name, op.reads):
                        types = tuple(env[v] for v in op.reads)
                    self.bind(fn.name, op.vars_out,
                              self.primop_type(fn, op, types, where), where, op)
                elif isinstance(op, FunctionCallOp):
                    callee = self.program.function(op.function)
                    self.set_params(callee, types, f"{where}")
                    ret = self.ret[callee.name]
                    if ret is not None:
                        self.bind(fn.name, op.vars_out, ret, where, op)
                elif isinstance(op, CopyOp):
                    value = pattern_unflatten(op.vars_in, [t.tensors for t in types])
                    self.bind(fn.name, op.vars_out, Type(value), where, op)
                else:
                    raise ProgramError(f"{where}: {type(op).__name__} belongs to lowered "
                                       f"programs; infer types before lowering")
            term = block.terminator
            if isinstance(term, ReturnOp) and all(v in env for v in term.reads):
                value = pattern_map(lambda v: env[v].tensors, term.vars)
                self.set_ret(fn.name, Type(value))

    def run(self, arg_types: Sequence[Type]) -> None:
        main = self.program.main_function()
        if len(arg_types) != len(main.params):
            raise ProgramError(f"function {main.name!r} takes {len(main.params)} argument(s) "
                               f"{main.params}, got types for {len(arg_types)}")
        self.set_params(main, [as_type(t) for t in arg_types], "the caller")
        rounds = 0
        while True:
            self.changed = False
            for fn in self.program.functions:
                if fn.name in self.params and None not in self.params[fn.name]:
                    self.visit(fn)
            rounds += 1
            if not self.changed:
                break
        log.debug("type inference converged after %d rounds", rounds)


def _is_type_like(value: Any) -> bool:
    leaves = pattern_leaves(as_pattern(value))
    return bool(leaves) and all(isinstance(v, (Type, TensorType)) for v in leaves)


def _types_of_arguments(args: Sequence[Any], backend: Any) -> List[Any]:
    """``args`` as types: types stay, values (TFP passes the inputs) are typed
    by ``backend`` with the batch size of their first batched leaf."""
    if all(_is_type_like(a) for a in args):
        return list(args)
    batch = 1
    for leaf in pattern_leaves(as_pattern(list(args))):
        shape = getattr(leaf, "shape", ())
        if not _is_type_like(leaf) and len(shape) >= 1 and shape[0] is not None:
            batch = int(shape[0])
            break
    return [a if _is_type_like(a) else type_of_value(a, backend, batch) for a in args]


def _strong(typ: Type) -> Type:
    return typ.strong()


def _confirm_constant_typed(fn: Function, env: Dict[str, Type], var_types: Dict[str, Type],
                            backend: Any) -> None:
    """Run again, on placeholders of the final types, every primop of ``fn``
    that reads a variable only ever given Python constants (weak: inference
    ran the primop with a Python scalar for it, but the run stores it in its
    default dtype, int64 or float64).  On TensorFlow, which does not mix
    dtypes, ``d > n`` with such a ``d`` and an int32 ``n`` would otherwise
    fail in the middle of the run with TensorFlow's own TypeError; here it is
    a TypeInferenceError naming the variable, before anything runs."""
    weak = {v for v in fn.variables()
            if v in env and any(leaf.weak for leaf in env[v].leaves())}
    if not weak:
        return
    for block in fn.blocks:
        for op in block.instructions:
            if not isinstance(op, PrimOp) or not weak & set(op.reads):
                continue
            inputs = [pattern_map(lambda t: backend.placeholder(t, 1), var_types[v].tensors)
                      for v in op.reads]
            try:
                with np.errstate(all="ignore"), _inferring():
                    backend.run_on_dummies(op.function, inputs)
            except Exception as exc:
                named = ", ".join(f"{v}: {var_types[v]}" for v in op.reads)
                only = ", ".join(repr(v) for v in op.reads if v in weak)
                raise TypeInferenceError(
                    f"function {fn.name!r}, block {block.name!r}: primop `{op}` fails on "
                    f"the types the run stores ({named}): {type(exc).__name__}: {exc}. "
                    f"{only} is only ever given Python constants, so it is stored in the "
                    f"default dtype; start it from a typed value instead (e.g. `n - n + "
                    f"1` for a counter next to an int32 `n`)") from exc


def infer_types(program: Program, inputs: Sequence[Any], backend: Any = None) -> Program:
    """A copy of ``program`` with ``var_types`` and ``return_type`` set on every
    function reachable from ``main``.

    Parameters
    ----------
    program : an unlowered program.
    inputs : the Type (or TensorType) of each of ``main``'s parameters,
        without the batch dimension; or, as TFP's ``infer_types(program,
        inputs, backend)``, the input values themselves (batch dimension
        first), whose types ``backend`` reads.
    backend : runs the primops on placeholders (default: NumpyBackend).

    Raises
    ------
    TypeInferenceError : types that disagree, a primop that fails on
        placeholders, a type that cannot be inferred.
    ProgramError : a variable read before it is written.
    """
    if backend is None:
        backend = _NumpyPlaceholders()
    arg_types = _types_of_arguments(inputs, backend)
    program.validate()
    in_use = reachable(call_graph(program), program.main)
    for fn in program.functions:
        if fn.name in in_use:
            check_defined(function_flow(fn))
    inference = _Inference(program, backend)
    inference.run(arg_types)
    functions = []
    for fn in program.functions:
        if fn.name not in in_use:
            functions.append(fn)
            continue
        env = inference.vars[fn.name]
        if fn.name not in inference.params or None in inference.params[fn.name]:
            raise TypeInferenceError(f"function {fn.name!r} is never called with known "
                                     f"argument types")
        ret = inference.ret[fn.name]
        if ret is None:
            raise TypeInferenceError(
                f"cannot infer the return type of function {fn.name!r}: no return is "
                f"reached without a recursive call whose type is unknown; give the "
                f"function a type_inference callable (argument types -> [return type])")
        for var in fn.variables():
            if var not in env:
                raise TypeInferenceError(
                    f"cannot infer the type of variable {var!r} of function {fn.name!r}: "
                    f"it depends on a call whose return type is unknown; give the callee "
                    f"a type_inference callable")
        var_types = {var: _strong(env[var]) for var in fn.variables()}
        for block in fn.blocks:
            term = block.terminator
            if isinstance(term, BranchOp):
                leaves = var_types[term.cond].leaves()
                if len(leaves) != 1 or leaves[0].dtype != np.bool_ or leaves[0].shape:
                    raise TypeInferenceError(
                        f"function {fn.name!r}, block {block.name!r}: branch condition "
                        f"{term.cond!r} is {var_types[term.cond]}; it must be a boolean "
                        f"scalar per thread (bool[])")
        _confirm_constant_typed(fn, env, var_types, backend)
        blocks = _materialize_broadcasts(fn, inference, var_types, _strong(ret))
        functions.append(replace(fn, blocks=blocks, var_types=var_types,
                                 return_type=_strong(ret)))
    return program.replace_functions(functions)



def _shapes(pattern: Any) -> Any:
    return pattern_map(lambda t: t.shape, pattern)


def _materialize_broadcasts(fn: Function, inference: "_Inference",
                            var_types: Dict[str, Type], ret: Type) -> List[Block]:
    """``fn``'s blocks, with every write of a smaller shape to a variable whose
    type has the broadcast shape made explicit: the primop's function is
    wrapped in :class:`~autobatch.instructions.BroadcastOutputs`, and an
    argument, a call's result or a returned value of a smaller shape goes
    through a :func:`~autobatch.instructions.broadcast_op`.  Adds the fresh
    variables' types to ``var_types``.  Blocks without such a write are kept
    as they are (the same objects)."""
    env = inference.vars[fn.name]
    counter = [0]

    def fresh(var: str, typ: Type) -> str:
        counter[0] += 1
        name = f"{var}.bcast{counter[0]}"
        while name in var_types:
            counter[0] += 1
            name = f"{var}.bcast{counter[0]}"
        var_types[name] = typ
        return name

    def target(pattern: Any) -> Any:
        return pattern_map(lambda v: var_types[v].tensors, pattern)

    blocks = []
    for block in fn.blocks:
        where = f"function {fn.name!r}, block {block.name!r}"
        out: List[Any] = []
        changed = False
        for op in block.instructions:
            if isinstance(op, PrimOp):
                have = inference.primop_type(fn, op, tuple(env[v] for v in op.reads),
                                             where).strong().tensors
                want = target(op.vars_out)
                if _shapes(have) != _shapes(want):
                    op = replace(op, function=BroadcastOutputs(op.function, have, want))
                    changed = True
                out.append(op)
            elif isinstance(op, FunctionCallOp):
                params = [t.strong() for t in inference.params[op.function]]
                args = list(op.vars_in)
                for i, (arg, param) in enumerate(zip(op.vars_in, params)):
                    if _shapes(var_types[arg].tensors) != _shapes(param.tensors):
                        args[i] = fresh(arg, param)
                        out.append(broadcast_op(arg, args[i], var_types[arg].tensors,
                                                param.tensors))
                        changed = True
                callee_ret = inference.ret[op.function].strong()
                if _shapes(callee_ret.tensors) != _shapes(target(op.vars_out)):
                    tmp = fresh("ret", callee_ret)
                    out.append(replace(op, vars_in=tuple(args), vars_out=tmp))
                    out.append(broadcast_op(tmp, op.vars_out, callee_ret.tensors,
                                            target(op.vars_out)))
                    changed = True
                else:
                    out.append(replace(op, vars_in=tuple(args)) if changed else op)
            else:
                out.append(op)
        term = block.terminator
        if isinstance(term, ReturnOp) and _shapes(target(term.vars)) != _shapes(ret.tensors):
            tmp = fresh("ret", ret)
            out.append(broadcast_op(term.vars, tmp, target(term.vars), ret.tensors))
            term = ReturnOp(tmp)
            changed = True
        blocks.append(replace(block, instructions=out, terminator=term) if changed else block)
    return blocks


# -- TFP's signature helpers -------------------------------------------------------

def type_of_pattern(val: Any, backend: Any, preferred_type: Any = None) -> Any:
    """TFP's ``type_of_pattern``: the pattern of :class:`TensorType` of the
    value pattern ``val``, each leaf's *whole* shape (batch dimension
    included), as ``backend.type_of(leaf, dtype_hint)`` reads it; where
    ``preferred_type`` (a Type or pattern of TensorType shaped like
    ``val``) gives a leaf's dtype, that dtype is the hint (a Python
    constant takes it).  ValueError where ``val`` lacks a tuple the
    preferred type has."""
    preferred = preferred_type.tensors if isinstance(preferred_type, Type) else preferred_type

    def walk(want: Any, value: Any) -> Any:
        if isinstance(want, tuple):
            if not isinstance(value, (tuple, list)) or len(value) != len(want):
                raise ValueError(f"Type mismatch: expected structured type {want}, "
                                 f"got object {value!r}")
            return rebuild(want, (walk(w, v) for w, v in zip(want, value)))
        if isinstance(value, list):
            return [walk(None, v) for v in value]
        if isinstance(value, tuple):
            return rebuild(value, (walk(None, v) for v in value))
        hint = want.dtype if isinstance(want, TensorType) else None
        return backend.type_of(value, dtype_hint=hint)
    return walk(preferred, val)


def _main_inputs(program: Program) -> Tuple[Tuple[str, ...], Dict[str, Any]]:
    """``main``'s parameters and the declared ``var_defs`` (TFP's ``Program``
    keeps them; a program of autobatch's own form declares none)."""
    main = program.main_function()
    return tuple(main.params), dict(program.given_var_defs or {})


def signature(program: Program, inputs: Sequence[Any], backend: Any) -> List[Any]:
    """TFP's ``signature``: the type of each input of ``program``'s main, a
    pattern of :class:`TensorType` without the batch dimension (read by
    :func:`type_of_pattern`, each input's declared ``var_defs`` type its
    preference)."""
    params, var_defs = _main_inputs(program)
    if len(inputs) != len(params):
        raise ProgramError(f"signature: main takes {len(params)} input(s) {list(params)}, "
                           f"got {len(inputs)}")

    def strip(pattern: Any) -> Any:
        return pattern_map(lambda t: TensorType(t.dtype, t.shape[1:]), pattern)
    return [strip(type_of_pattern(value, backend, var_defs.get(name)))
            for name, value in zip(params, inputs)]


def infer_types_from_signature(program: Program, sig: Sequence[Any], backend: Any) -> Program:
    """TFP's ``infer_types_from_signature``: :func:`infer_types` given the
    types of main's inputs (patterns of :class:`TensorType` or Types,
    without the batch dimension), as :func:`signature` gives them."""
    params, _ = _main_inputs(program)
    if len(sig) != len(params):
        raise ProgramError(f"infer_types_from_signature: main takes {len(params)} input(s) "
                           f"{list(params)}, got a signature of {len(sig)}")
    return infer_types(program, [as_type(t) for t in sig], backend)
