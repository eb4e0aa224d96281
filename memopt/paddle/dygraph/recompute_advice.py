"""Which sublayers to recompute so that one eager training step fits a budget.

``paddle.distributed.fleet.utils.recompute(layer.forward, *inputs)`` (the
default, ``use_reentrant=True``) runs a sublayer's forward without keeping
what it saves for backward; its backward runs the forward again (same RNG
state) and then its backward.  On the predicted step
(:func:`memopt.paddle.dygraph.eager.analyze_step`) wrapping a sublayer ``L``
changes the buffers ``L`` makes:

- a value made in ``L``, read outside ``L`` in the forward (its output): kept;
- a value made in ``L`` and read only inside ``L`` and by the backward (what
  ``L`` saves): freed after its last reader in ``L``'s forward, made again when
  ``L``'s backward starts (the first backward op that reads a value of ``L``)
  and held to its last backward reader as before;
- a value made and freed inside ``L``'s forward: made again, briefly, when the
  backward re-runs ``L`` (counted at once at that point: an upper bound);
- ``L``'s inputs are held by the recompute until its backward.

:func:`suggest_recompute` chooses, greedily, the sublayer whose wrapping
lowers the predicted peak most per forward op re-run, until the step fits.
Candidates: sublayers called once, whose inputs need a gradient (a
reentrant recompute of a sublayer fed only data would cut its parameters'
gradients), none inside another chosen one.
:meth:`RecomputeAdvice.apply` wraps them in a model and returns a handle
whose ``undo()`` puts every ``forward`` back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ...errors import BudgetError
from .eager import StepAnalysis, analyze_step

__all__ = ["RecomputeAdvice", "Applied", "suggest_recompute", "recomputed", "op_flops"]


@dataclass
class Applied:
    """The sublayers :meth:`RecomputeAdvice.apply` wrapped; ``undo()`` unwraps."""

    model: Any
    wrapped: Dict[str, Any] = field(default_factory=dict)   # path -> (layer, had, old)

    def undo(self) -> None:
        """Put back each wrapped sublayer's ``forward`` as it was."""
        for path in sorted(self.wrapped, reverse=True):
            layer, had, old = self.wrapped[path]
            if had:
                object.__setattr__(layer, "forward", old)
            else:
                layer.__dict__.pop("forward", None)
        self.wrapped.clear()


@dataclass
class RecomputeAdvice:
    """What :func:`suggest_recompute` found.

    Attributes
    ----------
    layers : the sublayer paths to recompute (as ``named_sublayers`` of the
        step's Layer names them), in the order chosen.
    batch_size, budget : what the advice is for (bytes).
    peak_before, peak_after : predicted ``total_peak`` of the step without and
        with the recompute, bytes.
    added_ops, forward_ops : forward ops re-run by the recompute, and all
        forward ops of the step.
    added_flops, step_flops : the floating-point work re-run, and the whole
        step's, taken as three times its forward's (a backward does about
        twice its forward's work) (:func:`op_flops`; ``added_compute`` is
        their ratio).
    analysis : the predicted step with the recompute (a :class:`StepAnalysis`).
    """

    layers: List[str]
    batch_size: int
    budget: int
    peak_before: int
    peak_after: int
    added_ops: int
    forward_ops: int
    analysis: Any = field(default=None, repr=False)
    added_flops: int = 0
    step_flops: int = 0

    @property
    def added_compute(self) -> float:
        """The floating-point work the recompute adds over the whole step's
        (forward, backward and the rest, :func:`op_flops` at ``batch_size``):
        0.2 is a step 20% heavier.  By op count when no op had a size."""
        if self.step_flops:
            return self.added_flops / self.step_flops
        return self.added_ops / self.forward_ops if self.forward_ops else 0.0

    def report(self) -> str:
        from ...report import format_bytes

        lines = [f"recompute {len(self.layers)} sublayer(s) for batch {self.batch_size}, "
                 f"budget {format_bytes(self.budget)}: predicted peak "
                 f"{format_bytes(self.peak_before)} -> {format_bytes(self.peak_after)}, "
                 f"{self.added_ops} of {self.forward_ops} forward ops run again "
                 f"(+{100 * self.added_compute:.0f}% of the step's compute)"]
        lines += [f"  {p}" for p in self.layers]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    def apply(self, model) -> Applied:
        """Wrap each advised sublayer of ``model`` (the step's Layer) in
        ``paddle.distributed.fleet.utils.recompute``; returns an
        :class:`Applied` whose ``undo()`` unwraps them.

        Raises
        ------
        ValueError : ``model`` has no sublayer of an advised path (nothing wrapped).
        """
        from paddle.distributed.fleet.utils import recompute

        layers = dict(model.named_sublayers())
        missing = [p for p in self.layers if p not in layers]
        if missing:
            raise ValueError(f"the model has no sublayer {missing[0]!r}: apply the advice to "
                             "the Layer given to suggest_recompute (the step)")
        applied = Applied(model)
        for path in self.layers:
            layer = layers[path]
            had = "forward" in layer.__dict__
            old = layer.__dict__.get("forward")
            original = layer.forward

            def wrapped(*args, _original=original, **kwargs):
                return recompute(_original, *args, **kwargs)

            object.__setattr__(layer, "forward", wrapped)
            applied.wrapped[path] = (layer, had, old)
        return applied


