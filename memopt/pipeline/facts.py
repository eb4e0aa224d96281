"""A Paddle program's persistable bytes, step peak and communication ops, as
:class:`memopt.parallel.ProgramFacts` for :func:`memopt.estimate`.

Parameters and optimizer state are read from the program's persistable
variables, the step's gradients and activations from its analysis at the
micro-batch, whether the program is already one rank's program from its
communication ops (:mod:`memopt.paddle.distributed`); :mod:`memopt.parallel`
does the arithmetic."""
from __future__ import annotations

from typing import Iterable

from ..graph import unversioned
from ..paddle import distributed, sharding
from ..paddle import runtime as paddle_runtime
from ..parallel import ProgramFacts
from .analysis import analyze_program


_OTHER_MARKS = ("@GRAD", "GradientMerge", "@MERGED", "@BroadCast", "learning_rate",
                "_step_counter_", "@GradMergeCond")


def _parameter_names(program) -> set:
    try:
        return {p.name for p in program.global_block().all_parameters()}
    except Exception:  # pragma: no cover - a program without the API
        return set()


def _parameter_order(program) -> list:
    """Parameter names in the program's order (legacy: creation order, the
    order ``append_backward`` pairs them with gradients); [] when unknown."""
    try:
        return [p.name for p in program.global_block().all_parameters()]
    except Exception:
        return []


def _first_reads(program) -> list:
    """Variable names in the order a legacy program's ops first read them
    ([] for other programs)."""
    try:
        return [n for op in program.global_block().ops for n in op.input_arg_names]
    except Exception:
        return []


def program_facts(program, *, fetch_list: Iterable = (), runtime=None,
                  analysis=None, is_view: bool = False) -> ProgramFacts:
    """:class:`ProgramFacts` of a Paddle program (PIR or legacy).

    A persistable variable is a parameter when the program lists it as one;
    gradient-merge accumulators, the learning rate and step counters are
    "other"; every remaining persistable variable is optimizer state.
    """
    if analysis is None:
        analysis = analyze_program(program, fetch_list=fetch_list, runtime=runtime)
    params = _parameter_names(program)
    # a program read back from a file lists no Parameters: a persistable
    # variable with a gradient is one
    declared = {unversioned(var.name) for _, var in analysis.graph.all_vars()}
    params |= {name[:-len("@GRAD")] for name in declared if name.endswith("@GRAD")}
    sizes = {"parameters": 0, "optimizer": 0, "other": 0}
    seen = set()
    for _, var in analysis.graph.all_vars():
        name = unversioned(var.name)  # name#k: a later version, one buffer
        if not var.persistable or name in seen:
            continue
        seen.add(name)
        nbytes = var.size.at(1)
        if name in params:
            sizes["parameters"] += nbytes
        elif any(mark in name for mark in _OTHER_MARKS) or var.size.power > 0:
            # (growing with the batch: no optimizer state, but an inference
            # program's output, which PIR's fetch op makes persistable)
            sizes["other"] += nbytes
        else:
            sizes["optimizer"] += nbytes
    # float parameters: their gradients have the same bytes
    gradient_bytes = sizes["parameters"]

    def step_peak(b: int) -> tuple:
        out = analysis.breakdown(batch_size=b)
        grads = out.get("gradient", 0)
        rest = sum(v for k, v in out.items() if k not in ("gradient", "parameter"))
        return grads, rest

    def boundary(b: int) -> int:
        # the largest activation that grows with the batch (a stage's output;
        # fixed-size holders such as reshaped weights never cross a stage)
        acts = [h.bytes(b) for h in analysis.holders
                if h.category == "activation" and h.size.power >= 1]
        return max(acts, default=0)

    comm = distributed.communication_ops(analysis.graph)
    # parameters in the program's order with their bytes, and each one's
    # optimizer state: what fleet's sharding assigns to owners
    size_of: dict = {}
    for _, var in analysis.graph.all_vars():
        name = unversioned(var.name)
        if var.persistable and name not in size_of:
            size_of[name] = var.size.at(1)
    # fleet pairs parameters with gradients in creation order; the order the
    # ops first read them is that order for a program built in this process
    # and for one read back from a file (whose variables come sorted by name)
    order = [n for n in dict.fromkeys(_first_reads(program)) if n in params and n in size_of]
    order += [n for n in _parameter_order(program) if n in size_of and n not in order]
    state_of: dict = {}
    for name, nbytes in size_of.items():
        if name in params or any(mark in name for mark in _OTHER_MARKS):
            continue
        owner = sharding.state_owner(name, order)
        if owner:
            state_of[owner] = state_of.get(owner, 0) + nbytes
    rank_view = None
    if not comm and not is_view and paddle_runtime.is_program(program) == "legacy":
        def rank_view(owned):
            view = sharding.rank_view(program, owned, order)
            return program_facts(view, fetch_list=fetch_list, runtime=runtime, is_view=True)
    return ProgramFacts(parameters=sizes["parameters"], optimizer_state=sizes["optimizer"],
                        other_persistable=sizes["other"], gradient_bytes=gradient_bytes,
                        step_peak=step_peak, boundary=boundary,
                        distributed=bool(comm), communication_ops=comm,
                        param_order=tuple((n, size_of[n]) for n in order),
                        state_of=state_of, rank_view=rank_view, analysis=analysis)
