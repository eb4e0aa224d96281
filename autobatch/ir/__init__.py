"""The instruction language of autobatch (the IR its passes and executors share).

Users (and TFP code) import it as :mod:`autobatch.instructions`, which adds
TFP's one-example :func:`~autobatch.instructions.interpret`; the passes
import this package, below the interpreters, so that nothing imports in a
circle.  One module per job:

- :mod:`~autobatch.ir.patterns`: variable-name patterns and the values they bind;
- :mod:`~autobatch.ir.types`: TensorType, Type, VariableAllocation;
- :mod:`~autobatch.ir.ops`: instructions and terminators;
- :mod:`~autobatch.ir.graph`: Block, Function, ControlFlowGraph;
- :mod:`~autobatch.ir.program`: Program, TFP's Module, the call graph;
- :mod:`~autobatch.ir.lowered_by_hand`: programs written with TFP's explicit stacks;
- :mod:`~autobatch.ir.text`, :mod:`~autobatch.ir.tfp_text`: how they print
  (autobatch's text; TFP's text);
- :mod:`~autobatch.ir.flow`: flow facts (liveness) the passes share.

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

from autobatch.ir.flow import (
    FunctionFlow,
    check_defined,
    drop_repushes,
    function_flow,
)
from autobatch.ir.graph import (
    Block,
    ControlFlowGraph,
    Function,
    extract_referenced_variables,
)
from autobatch.ir.lowered_by_hand import HandLowered, is_hand_lowered
from autobatch.ir.ops import (
    PC_VAR,
    BranchOp,
    BroadcastOutputs,
    CopyOp,
    FunctionCallOp,
    GotoOp,
    IndirectGotoOp,
    Instruction,
    PopOp,
    PrimOp,
    PushGotoOp,
    PushOp,
    ReturnOp,
    Terminator,
    broadcast_leaf,
    broadcast_op,
    describe_function,
    halt,
    halt_op,
    is_return_op,
    pc_var,
    pop_op,
    prim_op,
    push_op,
)
from autobatch.ir.patterns import (
    Pattern,
    as_pattern,
    bind_pattern,
    format_pattern,
    is_namedtuple,
    pattern_flatten,
    pattern_leaves,
    pattern_map,
    pattern_map2,
    pattern_traverse,
    pattern_unflatten,
    pattern_zip,
    rebuild,
    tuple_expr,
)
from autobatch.ir.program import Module, Program, call_graph, reachable
from autobatch.ir.tfp_text import tfp_op_text, tfp_program_text
from autobatch.ir.types import (
    TensorType,
    Type,
    VariableAllocation,
    numpy_type_of,
    single_type,
)

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