def _elements(var, batch: int) -> int:
    n = 1
    for d in var.shape:
        n *= batch if d == -1 else max(int(d), 0)
    return n


def op_flops(op, graph, batch: int) -> int:
    """Rough floating-point operations of one op at ``batch``: a matmul
    ``2 * |out| * k`` (``k`` the contracted size, ``|x| / (|out| / n)``), a
    convolution ``2 * |out| * |filter| / C_out``, anything else one per
    output element."""
    outs = [graph.find_var(n) for n in op.writes]
    out = next((v for v in outs if v is not None and v.shape), None)
    if out is None:
        return 0
    n_out = _elements(out, batch)
    ins = [graph.find_var(n) for n in op.reads]
    if op.type in ("pd_op.matmul", "pd_op.fused_gemm_epilogue") and len(ins) >= 2 \
            and ins[0] is not None and out.shape:
        rows = n_out // max(1, _elements_last(out, batch))
        return 2 * n_out * max(1, _elements(ins[0], batch) // max(1, rows))
    if op.type in ("pd_op.conv2d", "pd_op.depthwise_conv2d", "pd_op.conv2d_transpose",
                   "pd_op.conv3d") and len(ins) >= 2 and ins[1] is not None and ins[1].shape:
        filt = ins[1]
        return 2 * n_out * max(1, _elements(filt, batch) // max(1, int(filt.shape[0])))
    return n_out


def _elements_last(var, batch: int) -> int:
    d = var.shape[-1]
    return batch if d == -1 else max(int(d), 1)


def _readers(graph) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for pos, (_, op) in enumerate(graph.walk_ops()):
        for name in op.reads:
            if name in op.facts.no_need_buffer:
                continue
            out.setdefault(name, []).append(pos)
    return out


def recomputed(an: StepAnalysis, paths: Sequence[str], readers=None) -> StepAnalysis:
    """``an`` with the sublayers ``paths`` recomputed (see the module docstring).

    Positions are program positions (the eager analysis runs ops in
    program order)."""
    cap = an.captured
    readers = readers if readers is not None else _readers(an.graph)
    fwd_end = cap.forward_range[1]
    holders = list(an.holders)
    for path in paths:
        (start, end), = cap.layer_ranges[path]
        inside = range(start, end)
        made = [i for i, h in enumerate(holders)
                if h.category == "activation" and start <= h.position < end]
        names = {n for i in made for n in holders[i].names}
        back = [p for n in names for p in readers.get(n, ()) if p >= fwd_end]
        if not back:
            continue
        again = min(back)
        new = []
        for i, h in enumerate(holders):
            if i not in made:
                # the inputs: held by the recompute until its backward
                if h.start < start and h.end >= start and h.end < again and any(
                        p in inside for n in h.names for p in readers.get(n, ())):
                    h = dataclasses.replace(h, end=again)
                new.append(h)
                continue
            reads = [p for n in h.names for p in readers.get(n, ())]
            outside = any(p < fwd_end and p not in inside for p in reads)
            if outside:
                new.append(h)
                continue
            fwd_last = max([p for p in reads if p < fwd_end] + [h.start])
            if h.end >= fwd_end:       # saved for the backward
                new.append(dataclasses.replace(h, end=fwd_last))
                new.append(dataclasses.replace(h, start=again, position=again,
                                               label=f"{h.label} (recomputed)"))
            else:                      # a temporary of the forward: made again briefly
                new.append(h)
                new.append(dataclasses.replace(h, start=again, end=again, position=again,
                                               label=f"{h.label} (recomputed)"))
        holders = new
    return dataclasses.replace(an, holders=holders)


def _candidates(cap) -> List[str]:
    out = []
    for path, ranges in sorted(cap.layer_ranges.items()):
        if len(ranges) != 1 or ranges[0][1] <= ranges[0][0]:
            continue
        if not cap.layer_inputs_need_grad.get(path, False):
            continue
        out.append(path)
    return out


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def suggest_recompute(step, input_spec: Sequence, optimizer=None, *, budget, batch_size: int,
                      set_to_zero: bool = True, amp: Optional[dict] = None) -> RecomputeAdvice:
    """The sublayers of ``step`` to wrap in ``fleet.utils.recompute`` so one
    eager training step at ``batch_size`` fits ``budget``.

    Parameters
    ----------
    step, input_spec, optimizer, set_to_zero, amp : as
        :func:`memopt.analyze` takes them for a step (``step`` must be an
        ``nn.Layer``: the advice names its sublayers).
    budget : bytes (int) or a string such as ``"512MiB"``: the allocator
        peak of the whole step (parameters, optimizer state, gradients included).
    batch_size : the batch size the budget is for.

    Returns
    -------
    RecomputeAdvice
        Empty ``layers`` when the step fits without recompute.

    Raises
    ------
    BudgetError : no choice of sublayers fits; ``smallest_budget`` is the
        least peak found (the model is unchanged).
    TypeError, ValueError : bad arguments.
    """
    import paddle

    from .capture import capture

    if not isinstance(step, paddle.nn.Layer):
        raise TypeError("suggest_recompute names sublayers: pass the step as an nn.Layer whose "
                        f"forward returns the loss, got {type(step).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    limit = _budget_bytes(budget)
    cap = capture(step, input_spec, amp=amp)
    an = analyze_step(step, input_spec, optimizer, mode="eager", batch_size=batch_size,
                      set_to_zero=set_to_zero, captured=cap)
    cap = an.captured    # op positions as the analysis numbers them
    forward_ops = cap.forward_range[1] - cap.forward_range[0]
    before = an.total_peak(batch_size)
    readers = _readers(an.graph)
    chosen: List[str] = []
    current, peak = an, before
    added = 0
    pool = _candidates(cap)
    while peak > limit:
        best = None
        for path in pool:
            if any(_nested(path, c) for c in chosen):
                continue
            trial = recomputed(current, [path], readers)
            p = trial.total_peak(batch_size)
            if p >= peak:
                continue
            (s, e), = cap.layer_ranges[path]
            score = (peak - p) / max(e - s, 1)
            if best is None or score > best[0] or (score == best[0] and path < best[1]):
                best = (score, path, trial, p, e - s)
        if best is None:
            break
        _, path, current, peak, ops = best
        chosen.append(path)
        added += ops
    if peak > limit:
        raise BudgetError(
            f"no choice of sublayers to recompute fits the step at batch {batch_size} in "
            f"{limit} bytes: the least predicted peak found is {peak} bytes (recomputing "
            f"{', '.join(chosen) or 'nothing'}); parameters and optimizer state "
            f"alone take {an.persistable_bytes(batch_size)} bytes. Raise the budget or lower "
            "the batch size", budget=limit, batch_size=batch_size, smallest_budget=peak)
    flops = [op_flops(op, an.graph, batch_size) for _, op in an.graph.walk_ops()]
    extra = 0
    for path in chosen:
        (s, e), = cap.layer_ranges[path]
        extra += sum(flops[s:e])
    forward = sum(flops[cap.forward_range[0]:cap.forward_range[1]])
    # a backward does about twice its forward's work (a gradient per operand)
    return RecomputeAdvice(chosen, batch_size, limit, before, peak, added, forward_ops, current,
                           added_flops=extra, step_flops=3 * forward)


def _budget_bytes(budget) -> int:
    if isinstance(budget, bool):
        raise TypeError(f"budget must be bytes (int) or a string like '512MiB', got {budget!r}")
    if isinstance(budget, int):
        if budget < 1:
            raise ValueError(f"budget must be positive, got {budget}")
        return budget
    if isinstance(budget, str):
        import re

        m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?i?B?)\s*", budget, re.I)
        if m:
            unit = m.group(2).upper().rstrip("B").rstrip("I")
            scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
            return int(float(m.group(1)) * scale)
    raise ValueError(f"budget must be bytes (int) or a string like '512MiB', got {budget!r}")

