"""What a dygraph optimizer holds and allocates, read from the optimizer without running it.

Terms an eager training step has beside its forward and backward program:

- **optimizer state** (:func:`optimizer_state`): Paddle creates it at the
  first ``opt.step()`` (``Optimizer._create_accumulators``: Adam's moments and
  beta powers, Momentum's velocity, master weights of fp16/bf16 parameters
  with ``multi_precision``).  What exists already is read from the
  optimizer; what the first step would create is found by calling the
  optimizer class's own ``_create_accumulators`` with its ``_add_accumulator``
  and ``_create_master_weight`` replaced by recorders that allocate nothing,
  the optimizer's attributes put back afterwards.
- **the step's temporaries** (:func:`step_extras`): the optimizer runs eagerly,
  outside any program; gradient clipping (``ClipGradByGlobalNorm``,
  ``ClipGradByNorm``, ``ClipGradByValue``) makes a new gradient per parameter
  and a weight-decay regularizer not fused into the update kernel
  (``weight_decay=float`` / ``L2Decay`` / ``L1Decay`` on Adam, SGD...) a new
  gradient per parameter, each list held until the update ends: one more
  gradient's bytes of every clipped / regularized parameter.

Units: bytes.  Every function leaves the optimizer as it was.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, Iterable, List

from ...graph import DTYPE_BYTES

__all__ = ["StateItem", "optimizer_state", "step_extras", "dtype_bytes", "tensor_bytes"]


@dataclass(frozen=True)
class StateItem:
    """One optimizer tensor: ``name`` (``"moment1 of linear_0.w_0"``), its
    parameter's name, bytes, and whether it exists already (``False``: the
    first ``opt.step()`` creates it)."""

    name: str
    param: str
    bytes: int
    exists: bool


def dtype_bytes(dtype) -> int:
    """Bytes per element of a Paddle dtype (``paddle.float32``, ``"float16"``)."""
    text = str(dtype).replace("paddle.", "").replace("VarType.", "").lower()
    text = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}.get(
        text, text)
    if text not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[text]


def tensor_bytes(shape, dtype) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype``."""
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype_bytes(dtype)


class _Master:
    """What the recorder hands back for a master weight: name, shape, dtype."""

    def __init__(self, param) -> None:
        import paddle

        self.name = param.name + "_fp32_master"
        self.shape = list(param.shape)
        self.dtype = paddle.float32
        self.param = param.name

    def __getattr__(self, item):  # anything else an optimizer reads: not modelled
        raise AttributeError(item)


def _existing(opt) -> List[StateItem]:
    out = []
    for acc_name in sorted(getattr(opt, "_accumulators", {}) or {}):
        for pname in sorted(opt._accumulators[acc_name]):
            t = opt._accumulators[acc_name][pname]
            out.append(StateItem(f"{acc_name} of {pname}", pname,
                                 tensor_bytes(t.shape, t.dtype), True))
    for pname in sorted(getattr(opt, "_master_weights", {}) or {}):
        t = opt._master_weights[pname]
        out.append(StateItem(f"master weight of {pname}", pname,
                             tensor_bytes(t.shape, t.dtype), True))
    return out


