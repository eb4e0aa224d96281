"""Paddle's communication ops, as facts memopt's planners can use.

Programs built by ``paddle.distributed.fleet`` (data parallel, sharding,
gradient merge, pipeline and tensor parallel) and by auto-parallel contain
communication ops.  On a GPU most of them run on a communication stream of
their own: the op returns to the executor while the transfer still reads or
writes its buffers, and a later ``c_sync_comm_stream`` / ``c_wait_comm`` (or
the executor's stream events) waits for it.  A buffer such an op touches must
therefore not be given to another variable, written in place by a later op,
or released while the transfer can be in flight.

What memopt treats as asynchronous (:data:`ASYNC_COMM_OPS`): every
collective and point-to-point op below, in both IRs (legacy type ``all_reduce``
or ``c_allreduce_sum``; PIR ``pd_op.all_reduce`` / ``pd_op.all_reduce_``),
and auto-parallel's ``dist_op.reshard`` (a program before Paddle's reshard
pass; the pass replaces it with ``pd_op.all_reduce`` / ``all_gather`` /
``reduce_scatter`` / ``p_send`` / ``p_recv``...).
Until which point: **the end of the step**.  A matching
``c_sync_comm_stream`` (same ``ring_id``) would be enough on a GPU, but
Paddle's executors also order comm ops by stream events that the program text
does not show, so memopt holds every buffer a communication op reads or writes
(and the sync and ``depend`` ops that name it) for the whole step: such a
variable is never renamed, never takes or gives memory, is never written in
place by a rewritten op and is never released.  ``coalesce_tensor`` makes its
``Output`` tensors views of one ``FusedOutput`` buffer: all of them are held
the same way.

The facts are attached to the neutral graph as the op fact
``OpFacts.in_flight`` (a tuple of names), read by the core's candidate rules
(:func:`memopt.candidates.classify`) and by the PIR in-place planner.

This module imports Paddle nowhere; it reads op type names.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Tuple

from ..candidates import in_flight_names  # noqa: F401  (re-exported: the rule lives in the core)
from ..graph import Graph, Op

__all__ = [
    "ASYNC_COMM_OPS",
    "SYNC_OPS",
    "ALIASING_OPS",
    "base_type",
    "is_communication",
    "mark_in_flight",
    "in_flight_names",
    "communication_ops",
]

#: Collective and point-to-point ops (type names without ``pd_op.`` and
#: without the in-place ``_`` suffix).  On a GPU they run on a communication
#: stream unless ``use_calc_stream`` is set; memopt holds their buffers until
#: the end of the step either way.
ASYNC_COMM_OPS = frozenset({
    # all-reduce
    "c_allreduce_sum", "c_allreduce_max", "c_allreduce_min", "c_allreduce_prod",
    "c_allreduce_avg", "all_reduce", "mp_allreduce_sum",
    # broadcast / reduce / scatter
    "c_broadcast", "broadcast", "c_reduce_sum", "c_reduce_max", "c_reduce_min",
    "c_reduce_prod", "c_reduce_avg", "reduce", "c_scatter", "scatter_comm",
    # gather / reduce-scatter / all-to-all
    "c_allgather", "all_gather", "c_reducescatter", "reduce_scatter",
    "alltoall", "all_to_all", "global_scatter", "global_gather",
    "partial_allgather", "c_concat",
    # point to point (pipeline parallel)
    "send_v2", "recv_v2", "p_send", "p_recv", "partial_send", "partial_recv",
    "send", "recv", "barrier",
    # tensor parallel identity (its backward all-reduces; legacy c_identity
    # runs on the communication stream)
    "c_identity",
    # auto-parallel (paddle.distributed.to_static): ``dist_op.reshard``
    # before the reshard pass turns it into the collectives above
    # (all_reduce, all_gather, reduce_scatter, p_send/p_recv...);
    # ``pd_op.reshard`` / ``pd_op.reshard_v2`` (registered; not seen in the
    # programs built here)
    "reshard", "reshard_v2",
})

#: Ops that wait for a stream; they name the buffers they wait for.
SYNC_OPS = frozenset({
    "c_sync_comm_stream", "c_sync_calc_stream", "c_wait_comm", "c_wait_compute",
    "sync_comm_stream", "sync_calc_stream",
})

#: Ops whose outputs are views of one buffer (fused gradients) or which only
#: order two tensors (``depend``: Out is X).
ALIASING_OPS = frozenset({"coalesce_tensor", "depend",
                          # auto-parallel: a dist tensor's local part and back
                          # (one buffer), a MoE mesh's sub-mesh views
                          "dtensor_from_local", "dtensor_to_local",
                          "moe_global_mesh_tensor", "moe_sub_mesh_tensors"})


def base_type(op_type: str) -> str:
    """``pd_op.all_reduce_`` -> ``all_reduce``, ``dist_op.reshard`` ->
    ``reshard``; legacy names unchanged (``c_allreduce_sum``)."""
    name = op_type.split(".", 1)[1] if op_type.startswith(("pd_op.", "dist_op.")) \
        else op_type
    if name.endswith("_") and name[:-1] in ASYNC_COMM_OPS | SYNC_OPS | ALIASING_OPS:
        name = name[:-1]
    return name


def is_communication(op_type: str) -> bool:
    """True for a collective, point-to-point, stream-sync or aliasing op."""
    return base_type(op_type) in ASYNC_COMM_OPS | SYNC_OPS | ALIASING_OPS


def _touched(op: Op) -> Tuple[str, ...]:
    return tuple(dict.fromkeys((*op.reads, *op.writes)))


def mark_in_flight(graph: Graph) -> Graph:
    """Set ``facts.in_flight`` on every communication op of ``graph``.

    Every name a collective, point-to-point, sync or aliasing op reads or
    writes is in flight until the end of the step (see the module
    docstring).  Idempotent; returns ``graph``.
    """
    for block in graph.blocks:
        for op in block.ops:
            if is_communication(op.type):
                op.facts = dataclasses.replace(op.facts, in_flight=_touched(op))
    return graph


def communication_ops(graph: Graph) -> dict:
    """Counts of the communication ops of ``graph`` by base type (sorted)."""
    counts: dict = {}
    for block in graph.blocks:
        for op in block.ops:
            if is_communication(op.type):
                key = base_type(op.type)
                counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def names_of(graph: Graph, kinds: Iterable[str]) -> frozenset:
    """Names read or written by ops of the given base types."""
    kinds = frozenset(kinds)
    return frozenset(name for block in graph.blocks for op in block.ops
                     if base_type(op.type) in kinds for name in _touched(op))
