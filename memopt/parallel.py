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
    optimizer    = O / M                  (sharding stage >= 1: O_r / M, the
                   state of the parameters rank r owns by fleet's rule,
                   :func:`fleet_sharding_owners`; every rank reported)
    grad. merge  = 2 * G / M  if gradient_merge_steps > 1 (/ dp with stage >= 2):
                   the persistable accumulators, and the update step's
                   fresh zeroed accumulators (fleet's update runs in a
                   ``conditional_block``; its ``fill_constant`` ops make new
                   buffers there, measured: one more G in the update step)
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

Sharding stage 1 of a legacy program: each rank's gradients and the rest
come from the analysis of that rank's program as fleet's sharding writes it
(``ProgramFacts.rank_view``: the parameters others own become temporaries
broadcast each step, which the executor treats differently, e.g. a
``reshape`` of one is not a copy).

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
from typing import Any, Callable, Dict, List, Optional, Tuple

from .report import format_bytes

__all__ = ["Strategy", "ProgramFacts", "RankEstimate", "estimate_rank", "fleet_sharding_owners"]


def fleet_sharding_owners(sizes, ranks: int) -> List[int]:
    """The rank that owns each parameter under fleet's static sharding.

    ``sizes`` are the parameters' bytes in the program's parameter order.
    Paddle 3.3.1's rule (``fleet/meta_optimizers/sharding/shard.py``,
    ``Shard._split_params``): walk the parameters in order, accumulating
    their sizes; move to the next rank when the bytes already assigned
    exceed ``total * (rank + 1) / ranks``.  Whole parameters, so the ranks'
    shares differ (the bench MLP: 1.50 MiB of parameters on rank 0, 1.01 MiB
    on rank 1).
    """
    total = float(sum(sizes))
    owners, rank, accumulated = [], 0, 0.0
    for size in sizes:
        if accumulated > total * (rank + 1) / ranks:
            rank += 1
        owners.append(rank)
        accumulated += size
    return owners