def optimizer_state(opt, params: Iterable) -> List[StateItem]:
    """Every tensor of ``opt``'s state for ``params`` (the parameters that get
    a gradient) at a steady step: those that exist, and those the first
    ``opt.step()`` would create.  ``opt`` is left unchanged (its
    ``__dict__`` is put back key by key, containers restored to the very
    objects it had).

    Raises
    ------
    TypeError : ``opt`` is not a ``paddle.optimizer.Optimizer``.
    """
    import paddle

    if not isinstance(opt, paddle.optimizer.Optimizer):
        raise TypeError(f"optimizer must be a paddle.optimizer.Optimizer, got {type(opt).__name__}")
    items = _existing(opt)
    have = {(i.name.split(" of ")[0], i.param) for i in items}
    params = [p for p in params if not p.stop_gradient]
    created: List[StateItem] = []
    masters: Dict[str, _Master] = {}

    def add_accumulator(name, param, dtype=None, fill_value=0.0, shape=None, type=None,
                        device=None):
        if opt._name is not None:
            name = opt._name + "_" + name
        pname = getattr(param, "param", param.name)
        if (name, param.name) in have or (name, pname) in have:
            return None
        shape = list(param.shape) if shape is None else list(shape)
        created.append(StateItem(f"{name} of {pname}", pname,
                                 tensor_bytes(shape, dtype or param.dtype), False))
        return None

    def create_master_weight(param):
        if param.name in (getattr(opt, "_master_weights", None) or {}):
            return opt._master_weights[param.name]
        master = masters.setdefault(param.name, _Master(param))
        created.append(StateItem(f"master weight of {param.name}", param.name,
                                 tensor_bytes(master.shape, "float32"), False))
        return master

    saved = dict(opt.__dict__)
    try:
        for key, value in saved.items():  # the recorder may write into these
            if isinstance(value, (dict, set, list)):
                opt.__dict__[key] = copy.copy(value)
        opt.__dict__["_add_accumulator"] = add_accumulator
        opt.__dict__["_create_master_weight"] = create_master_weight
        todo = [p for p in params if p.name not in opt._already_create_accumulator]
        if todo:
            block = paddle.static.default_main_program().global_block()
            groups = getattr(opt, "_param_groups", None)
            if groups and isinstance(groups[0], dict):
                ids = {id(p) for p in todo}
                for group in groups:
                    mine = [p for p in group["params"] if id(p) in ids]
                    if mine:
                        type(opt)._create_accumulators(opt, block, dict(group, params=mine))
            else:
                type(opt)._create_accumulators(opt, block, todo)
    finally:
        opt.__dict__.clear()
        opt.__dict__.update(saved)
    # master weights made once per parameter (several accumulators share it)
    seen = set()
    unique = []
    for item in created:
        if item.name in seen:
            continue
        seen.add(item.name)
        unique.append(item)
    return items + unique


def _clip_kind(opt) -> str:
    clip = getattr(opt, "_grad_clip", None)
    return type(clip).__name__ if clip is not None else ""


def _regularizes(opt, param) -> bool:
    """Whether the eager update makes a new gradient for ``param`` (a
    weight-decay regularizer not fused into the update kernel)."""
    import paddle

    reg = getattr(param, "regularizer", None) or getattr(opt, "regularization", None)
    if reg is None:
        return False
    if isinstance(opt, paddle.optimizer.Momentum) and \
            getattr(opt, "_regularization_method", "") == "l2_decay":
        return False
    return True


def step_extras(opt, params_grads: Iterable) -> List[tuple]:
    """``[(what, bytes)]`` the eager ``opt.step()`` holds at once beyond the
    gradients and state (measured on Paddle 3.3.1, CPU, an MLP 64-512x4-10):

    - ``ClipGradByNorm`` / ``ClipGradByValue``: a new gradient per clipped
      parameter, all held until the update ends (one more gradient's bytes);
      ``ClipGradByGlobalNorm`` scales the gradients without a second copy
      (a few scalars);
    - a weight-decay regularizer not fused into the update kernel: for each
      parameter in turn a decay term the parameter's size and a new gradient,
      the new gradients held to the end: ``max_i(new gradients 1..i + term_i)``.

    ``params_grads`` lists ``(parameter, gradient bytes)`` for the
    parameters that get a gradient, in the optimizer's order.
    """
    pairs = list(params_grads)
    out = []
    kind = _clip_kind(opt)
    if kind in ("ClipGradByNorm", "ClipGradByValue"):
        clipped = sum(b for p, b in pairs if getattr(p, "need_clip", True))
        if clipped:
            out.append((f"gradients clipped by {kind}", clipped))
    held, worst = 0, 0
    for p, nbytes in pairs:
        if _regularizes(opt, p):
            held += nbytes
            worst = max(worst, held + nbytes)
    if worst:
        out.append(("gradients with weight decay added", worst))
    return out
