"""A lowered program as the Python source of one numba kernel: :func:`kernel_source`.

The kernel runs every thread's control flow natively, one thread after
another: no masks, no selection, no wasted work.  (``numba.prange`` is not
used: on the 2-core machine it was tried on, shared with other jobs, it
compiled about twice as slowly, and a hand-written prange Collatz over 10,000
lanes ran in 8 ms against 0.55 ms serially.)  For one thread it is the VM's program, read as a
sequential program:

- every variable leaf is a scalar local (int64, float64 or bool), zero
  before it is written, as the VM's registers are;
- a FULL variable also has a stack, one slot per call depth; the return
  addresses have one too (slot 0 holds *halt*, main's return address), and
  ``depth`` starts at 1, as in :mod:`autobatch.virtual_machine`;
- ``pc`` is the index of the block to run next; each block is one arm of an
  ``if pc == k`` chain inside ``while True``, and a jump (not a call) to a
  block that does not close a cycle runs that block's code inline (so a
  loop's whole body is one arm, one dispatch per pass; arms stop inlining
  past ``budget`` lines); a call checks
  ``depth <= max_depth`` first and otherwise stops the thread with its
  ``status`` set to ``1 + the called function's index`` (the engine raises
  the VM's :class:`~autobatch.errors.StackOverflowError`).

Primops are inlined as scalar expressions (:mod:`autobatch.native_expr`).
Anything the generator cannot run as NumPy would (a vector-valued variable,
a primop it cannot read) raises :class:`~autobatch.native_expr.Unlowerable`.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

import numpy as np

from autobatch.ir import (
    BranchOp, CopyOp, GotoOp, IndirectGotoOp, PopOp, PrimOp, PushGotoOp, PushOp,
    VariableAllocation,
)
from autobatch.lowering import LoweredProgram
from autobatch.native_expr import KIND_OF_DTYPE, Scalar, Unlowerable, leaves, scalar_expression

__all__ = ["KernelPlan", "kernel_source"]

_NUMBA_TYPE = {"b": "np.bool_", "i": "np.int64", "f": "np.float64"}
_ZERO = {"b": "False", "i": "0", "f": "0.0"}
_WIDENS = {("b", "i"), ("b", "f"), ("i", "f")}


class KernelPlan:
    """What :func:`kernel_source` made: the source, the kernel's name, the
    dtypes of its input and output leaves, and the called functions (status
    ``k`` means a call to ``callees[k - 1]`` overflowed)."""

    def __init__(self, source: str, input_dtypes: List[np.dtype],
                 output_dtypes: List[np.dtype], callees: List[str]) -> None:
        self.source = source
        self.input_dtypes = input_dtypes
        self.output_dtypes = output_dtypes
        self.callees = callees


def _ident(var: str) -> str:
    return "v_" + re.sub(r"\W", "_", var)


class _Generator:
    def __init__(self, lowered: LoweredProgram) -> None:
        self.lowered = lowered
        self.index = lowered.block_index()
        self.halt = len(lowered.blocks)
        self.names: Dict[str, List[str]] = {}   # var -> leaf locals
        self.kinds: Dict[str, List[str]] = {}   # var -> leaf kinds
        # the program's own variables first, so an error names one of them
        for var in sorted(lowered.var_types, key=lambda v: (v.startswith("<"), v)):
            typ = lowered.var_types[var]
            kinds = []
            for leaf in typ.leaves():
                if tuple(leaf.shape):
                    raise Unlowerable(f"variable {var!r} holds a value of shape "
                                      f"{tuple(leaf.shape)} per thread (the native engine "
                                      f"runs scalars only)")
                kind = KIND_OF_DTYPE.get(np.dtype(leaf.dtype))
                if kind is None:
                    raise Unlowerable(f"variable {var!r} is {np.dtype(leaf.dtype)} (the "
                                      f"native engine runs bool, int64 and float64)")
                kinds.append(kind)
            self.kinds[var] = kinds
            self.names[var] = [f"{_ident(var)}_{j}" for j in range(len(kinds))]
        self.callees: List[str] = []
        self.lines: List[str] = []
        self.count = 0
        #: blocks some code jumps to by ``pc`` (each gets a dispatch arm)
        self.wanted: set = set()
        #: lines an arm may grow to before jumps stop being inlined
        self.budget = 400

    # -- values ------------------------------------------------------------------
    def value_of(self, pattern: Any) -> Any:
        """The Value (Scalars in nested tuples) a pattern of variables holds."""
        if isinstance(pattern, tuple):
            return tuple(self.value_of(p) for p in pattern)
        self.check_readable(pattern)
        scalars = [Scalar(n, k) for n, k in zip(self.names[pattern], self.kinds[pattern])]
        it = iter(scalars)

        def shape(tensors: Any) -> Any:
            if isinstance(tensors, tuple):
                return tuple(shape(t) for t in tensors)
            return next(it)
        return shape(self.lowered.var_types[pattern].tensors)

    def check_readable(self, var: str) -> None:
        if self.lowered.var_alloc[var] == VariableAllocation.NULL:
            raise Unlowerable(f"variable {var!r} is allocated NULL but read (the VM "
                              f"raises NullVariableError there)")

    def bind(self, pattern: Any, value: Any, ind: str, what: str) -> None:
        """``pattern = value``: evaluate every leaf into a temporary first
        (parallel assignment), then store with the variables' dtypes."""
        pairs: List[Tuple[str, str, Scalar]] = []

        def walk(p: Any, v: Any) -> None:
            if isinstance(p, tuple):
                if not isinstance(v, tuple) or len(v) != len(p):
                    raise Unlowerable(f"{what}: a value of structure {_shape(v)} bound "
                                      f"to {p}")
                for sub_p, sub_v in zip(p, v):
                    walk(sub_p, sub_v)
                return
            declared = self.kinds[p]
            scalars = leaves(v)
            if len(scalars) != len(declared):
                raise Unlowerable(f"{what}: {len(scalars)} value(s) for variable {p!r} "
                                  f"of {len(declared)} part(s)")
            for name, kind, s in zip(self.names[p], declared, scalars):
                pairs.append((name, kind, s))
        walk(pattern, value)
        temps = []
        for name, kind, s in pairs:
            if s.kind != kind and (s.kind, kind) not in _WIDENS:
                raise Unlowerable(f"{what}: a {s.kind}-kind value stored in a "
                                  f"{kind}-kind variable")
            src = s.src if s.kind == kind else f"{_NUMBA_TYPE[kind]}({s.src})"
            if len(pairs) == 1:
                self.emit(ind, f"{name} = {src}")
                return
            self.count += 1
            temp = f"t{self.count}"
            self.emit(ind, f"{temp} = {src}")
            temps.append((name, temp))
        for name, temp in temps:
            self.emit(ind, f"{name} = {temp}")

    def emit(self, ind: str, line: str) -> None:
        self.lines.append(ind + line)

    # -- blocks ---------------------------------------------------------------------
    def goto(self, target: str, ind: str, path: frozenset) -> None:
        """Continue at block ``target``: its code inline (the next block
        runs without a trip through the dispatch), or ``pc = target`` where
        it closes a cycle on this path or the arm has grown long."""
        k = self.index[target]
        if k in path or len(self.lines) > self.budget:
            self.emit(ind, f"pc = {k}")
            self.wanted.add(k)
        else:
            self.block(k, ind, path | {k})

    def block(self, k: int, ind: str, path: frozenset) -> None:
        block = self.lowered.blocks[k]
        term = block.terminator
        pc_full = self.lowered.pc_alloc == VariableAllocation.FULL
        if isinstance(term, PushGotoOp) and pc_full:
            callee = self.lowered.callee[block.name]
            if callee not in self.callees:
                self.callees.append(callee)
            self.emit(ind, "if depth > max_depth:")
            self.emit(ind, f"    status[lane] = {self.callees.index(callee) + 1}")
            self.emit(ind, "    break")
        for op in block.instructions:
            what = f"block {block.name!r}"
            if isinstance(op, PrimOp):
                if not op.vars_out:
                    continue
                args = [self.value_of(v) for v in op.vars_in]
                label = op.name or getattr(op.function, "__name__", "?")
                value = scalar_expression(op.function, args, f"{label!r} in {what}")
                self.bind(op.vars_out, value, ind, f"primop {label!r} in {what}")
            elif isinstance(op, CopyOp):
                self.bind(op.vars_out, self.value_of(op.vars_in), ind, f"copy in {what}")
            elif isinstance(op, PushOp):
                for var in op.vars:
                    self.check_readable(var)
                    for name in self.names[var]:
                        self.emit(ind, f"s_{name}[depth] = {name}")
            elif isinstance(op, PopOp):
                for var in op.vars:
                    for name in self.names[var]:
                        self.emit(ind, f"{name} = s_{name}[depth]")
            else:
                raise Unlowerable(f"{what}: instruction {type(op).__name__}")
        if isinstance(term, GotoOp):
            self.goto(term.target, ind, path)
        elif isinstance(term, BranchOp):
            cond = self.value_of(term.cond)
            if not isinstance(cond, Scalar):
                raise Unlowerable(f"block {block.name!r}: branches on a tuple")
            self.emit(ind, f"if {cond.src}:")
            self.goto(term.true_target, ind + "    ", path)
            self.emit(ind, "else:")
            self.goto(term.false_target, ind + "    ", path)
        elif isinstance(term, PushGotoOp):
            if pc_full:
                self.emit(ind, f"pcs[depth] = {self.index[term.return_target]}")
                self.emit(ind, "depth += 1")
            self.wanted.add(self.index[term.return_target])
            # the callee's entry by dispatch, not inline: inlining it here
            # doubled fib's compile time for no measurable run-time gain
            self.emit(ind, f"pc = {self.index[term.target]}")
            self.wanted.add(self.index[term.target])
        elif isinstance(term, IndirectGotoOp):
            if pc_full:
                self.emit(ind, "depth -= 1")
                self.emit(ind, "pc = pcs[depth]")
            else:
                self.emit(ind, f"pc = {self.halt}")
        else:
            raise Unlowerable(f"block {block.name!r}: terminator {type(term).__name__}")

    def source(self) -> KernelPlan:
        """The kernel: stacks, then per lane its locals, inputs, the
        dispatch loop over the blocks some code jumps to, its outputs."""
        lowered = self.lowered
        ins = [n for v in lowered.inputs for n in self.names[v]]
        outs = self.names[lowered.output]
        in_args = [f"in_{j}" for j in range(len(ins))]
        out_args = [f"out_{j}" for j in range(len(outs))]
        full = [v for v in sorted(lowered.var_types)
                if lowered.var_alloc[v] == VariableAllocation.FULL]
        body: List[str] = []
        ind = " " * 12
        self.wanted = {self.index[lowered.entry]}
        done: set = set()
        while self.wanted - done:
            k = min(self.wanted - done)
            done.add(k)
            self.lines = []
            self.block(k, ind + "    ", frozenset({k}))
            body.append(f"{ind}{'if' if len(done) == 1 else 'elif'} pc == {k}:")
            body.extend(self.lines)
        head = [
            "# Generated by autobatch.native_codegen: one thread's program per lane.",
            "import numba",
            "import numpy as np",
            "",
            "",
            "@numba.njit(cache=True, error_model='numpy', nogil=True)",
            f"def kernel({', '.join(in_args + out_args + ['status', 'max_depth'])}):",
        ]
        # Stacks are made once and reused by every lane: a lane reads a frame
        # only after writing it (a pop follows its push at the same depth).
        for var in full:
            for name, kind in zip(self.names[var], self.kinds[var]):
                head.append(f"    s_{name} = np.zeros(max_depth + 1, {_NUMBA_TYPE[kind]})")
        if lowered.pc_alloc == VariableAllocation.FULL:
            head.append("    pcs = np.empty(max_depth + 1, np.int32)")
            head.append(f"    pcs[0] = {self.halt}")
        head.append("    for lane in range(status.shape[0]):")
        for var in sorted(lowered.var_types):
            for name, kind in zip(self.names[var], self.kinds[var]):
                head.append(f"        {name} = {_ZERO[kind]}")
        head.append("        depth = 1")
        for name, arg in zip(ins, in_args):
            head.append(f"        {name} = {arg}[lane]")
        head.append(f"        pc = {self.index[lowered.entry]}")
        head.append("        while True:")
        head.append(f"            if pc == {self.halt}:")
        head.append("                break")
        tail = ["        if status[lane] == 0:"]
        for name, arg in zip(outs, out_args):
            tail.append(f"            {arg}[lane] = {name}")
        text = "\n".join(head + body + tail) + "\n"
        dtype = {"b": np.dtype(np.bool_), "i": np.dtype(np.int64), "f": np.dtype(np.float64)}
        return KernelPlan(text, [dtype[k] for v in lowered.inputs for k in self.kinds[v]],
                          [dtype[k] for k in self.kinds[lowered.output]], self.callees)


def _shape(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_shape(v) for v in value)
    return "scalar"


def kernel_source(lowered: LoweredProgram) -> KernelPlan:
    """The kernel for ``lowered`` (see the module doc); raises
    :class:`~autobatch.native_expr.Unlowerable` naming what does not lower."""
    return _Generator(lowered).source()