@dataclass(frozen=True)
class Strategy:
    """A parallel strategy.

    Attributes
    ----------
    dp, tp, pp : int
        Data, tensor and pipeline parallel degrees (>= 1); the number of
        ranks is ``dp * tp * pp``.
    sharding_stage : int
        0 (none), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters),
        across the ``dp`` ranks.
    micro_batch_size : int or None
        Samples one rank runs at once; None: ``batch_size / (dp *
        gradient_merge_steps)``.
    recompute : bool
        Recompute activations in the backward pass, in
        ``recompute_segments`` segments (>= 1).
    gradient_merge_steps : int
        Micro-steps whose gradients are summed before one update (>= 1).
    fused_gradients : bool
        Gradients live in one fused buffer for the step (fleet's
        ``fuse_all_reduce_ops``).
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
    #: ``((parameter name, bytes), ...)`` in the program's parameter order
    #: (the order fleet's sharding assigns owners in); empty when unknown.
    param_order: Tuple[Tuple[str, int], ...] = ()
    #: parameter name -> bytes of its optimizer state (velocity, moments).
    state_of: Dict[str, int] = field(default_factory=dict)
    #: ``owned -> ProgramFacts`` of the program as fleet's sharding rewrites
    #: it for the rank owning ``owned`` (the other parameters become
    #: temporaries broadcast each step); None when the adapter cannot build it.
    rank_view: Optional[Callable[[frozenset], "ProgramFacts"]] = None
    #: the :class:`memopt.analysis.Analysis` these facts were read from (the
    #: memory page draws it); None when made by hand.
    analysis: Any = field(default=None, repr=False, compare=False)


@dataclass
class RankEstimate:
    """One rank's predicted peak, by component (bytes)."""

    strategy: Strategy
    batch_size: int
    micro_batch_size: int
    components: Dict[str, int]
    formula: Dict[str, str]
    distributed_program: bool = False
    #: each rank's total when ranks differ (sharding: owners of whole
    #: parameters); empty when every rank is the same.
    per_rank: List[int] = field(default_factory=list)
    #: ``[(label, Analysis)]``: the step each rank runs (its own program under
    #: fleet's static sharding, else the one-device program), for
    #: :meth:`to_html`; one entry when every rank runs the same.
    rank_analyses: List = field(default_factory=list, repr=False, compare=False)

    @property
    def total(self) -> int:
        return sum(self.components.values())

    def to_json(self) -> dict:
        return {"strategy": asdict(self.strategy), "batch_size": self.batch_size,
                "micro_batch_size": self.micro_batch_size,
                "distributed_program": self.distributed_program,
                "components": dict(self.components), "formula": dict(self.formula),
                "peak_per_rank": self.total, "per_rank": list(self.per_rank)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def to_html(self, path: str, title: str = "") -> str:
        """Write the memory page of the estimate to ``path``: one lane per
        rank (one for all when every rank runs the same step), each the live
        bytes of the step that rank runs, at the micro-batch, by kind over
        its op sequence; the estimate's components (what the strategy
        divides, the communication buffers) head the page.  The lanes draw
        the program's own analysis: tensor and pipeline parallel division
        is arithmetic on it (:attr:`formula`), not drawn.  Returns ``path``.

        Raises ValueError when the estimate holds no analysis (made from
        :class:`ProgramFacts` built by hand)."""
        if not self.rank_analyses or any(a is None for _, a in self.rank_analyses):
            raise ValueError("this estimate holds no analysis of the program (its "
                             "ProgramFacts carry none): make it with memopt.estimate(program, ...)")
        from .pages.writer import write_lanes

        totals = self.per_rank or [self.total] * len(self.rank_analyses)
        lanes = [(f"{label}: estimated peak {format_bytes(total)} (all components)",
                  [analysis], [f"{label}, micro-batch {self.micro_batch_size}"])
                 for (label, analysis), total in zip(self.rank_analyses, totals, strict=True)]
        s = self.strategy
        return write_lanes(path, lanes, batch_size=self.micro_batch_size,
                           title=title or f"memory per rank: dp={s.dp}, tp={s.tp}, pp={s.pp}, "
                                          f"sharding stage {s.sharding_stage}, batch "
                                          f"{self.batch_size}",
                           notes=str(self).splitlines()[1:])

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
        if self.per_rank:
            lines.append(f"  {'each rank':<{width}}  " + ", ".join(
                f"{r}: {format_bytes(v)}" for r, v in enumerate(self.per_rank))
                + "  (sharding: owners of whole parameters; the worst rank above)")
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
        every = [("this rank", facts.analysis)]
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
        return RankEstimate(s, batch_size, micro, comps, formula, True, rank_analyses=every)
    model = s.tp * s.pp
    micro_batches = max(1, batch_size // (s.dp * micro))
    in_flight = min(s.pp, micro_batches)
    # a legacy program is sharded by fleet's static sharding, which has no
    # stage setting: stages 2 and 3 build the stage-1 program (measured: the
    # same ops, the same peaks), so only the optimizer state is divided
    fleet_static = facts.rank_view is not None and s.sharding_stage >= 1 and s.dp > 1
    stage = 1 if fleet_static else s.sharding_stage
    div_p = model * (s.dp if stage >= 3 else 1)
    div_o = model * (s.dp if s.sharding_stage >= 1 else 1)
    div_g = model * (s.dp if stage >= 2 else 1)
    factor = in_flight / model
    act_formula = "Aa(b) / (tp*pp)" + (f" * {in_flight} in flight" if in_flight > 1 else "")
    if s.recompute:
        factor *= min(1.0, 2.0 / s.recompute_segments)
        act_formula += f" * min(1, 2/{s.recompute_segments}) (recompute)"
    comm = 0.0
    comm_formula = []
    if s.fused_gradients:
        comm += facts.gradient_bytes / model
        comm_formula.append("G/(tp*pp) fused gradient buffer")
    if s.pp > 1:
        comm += 2 * facts.boundary(micro)
        comm_formula.append("2 * boundary(b) send/recv")

    def components(optimizer: float, grads: float, rest: float,
                   parameters: Optional[float] = None) -> dict:
        comps = {
            "parameters": facts.parameters / div_p if parameters is None else parameters,
            "optimizer state": optimizer,
            "other persistable": facts.other_persistable / model,
            "gradient merge": 2 * facts.gradient_bytes / div_g
            if s.gradient_merge_steps > 1 else 0,
            "gradients": grads / div_g,
            "activations": max(0.0, rest) * factor,
            "communication buffers": comm,
        }
        return {k: int(round(v)) for k, v in comps.items()}

    formula = {
        "parameters": "P / (tp*pp)" + (" / dp (stage 3)" if stage >= 3 else ""),
        "optimizer state": "O / (tp*pp)" + (" / dp (sharded)" if s.sharding_stage >= 1 else ""),
        "other persistable": "/ (tp*pp)",
        "gradient merge": ("2 * G / (tp*pp)" + (" / dp" if stage >= 2 else "")
                           + " (accumulators + the update's zeroed copies)")
        if s.gradient_merge_steps > 1 else "0 (no gradient merge)",
        "gradients": "Ag(b) / (tp*pp)" + (" / dp (stage >= 2)" if stage >= 2 else ""),
        "activations": act_formula,
        "communication buffers": " + ".join(comm_formula) or "0 (in-place collectives)",
    }
    if not (s.sharding_stage >= 1 and s.dp > 1 and facts.param_order):
        comps = components(facts.optimizer_state / div_o, grads_at_peak, rest_at_peak)
        label = "every rank" if s.ranks > 1 else "the rank"
        return RankEstimate(s, batch_size, micro, comps, formula, False,
                            rank_analyses=[(label, facts.analysis)])
    # Sharding as fleet does it: whole parameters to owners
    # (fleet_sharding_owners); a rank keeps the optimizer state of the
    # parameters it owns (state no parameter claims: on every rank), and
    # receives the others each step into temporaries (rank_view: what fleet's
    # static sharding builds for a legacy program and the bench runs; the
    # executor treats them as temporaries, e.g. may alias them in place).
    # Without a rank view (PIR programs), the arithmetic above with the
    # owners' optimizer state.
    names = [name for name, _ in facts.param_order]
    owners = fleet_sharding_owners([size for _, size in facts.param_order], s.dp)
    unclaimed = facts.optimizer_state - sum(facts.state_of.get(n, 0) for n in names)
    per_rank, best, analyses = [], None, []
    for rank in range(s.dp):
        owned = frozenset(n for n, o in zip(names, owners) if o == rank)
        state = unclaimed + sum(facts.state_of.get(n, 0) for n in owned)
        grads, rest, params = grads_at_peak, rest_at_peak, None
        analysis = facts.analysis
        if fleet_static:
            view = facts.rank_view(owned)
            grads, rest = view.step_peak(micro)
            analysis = view.analysis
            # the parameters it owns persist; the others are temporaries
            # there, in ``rest`` while they are live (with the GC on, not
            # after their last use)
            params = sum(size for n, size in facts.param_order if n in owned) / model
        analyses.append((f"rank {rank}", analysis))
        comps = components(state / model, grads, rest, params)
        total = sum(comps.values())
        per_rank.append(total)
        if best is None or total > sum(best.values()):
            best = comps
    formula["optimizer state"] = ("O_r / (tp*pp): the state of the parameters rank r owns "
                                  "(fleet's rule: whole parameters, in order)")
    if fleet_static:
        formula["parameters"] = "P_r / (tp*pp): the parameters rank r owns"
        if s.sharding_stage > 1:
            formula["gradients"] = (f"Ag(b) / (tp*pp): fleet's static sharding has no stage "
                                    f"{s.sharding_stage}, it builds stage 1")
        formula["activations"] += (" (rank r's program: with the parameters others own, "
                                   "broadcast into temporaries, while live)")
    return RankEstimate(s, batch_size, micro, best, formula, False, per_rank,
                        rank_analyses=analyses)
