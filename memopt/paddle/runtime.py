"""A Paddle program as its executor runs it: the graph and the executor's facts.

:func:`read_program` reads a PIR or legacy program into what the core's
:func:`memopt.analysis.from_graph` takes: the :class:`~memopt.graph.Graph`
(a legacy program through Paddle's translation to PIR, which is how Paddle 3
runs it, values named after the legacy variables), the ops the PIR
executor's in-place pass will run in place
(:func:`memopt.paddle.pir.inplace.executor_inplace`, when the runtime model
has it on), and the versions of a legacy variable (``name#k``: one buffer, as
the legacy executor keeps one per variable).

Paddle is imported inside the functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..analysis import RuntimeModel, versions
from ..errors import UnsupportedProgramError
from ..graph import Graph, unversioned
from .pir import program as pir_adapter
from .pir import inplace as pir_inplace

__all__ = ["ExecutedProgram", "read_program", "executed", "is_program"]


@dataclass
class ExecutedProgram:
    """A program read for the analysis: ``graph``; ``inplace`` the
    ``(position, input, output)`` the executor runs in place;
    ``same_variable`` the ``(name, name#k)`` pairs that are one buffer;
    ``ir`` ``"pir"`` or ``"legacy"``; ``pir_graph`` the
    :class:`memopt.paddle.pir.program.PirGraph` read."""

    graph: Graph
    ir: str
    inplace: list = field(default_factory=list)
    same_variable: list = field(default_factory=list)
    pir_graph: Any = None


def is_program(obj: Any) -> str:
    """``"pir"``, ``"legacy"`` or ``""`` (not a Paddle program)."""
    if pir_adapter.is_pir_program(obj):
        return "pir"
    if type(obj).__name__ == "Program":
        return "legacy"
    return ""


def taken_buffers(graph: Graph, inplace: Iterable) -> frozenset:
    """Versions of a persistable legacy variable (``name#k``) that the PIR
    executor writes into a temporary's buffer, not the variable's own.

    Gradient merge accumulates ``acc = elementwise_add(grad, acc)``: the
    translation writes a new value ``acc#1`` with ``pd_op.add_`` over
    ``grad`` (or the executor's in-place pass puts it there); the variable
    then takes that buffer, so the gradient's memory is still allocated after the add
    (measured, Paddle 3.3.1 CPU, GC off: the step holds the accumulators and
    the gradients, 2.51 MiB each for the bench MLP).  Such a version is not
    one buffer with the variable: it stays in the temporary's class.
    """
    persistable = {var.name for _, var in graph.all_vars() if var.persistable}
    pairs = [(src, dst) for _, src, dst in inplace]
    pairs += [pair for _, op in graph.walk_ops() for pair in op.facts.overwrites]
    return frozenset(dst for src, dst in pairs
                     if unversioned(src) not in persistable and unversioned(dst) != dst
                     and unversioned(dst) in persistable)


def executed(pg, runtime: RuntimeModel, fetch_list: Iterable = ()) -> ExecutedProgram:
    """A PIR program already read (a :class:`memopt.paddle.pir.program.PirGraph`) as
    its executor runs it under ``runtime``."""
    inplace = pir_inplace.executor_inplace(pg, list(fetch_list), runtime.device) \
        if runtime.inplace else []
    return ExecutedProgram(pg.graph, "pir", inplace, [], pg)


def read_program(program: Any, fetch_list: Iterable = (),
                 runtime: RuntimeModel = RuntimeModel()) -> ExecutedProgram:
    """Read ``program`` as its executor runs it under ``runtime``.

    Raises
    ------
    UnsupportedProgramError
        Not a Paddle program, or a legacy program Paddle's translator refuses.
    """
    fetch_list = list(fetch_list or ())
    ir = is_program(program)
    if ir == "pir":
        return executed(pir_adapter.convert(program, fetch_list), runtime, fetch_list)
    if ir == "legacy":
        # analysed as its translation to PIR, where a variable written again
        # (memory_optimize's renames) is a new value ``name#k``: the legacy
        # executor keeps one buffer per variable, so the versions are one
        # Paddle's translator refuses some ops: UnsupportedProgramError
        # naming the op (pir_adapter.untranslatable)
        pg = pir_adapter.convert_legacy(program, fetch_list)
        inplace = pir_inplace.executor_inplace(pg, (), runtime.device) if runtime.inplace else []
        taken = taken_buffers(pg.graph, inplace)
        for _, var in pg.graph.all_vars():
            if var.name in taken:
                var.persistable = False  # a temporary's buffer until the step ends
        same = [(a, b) for a, b in versions(pg.graph) if b not in taken]
        return ExecutedProgram(pg.graph, ir, inplace, same, pg)
    raise UnsupportedProgramError(
        f"analyze() takes a Paddle program (PIR or legacy) or a memopt Graph, "
        f"got {type(program).__name__}")
