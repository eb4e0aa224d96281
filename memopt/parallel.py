"""Per-rank peak memory of a training program under a parallel strategy.

Core arithmetic only (no Paddle): the API (:func:`memopt.api.estimate`)
fills :class:`ProgramFacts` from a program and :func:`memopt.analyze`, and
this module answers "will this strategy fit, per rank?" before anything is
launched.

The model (all figures bytes, per rank; ``P`` parameters, ``O`` optimizer
state, ``G`` gradients, as in the one-device program; ``M = tp * pp`` the
model-parallel split; ``b`` the micro-batch; ``A(b)`` the one-device step's
non-persistable peak, split at the peak into gradients ``Ag(b)`` and the rest
``Aa(b)`` -- activations, inputs, temporaries -- by :func:`memopt.analyze`)::

    parameters   = P / M                  (/ dp with sharding stage 3)
    optimizer    = O / M                  (/ dp with sharding stage >= 1)
    grad. merge  = G / M  if gradient_merge_steps > 1 (/ dp with stage >= 2):
                   the persistable accumulators
    gradients    = Ag(b) / M              (/ dp with stage >= 2)
    activations  = Aa(b) / M * in_flight, in_flight = min(pp, micro-batches)
                   (1F1B: the first stage holds that many micro-batches);
                   with recompute, Aa(b) / M * (2 / segments) * in_flight
                   (the segment boundaries kept plus one segment recomputed)
    comm buffers = G / M  when gradients are fused into one buffer
                   (fused all-reduce: the fused buffer lives the whole step),
                 + 2 * boundary(b)  with pp > 1 (one send and one receive
                   buffer of the stage-boundary activation),
                 + 0 for in-place all-reduce / reduce / broadcast of
                   gradients (what fleet's data parallel and sharding do).

``micro-batches = batch_size / (dp * micro_batch_size)``;
``micro_batch_size`` defaults to ``batch_size / (dp * gradient_merge_steps)``.

When the program is already one rank's program (it contains communication
ops: fleet or auto-parallel already rewrote it), nothing is divided again:
the estimate is the program's own analysis at the micro-batch.

Only data parallel (with or without memopt's rewrites, sharding and gradient
merge) can run on this CPU machine; the tensor- and pipeline-parallel terms
are the formula above, checked on paper (README).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Optional

from .report import format_bytes

__all__ = ["Strategy", "ProgramFacts", "RankEstimate", "estimate_rank"]


@dataclass(frozen=True)
class Strategy:
    """A parallel strategy.

    dp, tp, pp : data, tensor and pipeline parallel degrees (>= 1); the
        number of ranks is ``dp * tp * pp``.
    sharding_stage : 0 (none), 1 (optimizer state), 2 (+ gradients),
        3 (+ parameters), across the ``dp`` ranks.
    micro_batch_size : samples one rank runs at once; None: ``batch_size /
        (dp * gradient_merge_steps)``.
    recompute : recompute activations in the backward pass;
        ``recompute_segments`` segments (>= 1).
    gradient_merge_steps : micro-steps whose gradients are summed before
        one update (>= 1).
    fused_gradients : gradients live in one fused buffer for the step
        (fleet's ``fuse_all_reduce_ops``).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sharding_stage: int = 0
    micro_batch_size: Optional[int] = None
    recompute: bool = False
    recompute_segments: int = 4
    gradient_merge_steps: int = 1
    fused_gradients: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "gradient_merge_steps", "recompute_segments"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Strategy.{name} must be an integer >= 1, got {value!r}")
        if self.sharding_stage not in (0, 1, 2, 3):
            raise ValueError(f"Strategy.sharding_stage must be 0, 1, 2 or 3, "
                             f"got {self.sharding_stage!r}")
        if self.micro_batch_size is not None and (
                not isinstance(self.micro_batch_size, int) or self.micro_batch_size < 1):
            raise ValueError(f"Strategy.micro_batch_size must be None or an integer >= 1, "
                             f"got {self.micro_batch_size!r}")

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    def micro_batch(self, batch_size: int) -> int:
        """The micro-batch for a global ``batch_size`` (ValueError if it
        does not divide)."""
        if self.micro_batch_size is not None:
            if batch_size % (self.dp * self.micro_batch_size):
                raise ValueError(f"batch_size {batch_size} is not a multiple of dp * "
                                 f"micro_batch_size = {self.dp * self.micro_batch_size}")
            return self.micro_batch_size
        split = self.dp * self.gradient_merge_steps
        if batch_size % split:
            raise ValueError(f"batch_size {batch_size} is not a multiple of dp * "
                             f"gradient_merge_steps = {split}")
        return batch_size // split


@dataclass
class ProgramFacts:
    """What the estimate needs to know about the one-device program.

    parameters, optimizer_state, other_persistable : bytes.
    gradient_bytes : bytes of all parameter gradients (= parameters for
        float32 training).
    step_peak : ``b -> (gradients at the peak, everything else at the
        peak)``, non-persistable bytes of one step at batch ``b``.
    boundary : ``b -> bytes`` of the activation crossing a pipeline stage
        boundary (the largest forward activation by default).
    distributed : the program is already one rank's program.
    """

    parameters: int
    optimizer_state: int
    other_persistable: int
    gradient_bytes: int
    step_peak: Callable[[int], tuple]
    boundary: Callable[[int], int] = lambda b: 0
    distributed: bool = False
    communication_ops: Dict[str, int] = field(default_factory=dict)


@dataclass
class RankEstimate:
    """One rank's predicted peak, by component (bytes)."""

    strategy: Strategy
    batch_size: int
    micro_batch_size: int
    components: Dict[str, int]
    formula: Dict[str, str]
    distributed_program: bool = False

    @property
    def total(self) -> int:
        return sum(self.components.values())

    def to_json(self) -> dict:
        return {"strategy": asdict(self.strategy), "batch_size": self.batch_size,
                "micro_batch_size": self.micro_batch_size,
                "distributed_program": self.distributed_program,
                "components": dict(self.components), "formula": dict(self.formula),
                "peak_per_rank": self.total}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def __str__(self) -> str:
        s = self.strategy
        lines = [f"memopt estimate: {s.ranks} rank(s) (dp={s.dp}, tp={s.tp}, pp={s.pp}, "
                 f"sharding stage {s.sharding_stage}, gradient merge {s.gradient_merge_steps}, "
                 f"recompute {'on' if s.recompute else 'off'}), batch {self.batch_size}, "
                 f"micro-batch {self.micro_batch_size}"]
        if self.distributed_program:
            lines.append("  the program is already one rank's program: nothing divided")
        width = max(len(k) for k in self.components)
        for key, value in self.components.items():
            lines.append(f"  {key:<{width}}  {format_bytes(value):>11}   {self.formula[key]}")
        lines.append(f"  {'peak per rank':<{width}}  {format_bytes(self.total):>11}")
        return "\n".join(lines)


def estimate_rank(facts: ProgramFacts, strategy: Strategy, batch_size: int) -> RankEstimate:
    """Each rank's peak for ``facts`` under ``strategy`` at global ``batch_size``
    (the worst rank: pipeline stage 0); see the module docstring."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    s = strategy
    micro = s.micro_batch(batch_size)
    grads_at_peak, rest_at_peak = facts.step_peak(micro)
    if facts.distributed:
        comps = {"parameters": facts.parameters, "optimizer state": facts.optimizer_state,
                 "other persistable": facts.other_persistable,
                 "gradients": grads_at_peak, "activations": rest_at_peak,
                 "communication buffers": 0}
        formula = {"parameters": "P (this rank's program)",
                   "optimizer state": "O (this rank's program)",
                   "other persistable": "persistable, neither (accumulators, counters)",
                   "gradients": "Ag(b) (analyze, this rank's program)",
                   "activations": "Aa(b) (analyze, this rank's program)",
                   "communication buffers": "0 (in-place collectives)"}
        return RankEstimate(s, batch_size, micro, comps, formula, True)
    model = s.tp * s.pp
    micro_batches = max(1, batch_size // (s.dp * micro))
    in_flight = min(s.pp, micro_batches)
    div_p = model * (s.dp if s.sharding_stage >= 3 else 1)
    div_o = model * (s.dp if s.sharding_stage >= 1 else 1)
    div_g = model * (s.dp if s.sharding_stage >= 2 else 1)
    act = rest_at_peak / model * in_flight
    act_formula = "Aa(b) / (tp*pp)" + (f" * {in_flight} in flight" if in_flight > 1 else "")
    if s.recompute:
        act *= min(1.0, 2.0 / s.recompute_segments)
        act_formula += f" * min(1, 2/{s.recompute_segments}) (recompute)"
    comm = 0.0
    comm_formula = []
    if s.fused_gradients:
        comm += facts.gradient_bytes / model
        comm_formula.append("G/(tp*pp) fused gradient buffer")
    if s.pp > 1:
        comm += 2 * facts.boundary(micro)
        comm_formula.append("2 * boundary(b) send/recv")
    comps = {
        "parameters": facts.parameters / div_p,
        "optimizer state": facts.optimizer_state / div_o,
        "other persistable": facts.other_persistable / model,
        "gradient merge": facts.gradient_bytes / div_g if s.gradient_merge_steps > 1 else 0,
        "gradients": grads_at_peak / div_g,
        "activations": act,
        "communication buffers": comm,
    }
    comps = {k: int(round(v)) for k, v in comps.items()}
    formula = {
        "parameters": "P / (tp*pp)" + (" / dp (stage 3)" if s.sharding_stage >= 3 else ""),
        "optimizer state": "O / (tp*pp)" + (" / dp (sharded)" if s.sharding_stage >= 1 else ""),
        "other persistable": "/ (tp*pp)",
        "gradient merge": ("G / (tp*pp)" + (" / dp" if s.sharding_stage >= 2 else ""))
        if s.gradient_merge_steps > 1 else "0 (no gradient merge)",
        "gradients": "Ag(b) / (tp*pp)" + (" / dp (stage >= 2)" if s.sharding_stage >= 2 else ""),
        "activations": act_formula,
        "communication buffers": " + ".join(comm_formula) or "0 (in-place collectives)",
    }
    return RankEstimate(s, batch_size, micro, comps, formula, False)
