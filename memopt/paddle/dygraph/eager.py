"""The memory of one dygraph training step, predicted before training.

A steady training step is::

    loss = step(*inputs); loss.backward(); opt.step(); opt.clear_grad()

:func:`analyze_step` predicts its allocator peak without running it:

1. :func:`memopt.paddle.dygraph.capture.capture` traces the step into its
   whole forward + backward PIR program (nothing runs);
2. the program is analysed as its ops run: ``mode="eager"`` -- one op after
   another in program order, each tensor freed when its last reader is done
   (dygraph frees a tensor when nothing refers to it; no in-place pass);
   ``mode="to_static"`` -- as Paddle's static executor runs it under the
   current flags (garbage collector, in-place pass, its dataflow order);
3. the eager terms are added (:mod:`memopt.paddle.dygraph.estimate`):

   - parameters the program does not read (other sublayers, buffers) are
     allocated all the same: counted with the parameters;
   - optimizer state (existing or made by the first ``opt.step()``):
     counted with the persistable bytes;
   - gradients as ``clear_grad`` leaves them: with ``set_to_zero=True``
     (Paddle's default) each parameter keeps a zeroed gradient between steps,
     held until backward makes the new one, which takes its place (eager); a
     to_static step's backward program hands every parameter gradient over
     when it ends, so the zeroed ones are held to the end of the program;
     with ``set_to_zero=False`` none between steps;
   - each new parameter gradient is held to the end of the step (the
     optimizer reads it), and so are the loss and the inputs;
   - ``opt.step()`` runs eagerly after the program: one more position in the
     timeline holding what it allocates at once (clipped / regularized
     gradients).

The result is an :class:`memopt.analysis.Analysis` (``total_peak(batch)``,
``max_batch_size(budget)``, ``report()``, ``to_json()``) whose holders are named
by the sublayer that made them (``encoder.layers.3.linear1: pd_op.matmul ...,
model.py:41``) and parameter gradients by the parameter's path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from ...analysis import Analysis, Holder, RuntimeModel, from_graph
from ...errors import UnsupportedProgramError
from ...graph import Size
from .capture import CapturedStep, capture
from .estimate import optimizer_state, step_extras, tensor_bytes

__all__ = ["StepAnalysis", "analyze_step", "eager_runtime", "MODES"]

MODES = ("eager", "to_static")

#: The runtime an eager step is analysed under: every tensor freed right
#: after its last use, ops one at a time in program order, no in-place pass.
EAGER_RUNTIME = RuntimeModel(gc=True, inplace=False, schedule="program", workers=1)


def eager_runtime() -> RuntimeModel:
    """The :class:`RuntimeModel` of dygraph execution (:data:`EAGER_RUNTIME`)."""
    return EAGER_RUNTIME


@dataclass
class StepAnalysis(Analysis):
    """:class:`Analysis` of a whole training step of a dygraph model.

    Attributes (beyond :class:`Analysis`)
    ----------
    mode : ``"eager"`` or ``"to_static"``.
    terms : ``[(what, bytes)]``: the bytes held between steps, by kind
        (``"parameters"``, ``"optimizer state"``, ``"gradients kept by
        clear_grad"``, ``"inputs"``); they do not depend on the batch but
        ``"inputs"``, given at :attr:`batch_size`.
    state : the optimizer tensors counted (:class:`estimate.StateItem`).
    captured : the :class:`CapturedStep` the figures come from.
    """

    mode: str = "eager"
    terms: list = field(default_factory=list)
    state: list = field(default_factory=list, repr=False)
    captured: Any = field(default=None, repr=False, compare=False)

    def report(self, batch_size: Optional[int] = None, top: int = 5,
               budget_bytes: Optional[int] = None) -> str:
        from ...report import format_bytes

        b = self.batch_for(batch_size)
        head = [f"training step ({self.mode}): loss = step(*inputs); loss.backward(); "
                "opt.step(); opt.clear_grad()"]
        for what, nbytes in self.terms:
            head.append(f"  {what:<28} {format_bytes(nbytes)}")
        return "\n".join(head + [super().report(b, top, budget_bytes)])

    def to_json(self, batch_size: Optional[int] = None, top: int = 10) -> dict:
        out = super().to_json(batch_size, top)
        out["mode"] = self.mode
        out["terms"] = [{"what": w, "bytes": int(n)} for w, n in self.terms]
        return out


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be 'eager' (the step run eagerly) or 'to_static' (the "
                         f"step run through paddle.jit.to_static), got {mode!r}")


def analyze_step(step, input_spec: Sequence, optimizer=None, *, mode: str = "eager",
                 batch_size: Optional[int] = None, set_to_zero: bool = True,
                 amp: Optional[dict] = None, runtime: Optional[RuntimeModel] = None,
                 captured: Optional[CapturedStep] = None) -> StepAnalysis:
    """Predict the memory of one steady training step of ``step``.

    Parameters
    ----------
    step : an ``nn.Layer`` whose forward returns the loss, a function of the
        inputs returning the loss, or a ``paddle.jit.to_static`` result of either.
    input_spec : one ``paddle.static.InputSpec`` (batch dimension ``None``)
        or Tensor per input of the step; InputSpecs are data (no gradient).
    optimizer : the ``paddle.optimizer.Optimizer`` that updates the model
        (its state is counted; None: no optimizer state, no update).
    mode : ``"eager"`` or ``"to_static"``.
    batch_size : the batch size figures default to.
    set_to_zero : how the training loop calls ``opt.clear_grad`` (Paddle's
        default True keeps zeroed gradients between steps).
    amp : ``paddle.amp.auto_cast`` keyword arguments the step runs under
        (``{"level": "O1"}``, ``{"level": "O2", "dtype": "bfloat16"}``), or
        None; O2 models come from ``paddle.amp.decorate`` (their parameters
        already low precision, master weights in the optimizer state).
    runtime : the executor model (default: :data:`EAGER_RUNTIME` for eager,
        Paddle's flags for to_static).
    captured : a :class:`CapturedStep` of this step already made.

    Raises
    ------
    UnsupportedProgramError : the step cannot be traced (see :func:`capture`).
    ValueError, TypeError : bad arguments.
    """
    _check_mode(mode)
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if not isinstance(set_to_zero, bool):
        raise TypeError(f"set_to_zero must be True or False, got {set_to_zero!r}")
    import paddle

    if optimizer is not None and not isinstance(optimizer, paddle.optimizer.Optimizer):
        raise TypeError(f"optimizer must be a paddle.optimizer.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    cap = captured or capture(step, input_spec, amp=amp)
    if runtime is None:
        if mode == "eager":
            runtime = EAGER_RUNTIME
        else:
            from .. import flags

            runtime = flags.runtime_model("pir")
    from .. import runtime as paddle_runtime

    read = paddle_runtime.read_program(cap.program, [], runtime)
    cap = cap.in_flat_positions(read.graph)
    inplace = list(read.inplace)
    kernels = None
    if mode == "eager":
        kernels = eager_kernels(read.graph)
        inplace += kernels.shared
    base = from_graph(read.graph, batch_size, runtime, inplace, read.same_variable)
    return _compose(base, cap, optimizer, mode, set_to_zero, kernels)


#: Ops whose eager output is a view of their first input (Paddle's stride
#: kernels, ``FLAGS_use_stride_kernel`` on by default): no memory of their own.
#: Measured on a [2048, 1000] float32 tensor: reshape, transpose, slice,
#: unsqueeze, squeeze, flatten, strided slice, index, diagonal, unbind,
#: astype to its own dtype allocate nothing; split, chunk, expand, contiguous do.
EAGER_VIEWS = frozenset({
    "pd_op.reshape", "pd_op.transpose", "pd_op.slice", "pd_op.unsqueeze", "pd_op.squeeze",
    "pd_op.flatten", "pd_op.strided_slice", "pd_op.diagonal", "pd_op.unbind",
    "pd_op.view_shape", "pd_op.view_dtype", "pd_op.as_strided",
    # their gradients: views of the output's gradient
    "pd_op.reshape_grad", "pd_op.transpose_grad", "pd_op.squeeze_grad",
    "pd_op.unsqueeze_grad", "pd_op.flatten_grad",
})

#: Kernels whose static-executor workspace (:mod:`memopt.paddle.kernel_memory`)
#: an eager call does not allocate: eager ``add_grad`` of [2048, 1000] + a
#: [1000] bias measured the two gradients' bytes and nothing more.
EAGER_NO_WORKSPACE = frozenset({"pd_op.add_grad"})


#: Views that are not contiguous in general: a kernel that reads one copies
#: it to a contiguous buffer for the call (held while the op runs).
STRIDED_VIEWS = frozenset({"pd_op.transpose", "pd_op.slice", "pd_op.strided_slice",
                           "pd_op.diagonal", "pd_op.unbind", "pd_op.as_strided",
                           "pd_op.transpose_grad"})


@dataclass
class EagerKernels:
    """What eager kernels do beyond the program's types: ``shared`` --
    ``(position, input, output)`` of each view (one buffer); ``copies`` --
    ``(position, view name)``: the op at flat ``position`` reads a strided
    view and copies it for its call."""

    shared: list
    copies: list


def eager_kernels(graph) -> EagerKernels:
    """Eager kernels' memory on a read program: the views
    (:data:`EAGER_VIEWS`), the copies strided views cost their readers
    (:data:`STRIDED_VIEWS`), and the workspaces eager calls do not allocate
    (:data:`EAGER_NO_WORKSPACE`, cleared on ``graph``)."""
    shared, copies = [], []
    strided = set()
    for pos, (_, op) in enumerate(graph.walk_ops()):
        if op.type in EAGER_VIEWS and op.reads and op.writes:
            source = _view_source(op, graph)
            shared.append((pos, source, op.writes[0]))
            if op.type in STRIDED_VIEWS and not _leading_slice(op):
                strided.add(op.writes[0])
            elif source in strided:
                strided.add(op.writes[0])     # a view of a strided view
            continue
        for name in dict.fromkeys(op.reads):
            if name in strided and name not in op.facts.no_need_buffer:
                copies.append((pos, name))
        if op.type in EAGER_NO_WORKSPACE and op.facts.workspace is not None:
            op.facts = dataclasses.replace(op.facts, workspace=None)
    return EagerKernels(shared, copies)


def _view_source(op, graph) -> str:
    """The operand a view op's output is a view of: the first operand of a
    forward view; of a view's gradient op, its output's gradient (the last
    operand of the output's size)."""
    if not op.type.endswith("_grad"):
        return op.reads[0]
    out = graph.find_var(op.writes[0])
    for name in reversed(op.reads):
        var = graph.find_var(name)
        if out is not None and var is not None and var.size == out.size:
            return name
    return op.reads[-1]


def _leading_slice(op) -> bool:
    """A slice along the first axis only (a contiguous view)."""
    axes = op.attrs.get("axes") if isinstance(op.attrs, dict) else None
    return op.type == "pd_op.slice" and axes is not None and list(axes) == [0]


def _param_bytes(p) -> int:
    return tensor_bytes(p.shape, p.dtype)


def _compose(base: Analysis, cap: CapturedStep, opt, mode: str,
             set_to_zero: bool, kernels: Optional["EagerKernels"] = None) -> StepAnalysis:
    last = len(base.op_types) - 1
    step_pos = last + 1                      # opt.step(), eagerly after the program
    grad_of = {g: p for p, g in cap.param_grads.items()}
    holders: List[Holder] = []
    new_grad_start = {}
    for h in base.holders:
        h = _named(h, base, cap, grad_of)
        if h.end >= last:                    # held to the end: through opt.step()
            h = dataclasses.replace(h, end=step_pos)
        for name in h.names:
            if name in grad_of:
                new_grad_start[grad_of[name]] = h.start
        holders.append(h)
    if kernels is not None and kernels.copies:
        run_of = {flat: run for run, flat in enumerate(base.order)} if base.order else {}
        for flat, name in kernels.copies:
            var = base.graph.find_var(name)
            run = run_of.get(flat, flat)
            if var is None or var.size.coefficient == 0:
                continue
            holders.append(Holder(
                name=f"contiguous copy of {name}", names=(), size=var.size,
                category="workspace", op=base.op_types[run], position=run, start=run, end=run,
                label=f"contiguous copy of the strided view {name} for {base.op_types[run]}"))
    missing = sorted(set(cap.param_grads) - set(new_grad_start))
    if missing:
        raise UnsupportedProgramError(
            f"memopt found no gradient value for parameter(s) {missing[:5]} in the traced "
            "program (Paddle's dy2st changed how it names them?)")
    trained = _in_optimizer_order(opt, [cap.parameters[p] for p in cap.param_grads
                                        if p in cap.parameters])
    grad_bytes = {p: _param_bytes(cap.parameters[p]) if p in cap.parameters else 0
                  for p in cap.param_grads}
    if set_to_zero:
        for pname in sorted(cap.param_grads):
            holders.append(Holder(
                name=f"{pname}@GRAD(zeroed)", names=(f"{pname}@GRAD(zeroed)",),
                size=Size(grad_bytes[pname], 0), category="gradient", op="clear_grad",
                position=0, start=0, end=new_grad_start[pname] if mode == "eager" else last,
                label=f"zeroed gradient of {cap.param_paths.get(pname, pname)} ({pname}), "
                      "kept by clear_grad(set_to_zero=True)"))
    extras = step_extras(opt, trained) if opt is not None else []
    for what, nbytes in extras:
        holders.append(Holder(name=what, names=(what,), size=Size(nbytes, 0),
                              category="gradient", op="optimizer.step", position=step_pos,
                              start=step_pos, end=step_pos, label=f"opt.step(): {what}"))
    persistable = dict(base.persistable)
    terms = []
    program_params = int(persistable.get(0, 0))
    other = _other_model_bytes(cap)
    state = optimizer_state(opt, [p for p, _ in trained]) if opt is not None else []
    state_bytes = sum(i.bytes for i in state)
    persistable[0] = program_params + other + state_bytes
    terms.append(("parameters and buffers", program_params + other))
    terms.append(("optimizer state", state_bytes))
    if set_to_zero:
        terms.append(("gradients kept by clear_grad", sum(grad_bytes.values())))
    opt_name = type(opt).__name__ if opt is not None else "no optimizer"
    op_types = list(base.op_types) + [f"optimizer.step ({opt_name})"]
    order = list(base.order) + [len(base.order)] if base.order else []
    places = list(base.places) + [f"opt.step() ({opt_name}, eager)"] if base.places else []
    return StepAnalysis(
        graph=base.graph, batch_size=base.batch_size, runtime=base.runtime, holders=holders,
        persistable=persistable, op_types=op_types,
        # eager: the pairs are views (kernels.shared), not ops run in place
        inplace=[] if kernels is not None else list(base.inplace), order=order,
        places=places, mode=mode, terms=terms, state=state, captured=cap)


def _in_optimizer_order(opt, params) -> list:
    """``[(parameter, gradient bytes)]`` in the order ``opt.step()`` walks them."""
    if opt is None:
        return [(p, _param_bytes(p)) for p in params]
    ids = {id(p): p for p in params}
    order = []
    for item in getattr(opt, "_parameter_list", None) or []:
        group = item.get("params", []) if isinstance(item, dict) else [item]
        for p in group:
            if id(p) in ids:
                order.append(ids.pop(id(p)))
    order += list(ids.values())
    return [(p, _param_bytes(p)) for p in order]


def _other_model_bytes(cap: CapturedStep) -> int:
    """Bytes of the model's parameters and buffers the program does not read."""
    root = cap.root
    if root is None:
        return 0
    read = set(cap.parameters) | set(_program_param_names(cap))
    total = 0
    seen = set()
    for p in root.parameters():
        if p.name in read or id(p) in seen:
            continue
        seen.add(id(p))
        total += _param_bytes(p)
    for b in root.buffers():
        if b is None or b.name in read or id(b) in seen or not b._is_initialized():
            continue
        seen.add(id(b))
        total += _param_bytes(b)
    return total


def _program_param_names(cap: CapturedStep) -> list:
    from ..pir.program import PARAMETER_OP

    return [str(op.attrs().get("parameter_name")) for op in cap.program.global_block().ops
            if op.name() == PARAMETER_OP]


def _named(h: Holder, base: Analysis, cap: CapturedStep, grad_of: dict) -> Holder:
    """``h`` labelled as the user knows it: a parameter's gradient by the
    parameter's path, a forward value by the sublayer that made it."""
    for name in h.names:
        if name in grad_of:
            pname = grad_of[name]
            return dataclasses.replace(
                h, category="gradient",
                label=f"gradient of {cap.param_paths.get(pname, pname)} ({pname})")
    if 0 <= h.position < len(base.order):
        index = base.order[h.position]
        path = cap.op_layers.get(index) or _backward_layers(base, cap).get(index)
        if path:
            return dataclasses.replace(h, label=f"{path}: {h.label}")
    return h


def _backward_layers(base: Analysis, cap: CapturedStep) -> dict:
    """``{backward op position: Layer path}``: the sublayer of the first
    parameter the backward op reads, else the sublayer whose forward made the
    first forward value it reads (the op computes that sublayer's
    gradients).  Cached on ``cap``."""
    cached = getattr(cap, "_backward_layers", None)
    if cached is not None:
        return cached
    made_by: dict = {}
    layer_of_param = {p: path.rpartition(".")[0] for p, path in cap.param_paths.items()
                      if "." in path}
    out: dict = {}
    for pos, (_, op) in enumerate(base.graph.walk_ops()):
        if pos < cap.forward_range[1]:
            path = cap.op_layers.get(pos)
            if path:
                for name in op.writes:
                    made_by.setdefault(name, path)
            continue
        # a parameter read names the layer (matmul_grad reads the input, made
        # by the layer before, and the weight); else the first forward value
        paths = [layer_of_param[n] for n in op.reads if n in layer_of_param] or \
            [made_by[n] for n in op.reads if n in made_by]
        if paths:
            out[pos] = paths[0]
    object.__setattr__(cap, "_backward_layers", out)
    return out
