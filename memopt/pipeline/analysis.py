"""The memory analysis of a Paddle program (PIR or legacy), as
:func:`memopt.analyze` gives it for a program."""
from __future__ import annotations

from typing import Optional

from ..analysis import Analysis, RuntimeModel, from_graph
from ..paddle import flags
from ..paddle import runtime as paddle_runtime
from .pir import batch_planner


def analyze_program(program, batch_size: Optional[int] = None, *, fetch_list=(),
                    runtime: Optional[RuntimeModel] = None) -> Analysis:
    """:func:`memopt.analyze` of a PIR or legacy ``program`` (``batch_size``
    already checked): read as its executor runs it under ``runtime``
    (default: Paddle's flags for the program's IR); a PIR program's
    :class:`Analysis` also plans ``max_batch_size(recompute=True)``.
    UnsupportedProgramError for anything else."""
    fetch_list = list(fetch_list or ())
    ir = paddle_runtime.is_program(program)
    rt = runtime or flags.runtime_model(ir or "pir")
    read = paddle_runtime.read_program(program, fetch_list, rt)
    analysis = from_graph(read.graph, batch_size, rt, read.inplace, read.same_variable)
    if ir == "pir":
        analysis.batch_planner = batch_planner(program, fetch_list, rt)
    return analysis
