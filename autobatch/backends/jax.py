"""The JAX backend: a program without calls traced into one ``jax.jit``
function over masked lanes, the loop ``jit(vmap(f))`` would compile.

Where :mod:`autobatch.fused` moves lanes between compacted groups (NumPy,
shapes change), XLA wants static shapes, so here every value covers the
whole batch and a boolean *mask* says which lanes are on the path being
traced:

- a block's primops run on every lane; only the lanes of the mask matter;
- a branch traces both sides, each under its part of the mask
  (``mask & cond``, ``mask & ~cond``); they meet at the branch's join (its
  nearest post-dominator, as in :mod:`autobatch.fused`), where each
  variable takes, lane by lane, the value of the side the lane took;
- a loop is one ``lax.while_loop`` that runs while any lane is still in
  it.  It carries the variables live at its head; a lane that leaves keeps
  its values frozen.  Lanes that leave by the loop condition need nothing
  more (the head runs once more after the loop to send them on); a loop
  left only that way carries nothing else, as ``vmap`` makes of a
  ``while_loop`` (the lanes still in it: those that entered and whose
  condition holds).  Lanes that leave by a break or a return go to per-exit
  collectors, and such a loop carries the mask of the lanes still in it;
- a return writes the lanes of its mask into the result.

That is what ``vmap`` makes of ``lax.while_loop`` / ``lax.cond``: every
iteration costs the whole batch, both sides of a branch run on every lane
(XLA's ops do not raise on the other side's values: an integer division by
zero gives a value that is then dropped).  Values are 64-bit where the
program's types are (``jax_enable_x64`` is switched on when this module is
imported, as 64-bit types need).  Results are the reference's, bit for bit,
where the primops compute the same on ``jax.numpy`` arrays as on NumPy
arrays (integer and float arithmetic, comparisons, ``@``, ``%``, ``//``;
primops must use operators or ``jnp`` functions, not ``np`` functions that
convert their argument to a NumPy array).

Scope: programs whose ``main`` makes no call.  Recursion needs the VM,
which runs on NumPy and TensorFlow; :meth:`JaxBackend.compile` raises
:class:`~autobatch.errors.ProgramError` for a program with calls, naming
the call and those backends.  Results come back as NumPy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)


def _synchronous_cpu_dispatch() -> None:
    """Run jitted calls in the calling thread on CPU (JAX's
    ``jax_cpu_enable_async_dispatch=False``) where this import comes before
    JAX made its CPU client and the user did not choose (environment
    variable ``JAX_CPU_ENABLE_ASYNC_DISPATCH``).  A run's results are
    converted to NumPy at once, so asynchronous dispatch buys nothing here
    and costs two thread hand-offs per call (tens of microseconds, the whole
    run time of a small batch)."""
    import os
    if "JAX_CPU_ENABLE_ASYNC_DISPATCH" in os.environ:
        return
    try:
        from jax._src import xla_bridge
        if xla_bridge.backends_are_initialized():
            return
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    except (ImportError, AttributeError):  # another JAX: keep its default
        pass


_synchronous_cpu_dispatch()

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from autobatch.backends.base import Abilities  # noqa: E402
from autobatch.errors import ProgramError  # noqa: E402
from autobatch.fused import _EXIT, _join, _shape, _Shape, _Unsupported  # noqa: E402
from autobatch.ir import (  # noqa: E402
    BranchOp, CopyOp, Function, FunctionCallOp, GotoOp, PrimOp, Program, ReturnOp,
    TensorType, as_pattern, bind_pattern, pattern_leaves, pattern_map, pattern_unflatten,
)

__all__ = ["JaxBackend", "JaxProgram"]


@dataclass
class _Collector:
    """Lanes arriving at one block from several paths: the state keys of
    their mask and of the variables live there."""

    mask_key: str
    var_keys: Dict[str, List[str]] = field(default_factory=dict)
    #: No lane has arrived yet in the code being traced: the first deposit
    #: stores its values as they are (lanes outside a mask are never read).
    fresh: bool = True
    #: The masks deposited so far while the collector is local to the code
    #: being traced (their union is formed when it is taken, so that the two
    #: sides of a branch give back the branch's own mask); None once the
    #: mask lives in the state (a loop carries it).
    pending: Optional[List[Any]] = field(default_factory=list)


class _Tracer:
    """Builds the traced computation of one function, one block path at a time.

    ``self.state`` maps keys to arrays: the result leaves (``out#i``) and
    every open collector's mask and variables.  A ``lax.while_loop`` carries
    the whole state, so a loop body can write results and reach collectors
    opened outside it.
    """

    def __init__(self, fn: Function, shape: _Shape, batch: int, unroll: int = 1) -> None:
        self.fn = fn
        self.shape = shape
        self.blocks = {b.name: b for b in fn.blocks}
        self.batch = batch
        self.state: Dict[str, Any] = {}
        self.count = 0
        self.open: List[_Collector] = []
        #: id(mask) -> (its sibling, their parent) for the two sides of a branch.
        self.siblings: Dict[int, Tuple[Any, Any]] = {}
        self._alive: List[Any] = []  # keeps the ids of `siblings` unique
        #: Iterations of an innermost loop per ``lax.while_loop`` trip.
        self.unroll = unroll

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def norm(self, value: Any, leaf_type: TensorType) -> Any:
        """``value`` as an array ``[batch, *shape]`` of the leaf's dtype."""
        array = jnp.asarray(value, dtype=leaf_type.dtype)
        full = (self.batch,) + leaf_type.shape
        return array if array.shape == full else jnp.broadcast_to(array, full)

    def zeros(self, leaf_type: TensorType) -> Any:
        return jnp.zeros((self.batch,) + leaf_type.shape, leaf_type.dtype)

    @staticmethod
    def select(mask: Any, a: Any, b: Any) -> Any:
        if a is b:
            return a
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    def leaves_of(self, var: str, value: Any) -> List[Any]:
        types = self.fn.var_types[var].leaves()
        return [self.norm(v, t) for v, t in zip(pattern_leaves(as_pattern(value)), types)]

    # -- masks -------------------------------------------------------------------------------
    def split(self, mask: Any, cond: Any) -> Tuple[Any, Any]:
        """The lanes of ``mask`` where ``cond`` holds, and the others."""
        true, false = mask & cond, mask & ~cond
        self.siblings[id(true)] = (false, mask)
        self.siblings[id(false)] = (true, mask)
        self._alive.extend((true, false))
        return true, false

    def union(self, masks: List[Any]) -> Any:
        """The lanes of any of ``masks``; the two sides of a branch give back
        the branch's mask (no operation)."""
        masks = list(masks)
        merged = True
        while merged and len(masks) > 1:
            merged = False
            for i, m in enumerate(masks):
                pair = self.siblings.get(id(m))
                if pair is None:
                    continue
                for j, other in enumerate(masks):
                    if j != i and other is pair[0]:
                        masks = [x for k, x in enumerate(masks) if k not in (i, j)]
                        masks.append(pair[1])
                        merged = True
                        break
                if merged:
                    break
        if not masks:
            return jnp.zeros((self.batch,), bool)
        out = masks[0]
        for m in masks[1:]:
            out = out | m
        return out

    # -- collectors -------------------------------------------------------------------------
    def collector(self, block: str) -> _Collector:
        coll = _Collector(self.fresh("mask"))
        for var in sorted(self.shape.live_in[block]):
            keys = []
            for leaf_type in self.fn.var_types[var].leaves():
                key = self.fresh(f"{var}#")
                self.state[key] = self.zeros(leaf_type)
                keys.append(key)
            coll.var_keys[var] = keys
        self.open.append(coll)
        return coll

    def materialize(self) -> None:
        """Put every open collector's mask in the state (before a loop)."""
        for coll in self.open:
            if coll.pending is not None:
                self.state[coll.mask_key] = self.union(coll.pending)
                coll.pending = None

    def deposit(self, coll: _Collector, mask: Any, env: Dict[str, List[Any]]) -> None:
        if coll.pending is not None:
            coll.pending.append(mask)
        else:
            self.state[coll.mask_key] = self.state[coll.mask_key] | mask
        fresh, coll.fresh = coll.fresh, False
        for var, keys in coll.var_keys.items():
            for key, leaf in zip(keys, env[var]):
                self.state[key] = leaf if fresh else self.select(mask, leaf, self.state[key])

    def take(self, coll: _Collector) -> Any:
        env = {var: [self.state[k] for k in keys] for var, keys in coll.var_keys.items()}
        mask = self.union(coll.pending) if coll.pending is not None \
            else self.state[coll.mask_key]
        return mask, env

    def drop(self, coll: _Collector) -> None:
        self.open.remove(coll)
        self.state.pop(coll.mask_key, None)
        for keys in coll.var_keys.values():
            for key in keys:
                del self.state[key]

    # -- blocks ------------------------------------------------------------------------------
    def run_block(self, name: str, env: Dict[str, List[Any]]) -> Tuple[Any, Dict[str, Any]]:
        """Block ``name``'s instructions on ``env``: a reader of the values
        after them, and the env with the variables live after it updated."""
        block = self.blocks[name]
        values: Dict[str, Any] = {}

        def read(var: str) -> Any:
            if var in values:
                return values[var]
            return pattern_unflatten(self.fn.var_types[var].tensors, env[var])

        for op in block.instructions:
            if isinstance(op, PrimOp):
                value = op.function(*[read(v) for v in op.vars_in])
            elif isinstance(op, CopyOp):
                value = pattern_map(read, op.vars_in)
            else:
                raise _Unsupported(type(op).__name__)
            for var, part in bind_pattern(op.vars_out, value, name, op):
                values[var] = part
        after = dict(env)
        if not isinstance(block.terminator, ReturnOp):
            for var in sorted(set(values) & self.shape.live_out[name]):
                after[var] = self.leaves_of(var, values[var])
        return read, after

    def condition(self, read: Any, var: str) -> Any:
        return jnp.broadcast_to(jnp.asarray(read(var), bool), (self.batch,))

    # -- paths -------------------------------------------------------------------------------
    def path(self, name: str, mask: Any, env: Dict[str, List[Any]],
             targets: Dict[str, _Collector], active: FrozenSet[str]) -> None:
        """Trace block ``name`` for the lanes of ``mask`` and go on until they
        reach a block of ``targets`` (deposited there) or return."""
        if name in self.shape.headers and name not in active:
            self.loop(name, mask, env, targets, active)
            return
        read, env = self.run_block(name, env)
        term = self.blocks[name].terminator
        if isinstance(term, ReturnOp):
            value = pattern_map(read, term.vars)
            for i, (leaf, leaf_type) in enumerate(zip(pattern_leaves(as_pattern(value)),
                                                      self.fn.return_type.leaves())):
                key = f"out#{i}"
                self.state[key] = self.select(mask, self.norm(leaf, leaf_type),
                                              self.state[key])
            return
        if isinstance(term, GotoOp):
            self.route(term.target, mask, env, targets, active)
            return
        if not isinstance(term, BranchOp):
            raise _Unsupported(type(term).__name__)
        true, false = self.split(mask, self.condition(read, term.cond))
        join = _join(self.shape, name, targets)
        inner = dict(targets)
        coll = None
        if join != _EXIT and join not in targets:
            coll = self.collector(join)
            inner[join] = coll
        self.route(term.true_target, true, env, inner, active)
        self.route(term.false_target, false, env, inner, active)
        if coll is not None:
            joined_mask, joined_env = self.take(coll)
            self.drop(coll)
            self.path(join, joined_mask, joined_env, targets, active)

    def route(self, target: str, mask: Any, env: Dict[str, List[Any]],
              targets: Dict[str, _Collector], active: FrozenSet[str]) -> None:
        if target in targets:
            self.deposit(targets[target], mask, env)
        else:
            self.path(target, mask, env, targets, active)

    def loop(self, head: str, mask: Any, env: Dict[str, List[Any]],
             targets: Dict[str, _Collector], active: FrozenSet[str]) -> None:
        """One ``lax.while_loop`` for the loop at ``head``, as ``vmap`` makes
        of a ``while_loop``: it carries the variables live at ``head`` for
        every lane and the mask of the lanes still in the loop; a lane that
        leaves keeps its values frozen.  Lanes that leave by the head's own
        branch (the loop condition) need nothing more: after the loop the
        head is run once more on the frozen values to send them on.  Lanes
        that leave from inside (break, return) are kept in collectors."""
        body_blocks = self.shape.loop_body[head]
        term = self.blocks[head].terminator
        head_exit, stay_true = None, True
        if isinstance(term, BranchOp):
            inside = (term.true_target in body_blocks, term.false_target in body_blocks)
            if inside[0] != inside[1]:
                stay_true = inside[0]
                head_exit = term.false_target if stay_true else term.true_target
        exits: Dict[str, _Collector] = {}
        for b in sorted(body_blocks):
            for s in self.shape.succ[b]:
                if s in body_blocks or s in targets or s in exits:
                    continue
                if s == head_exit and b == head:
                    continue  # by the frozen values
                exits[s] = self.collector(s)
        inner = dict(targets)
        inner.update(exits)
        carried = sorted(self.shape.live_in[head])
        # A simple loop (left by its condition only; no return, break or inner
        # loop) touches nothing but its own variables: it carries no state,
        # nor a mask of the lanes still in it (those that entered it and whose
        # condition holds, as in vmap's while_loop).
        simple = head_exit is not None and not any(
            (s not in body_blocks and not (b == head and s == head_exit))
            or isinstance(self.blocks[b].terminator, ReturnOp)
            or (b != head and b in self.shape.headers)
            for b in body_blocks for s in self.shape.succ[b])
        if simple:
            keys: List[str] = []
        else:
            self.materialize()
            keys = sorted(self.state)
        counts = [len(env[v]) for v in carried]

        def unpack(vals: List[Any]) -> Tuple[Dict[str, Any], Dict[str, List[Any]], Any]:
            state = dict(zip(keys, vals[:len(keys)]))
            rest = vals[len(keys):-1]
            carried_env, i = {}, 0
            for var, n in zip(carried, counts):
                carried_env[var] = list(rest[i:i + n])
                i += n
            return state, carried_env, vals[-1]

        def staying(vals: Any) -> Any:
            """A simple loop's lanes still in it: ``vals[-1]`` holds the
            lanes that entered it; a lane that left has values frozen where
            the head sends it out (its condition is the same every time)."""
            _, values, entered = unpack(vals)
            read, _ = self.run_block(head, values)
            true, false = self.split(entered, self.condition(read, term.cond))
            return true if stay_true else false

        def cond(vals: Any) -> Any:
            return jnp.any(staying(vals) if simple else vals[-1])

        def step(vals: Any) -> Any:
            saved = self.state
            self.state, values, lanes = unpack(vals)
            # Collectors opened outside the body gather lanes over all
            # iterations; `again` (the lanes back at the head) restarts at each.
            if not simple:
                for coll in self.open:
                    coll.fresh = False
            again = self.collector(head)
            inner[head] = again
            it_env = {} if simple else dict(env)
            it_env.update(values)
            if head_exit is None:
                self.path(head, lanes, it_env, inner, active | {head})
            else:
                read, after = self.run_block(head, it_env)
                true, false = self.split(lanes, self.condition(read, term.cond))
                stay, target = (true, term.true_target) if stay_true \
                    else (false, term.false_target)
                self.route(target, stay, after, inner, active | {head})
            back, back_env = self.take(again)
            self.drop(again)
            new_values = [self.select(back, new, old) for var in carried
                          for new, old in zip(back_env[var], values[var])]
            out = [self.state[k] for k in keys] + new_values + [lanes if simple else back]
            self.state = saved
            return out

        unroll = self.unroll if not any(h != head and h in body_blocks
                                        for h in self.shape.headers) else 1

        def body(vals: Any) -> Any:
            for _ in range(unroll):
                vals = step(vals)
            return vals

        init = [self.state[k] for k in keys] + [leaf for v in carried for leaf in env[v]] \
            + [mask]
        vals = lax.while_loop(cond, body, init)
        state, final_values, _ = unpack(vals)
        self.state.update(state)
        if head_exit is not None:
            final_env = dict(env)
            final_env.update(final_values)
            read, after = self.run_block(head, final_env)
            true, false = self.split(mask, self.condition(read, term.cond))
            left = false if stay_true else true
            if head_exit in exits:
                self.deposit(exits[head_exit], left, after)
            else:
                self.route(head_exit, left, after, targets, active)
        for target, coll in exits.items():
            exit_mask, exit_env = self.take(coll)
            self.drop(coll)
            self.path(target, exit_mask, exit_env, targets, active)


class JaxProgram:
    """A call-free typed program as one ``jax.jit`` function (traced and
    compiled once per batch size, on the first call with it).

    ``steps`` is 0: the loop count stays inside XLA.
    """

    def __init__(self, program: Program, unroll: int = 1) -> None:
        self.program = program
        self.unroll = unroll
        self.function = fn = program.main_function()
        self.shape = _shape(fn)
        self.steps = 0
        self._jitted = jax.jit(self._trace)
        types = [fn.var_types[p] for p in fn.params]
        #: Per parameter, its leaves' (dtype, shape) when it is a tuple of
        #: leaves, else None: the fast path of :meth:`run`.
        self._flat_types = [[(t.dtype, t.shape) for t in typ.leaves()]
                            if isinstance(typ.tensors, tuple) and all(
                                not isinstance(x, tuple) for x in typ.tensors)
                            else None for typ in types]
        self._single = [(typ.tensors.dtype, typ.tensors.shape)
                        if not isinstance(typ.tensors, tuple) else None for typ in types]

    def _trace(self, *args: Any) -> Any:
        fn = self.function
        leaves = [leaf for a in args for leaf in pattern_leaves(as_pattern(a))]
        batch = leaves[0].shape[0] if leaves else 1
        tracer = _Tracer(fn, self.shape, batch, self.unroll)
        env = {param: tracer.leaves_of(param, arg) for param, arg in zip(fn.params, args)}
        for i, leaf_type in enumerate(fn.return_type.leaves()):
            tracer.state[f"out#{i}"] = tracer.zeros(leaf_type)
        tracer.path(fn.entry.name, jnp.ones((batch,), bool), env, {}, frozenset())
        return tuple(tracer.state[f"out#{i}"] for i in range(len(fn.return_type.leaves())))

    def _fast_inputs(self, args: Sequence[Any]) -> Optional[List[Any]]:
        """``args`` as they go to the jitted function where every leaf is
        already an array of its type with one batch size (no conversion, no
        broadcast); None otherwise (the general path)."""
        if len(args) != len(self._single):
            return None
        batch = None
        inputs: List[Any] = []
        for arg, single, flat in zip(args, self._single, self._flat_types):
            if single is not None:
                leaves, types = (arg,), (single,)
            elif flat is not None and type(arg) in (tuple, list) and len(arg) == len(flat):
                leaves, types = arg, flat
            else:
                return None
            for leaf, (dtype, shape) in zip(leaves, types):
                if type(leaf) is not np.ndarray or leaf.dtype != dtype \
                        or leaf.shape[1:] != shape or leaf.ndim != len(shape) + 1:
                    return None
                if batch is None:
                    batch = leaf.shape[0]
                elif leaf.shape[0] != batch:
                    return None
            inputs.append(leaves if single is None else arg)
        if not batch:
            return None
        return [tuple(x) if type(x) is list else x for x in inputs]

    def run(self, args: Sequence[Any]) -> Any:
        """main's value per thread (NumPy arrays) for a batch of arguments."""
        fn = self.function
        fast = self._fast_inputs(args)
        if fast is not None:
            outs = [np.asarray(o) for o in self._jitted(*fast)]
            return pattern_unflatten(fn.return_type.tensors, outs)
        from autobatch.arguments import batch_size
        if len(args) != len(fn.params):
            raise ProgramError(f"function {fn.name!r} takes {len(fn.params)} argument(s) "
                               f"{fn.params}, got {len(args)}")
        types = [fn.var_types[p] for p in fn.params]
        batch = batch_size(args, types)
        inputs = []
        for arg, typ in zip(args, types):
            leaves = []
            for leaf, leaf_type in zip(pattern_leaves(as_pattern(arg)), typ.leaves()):
                if getattr(leaf, "shape", None) == (batch,) + leaf_type.shape \
                        and getattr(leaf, "dtype", None) == leaf_type.dtype:
                    leaves.append(leaf)  # jit takes it as it is
                    continue
                array = jnp.asarray(leaf, dtype=leaf_type.dtype)
                if array.ndim == len(leaf_type.shape):
                    array = array[None]
                leaves.append(jnp.broadcast_to(array, (batch,) + leaf_type.shape))
            inputs.append(pattern_unflatten(typ.tensors, leaves))
        if batch == 0:
            outs = [np.zeros((0,) + t.shape, t.dtype) for t in fn.return_type.leaves()]
        else:
            outs = [np.asarray(o) for o in self._jitted(*inputs)]
        return pattern_unflatten(fn.return_type.tensors, outs)


class JaxBackend(Abilities):
    """Runs programs without calls as one XLA loop compiled by JAX.

    Not a VM backend: recursion and calls need the batched VM (NumPy,
    TensorFlow).  During type inference primops run on NumPy placeholders.
    """

    name = "jax"
    #: The pipeline runs programs on :meth:`compile`'s result, not on the VM.
    compiles_programs = True

    def __init__(self, unroll: int = 1) -> None:
        if not isinstance(unroll, int) or unroll < 1:
            raise ValueError(f"JaxBackend(unroll=...) takes a positive int, got {unroll!r}")
        #: Iterations of an innermost loop traced into one trip of its
        #: ``lax.while_loop`` (a trip's fixed cost shared; at most
        #: ``unroll - 1`` iterations run on no lane at the end).
        self.unroll = unroll

    def cache_key(self) -> Tuple[Any, ...]:
        return (type(self), self.unroll)

    def type_of(self, value: Any, batch_size: int) -> TensorType:
        from autobatch.backends.numpy import NumpyBackend
        return NumpyBackend().type_of(np.asarray(value) if hasattr(value, "__jax_array__")
                                      or type(value).__module__.startswith("jax")
                                      else value, batch_size)

    def placeholder(self, tensor_type: TensorType, batch_size: int) -> np.ndarray:
        return np.zeros((batch_size,) + tensor_type.shape, dtype=tensor_type.dtype)

    def compile(self, program: Program) -> JaxProgram:
        """The jitted form of a typed program; ProgramError for one with calls."""
        fn = program.main_function()
        for block in fn.blocks:
            for op in block.instructions:
                if isinstance(op, FunctionCallOp):
                    raise ProgramError(
                        f"the JAX backend runs programs without calls (one XLA loop); "
                        f"{fn.name!r} calls {op.function!r} (block {block.name!r}): run "
                        f"it with NumpyBackend() or TensorFlowBackend('xla')")
        try:
            return JaxProgram(program, self.unroll)
        except _Unsupported as exc:
            raise ProgramError(f"the JAX backend cannot run {fn.name!r}: {exc}") from exc

    def __repr__(self) -> str:
        return "JaxBackend()" if self.unroll == 1 else f"JaxBackend(unroll={self.unroll})"
