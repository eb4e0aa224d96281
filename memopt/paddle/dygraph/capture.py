"""Capture one training step of a dygraph model as a PIR program, without running it.

A *step* is what the user calls to get the loss:

- an ``nn.Layer`` whose ``forward`` returns the loss;
- a Python function of the inputs returning the loss (closing over the model);
- what ``paddle.jit.to_static`` made of either.

:func:`capture` traces the step with ``paddle.jit.to_static(full_graph=True)``
(the AST path) on a fresh ``StaticFunction`` of memopt's own, and takes the
whole forward + backward program Paddle builds for training
(``PartialProgramLayer.train_program``, before Paddle splits it).  Nothing runs:
building the program reads the parameters' shapes, not their values.

What the model sees: a forward pre/post hook on each sublayer while the
program is built (it records which ops each sublayer made, removed before
:func:`capture` returns), and nothing else.  Parameters, buffers, the
optimizer, ``paddle``'s RNG state and the ``unique_name`` counters are left
as they were; ``Layer._original_funcs`` (which Paddle fills when a method is
traced) is put back.

Inputs given as ``InputSpec`` are traced as data (``stop_gradient=True``, as a
tensor made from data is): an ``InputSpec`` at Paddle's default
``stop_gradient=False`` would add the inputs' gradients to the program,
another program than real data runs.  For an input that needs its gradient
pass an eager tensor of its shape with ``stop_gradient=False`` (its first
dimension is taken as the batch).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import UnsupportedProgramError

__all__ = ["CapturedStep", "capture", "input_specs"]


@dataclass
class CapturedStep:
    """One training step as Paddle's dy2st builds it.

    Attributes
    ----------
    program : the whole PIR training program (forward, loss, backward).
    forward_range, backward_range : ``(start, end)`` op indices of the
        forward and backward parts in ``program``'s global block, as Paddle
        splits them.
    input_names : the data inputs' names, in the step's argument order.
    parameters : ``{program parameter name: eager Parameter}`` of every
        parameter the program reads.
    param_grads : ``{program parameter name: the name memopt's reader gives
        the gradient value}`` for each parameter that gets a gradient.
    param_paths : ``{program parameter name: "encoder.layers.3.linear1.weight"}``,
        the path ``named_parameters`` gives (the first of several for a shared
        parameter); the bare parameter name where no Layer holds it.
    op_layers : ``{forward op index: Layer path}`` of the innermost sublayer
        whose forward made the op (ops of the step's own code: absent).
    layer_ranges : ``{Layer path: [(start, end), ...]}``: op index ranges
        each sublayer's calls made in ``program`` (one per call).
    layer_inputs_need_grad : ``{Layer path: bool}``: whether any input of
        the sublayer's (first) call needs a gradient.
    layers : ``{Layer path: the sublayer}``.
    root : the model (the Layer of the step, or the first Layer a function
        step reads parameters of), or None.
    """

    program: Any
    forward_range: Tuple[int, int]
    backward_range: Tuple[int, int]
    input_names: List[str]
    parameters: Dict[str, Any]
    param_grads: Dict[str, str]
    param_paths: Dict[str, str]
    op_layers: Dict[int, str] = field(default_factory=dict)
    layer_ranges: Dict[str, list] = field(default_factory=dict)
    layer_inputs_need_grad: Dict[str, bool] = field(default_factory=dict)
    layers: Dict[str, Any] = field(default_factory=dict)
    root: Any = None
    flat: bool = False

    def in_flat_positions(self, graph) -> "CapturedStep":
        """This step with every op index (``forward_range``, ``backward_range``,
        ``op_layers``, ``layer_ranges``) turned from an index into the
        program's global block into the flat position memopt's analysis
        numbers ops by (:meth:`memopt.graph.Graph.walk_ops`: an if/while op's
        inner ops right after it; a global range takes its ops' inner ops
        along).  The same step when already converted."""
        if self.flat:
            return self
        starts = [pos for pos, (block, _) in enumerate(graph.walk_ops()) if block == 0]
        total = sum(1 for _ in graph.walk_ops())
        at = starts + [total]

        def pos(i: int) -> int:
            return at[min(i, len(at) - 1)]

        def span(r) -> tuple:
            return (pos(r[0]), pos(r[1]))

        op_layers = {}
        for index, path in self.op_layers.items():
            for p in range(pos(index), pos(index + 1)):
                op_layers[p] = path
        return dataclasses.replace(
            self, forward_range=span(self.forward_range), backward_range=span(self.backward_range),
            op_layers=op_layers,
            layer_ranges={k: [span(r) for r in v] for k, v in self.layer_ranges.items()},
            flat=True)


def input_specs(input_spec: Sequence) -> list:
    """``input_spec`` as ``InputSpec``s Paddle traces: an eager tensor gives its
    shape and dtype (first dimension as the batch, ``None``) and its own
    ``stop_gradient``; an ``InputSpec`` keeps its shape, dtype and name and
    is traced as data, ``stop_gradient=True`` (see the module docstring).

    Raises
    ------
    TypeError : an item is neither an InputSpec nor a Tensor.
    ValueError : ``input_spec`` is empty.
    """
    import paddle
    from paddle.static import InputSpec

    if input_spec is None or isinstance(input_spec, (str, bytes)) or len(input_spec) == 0:
        raise ValueError(
            "input_spec must list the step's inputs (paddle.static.InputSpec or "
            f"Tensors, the batch dimension None), got {input_spec!r}")
    out = []
    for i, item in enumerate(input_spec):
        if isinstance(item, InputSpec):
            # Paddle's default is stop_gradient=False; a data input has no gradient
            out.append(InputSpec(list(item.shape), item.dtype, item.name or f"input_{i}",
                                 stop_gradient=True))
        elif isinstance(item, paddle.Tensor):
            shape = [None] + list(item.shape[1:]) if len(item.shape) else []
            out.append(InputSpec(shape, item.dtype, f"input_{i}",
                                 stop_gradient=bool(item.stop_gradient)))
        else:
            raise TypeError(
                f"input_spec[{i}] is a {type(item).__name__}: pass paddle.static.InputSpec "
                "(batch dimension None) or a paddle.Tensor")
    return out


def _layer_of(step):
    """The nn.Layer a step is (or is a method of), or None."""
    import paddle

    if isinstance(step, paddle.nn.Layer):
        return step
    instance = getattr(step, "__self__", None)
    if isinstance(instance, paddle.nn.Layer):
        return instance
    owner = getattr(step, "class_instance", None)
    if isinstance(owner, paddle.nn.Layer):
        return owner
    return None


def _python_function(step):
    """The Python callable to trace for ``step`` (a Layer's original forward,
    bound; a StaticFunction's own dygraph function; a function as given)."""
    import paddle
    from paddle.jit.dy2static.program_translator import StaticFunction

    if isinstance(step, paddle.nn.Layer):
        forward = step.forward
        if isinstance(forward, StaticFunction):
            original = step._original_funcs.get("forward")
            if original is None:
                raise UnsupportedProgramError(
                    f"{type(step).__name__}.forward is a to_static function whose "
                    "original forward Paddle did not keep: pass the Layer before "
                    "paddle.jit.to_static, or its forward function")
            return original if inspect.ismethod(original) else original.__get__(step)
        return forward
    if isinstance(step, StaticFunction):
        fn = step.dygraph_function
        owner = step.class_instance
        return fn.__get__(owner) if owner is not None else fn
    if callable(step):
        return step
    raise UnsupportedProgramError(
        f"a step is an nn.Layer whose forward returns the loss, a function of the "
        f"inputs returning the loss, or what paddle.jit.to_static made of either; "
        f"got {type(step).__name__}")


def _check_signature(fn) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        raise UnsupportedProgramError(
            f"{getattr(fn, '__qualname__', fn)} takes *args: paddle.jit.to_static traces "
            "only named parameters; write the step as def step(x, label): ... "
            "(one named parameter per input)")


class _OpRecorder:
    """Forward pre/post hooks on every sublayer recording the ops it makes."""

    def __init__(self, root) -> None:
        self.root = root
        self.handles: list = []
        self.stack: list = []
        self.ranges: Dict[str, list] = {}
        self.need_grad: Dict[str, bool] = {}
        self.layers: Dict[str, Any] = {}

    def __enter__(self):
        if self.root is None:
            return self
        for path, layer in self.root.named_sublayers():
            self.layers[path] = layer
            self.handles.append(layer.register_forward_pre_hook(self._pre(path)))
            self.handles.append(layer.register_forward_post_hook(self._post(path)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    @staticmethod
    def _count() -> int:
        import paddle

        return len(paddle.static.default_main_program().global_block().ops)

    def _pre(self, path):
        def hook(layer, inputs):
            self.stack.append((path, self._count()))
            if path not in self.need_grad:
                self.need_grad[path] = any(
                    getattr(x, "stop_gradient", True) is False for x in _flat(inputs))
            return None
        return hook

    def _post(self, path):
        def hook(layer, inputs, outputs):
            while self.stack:
                top, start = self.stack.pop()
                if top == path:
                    self.ranges.setdefault(path, []).append((start, self._count()))
                    break
            return None
        return hook


def _flat(items) -> list:
    out: list = []
    if isinstance(items, (list, tuple)):
        for x in items:
            out.extend(_flat(x))
    elif isinstance(items, dict):
        for k in sorted(items, key=str):
            out.extend(_flat(items[k]))
    else:
        out.append(items)
    return out


@contextlib.contextmanager
def _model_kept(layer):
    """Put back what tracing a Layer's method writes on it
    (``_original_funcs``), the RNG state and the unique-name counters."""
    import paddle

    originals = dict(layer._original_funcs) if layer is not None else None
    rng = paddle.get_rng_state()
    try:
        with paddle.utils.unique_name.guard():
            yield
    finally:
        if layer is not None:
            layer._original_funcs.clear()
            layer._original_funcs.update(originals)
        paddle.set_rng_state(rng)


def _innermost(ranges: Dict[str, list]) -> Dict[int, str]:
    """``{op index: path}`` of the innermost (shortest range) sublayer call
    covering each op."""
    spans = sorted(((end - start, start, end, path) for path, rs in ranges.items()
                    for start, end in rs), reverse=True)
    out: Dict[int, str] = {}
    for _, start, end, path in spans:  # widest first, narrower ones overwrite
        for i in range(start, end):
            out[i] = path
    return out


def capture(step, input_spec: Sequence, *, amp: Optional[dict] = None) -> CapturedStep:
    """Trace ``step`` on ``input_spec`` into its whole training program.

    Parameters
    ----------
    step : an ``nn.Layer`` whose forward returns the loss, a function of the
        inputs returning the loss, or a ``paddle.jit.to_static`` result of
        either.
    input_spec : one ``InputSpec`` or Tensor per input (see :func:`input_specs`).
    amp : keyword arguments of ``paddle.amp.auto_cast`` to trace the step
        under (``{"level": "O1", "dtype": "bfloat16"}``), or None.

    Raises
    ------
    UnsupportedProgramError
        Paddle cannot trace the step as one static program (the message
        names Paddle's error and where), the step returns no scalar loss,
        or no forward op needs a gradient.
    """
    import paddle
    from paddle.jit.dy2static.program_translator import StaticFunction  # noqa: F401

    specs = input_specs(input_spec)
    fn = _python_function(step)
    _check_signature(fn)
    layer = _layer_of(step) or _layer_of(fn)
    root = layer if layer is not None else _closure_layer(fn)
    was_dynamic = paddle.in_dynamic_mode()
    if not was_dynamic:
        raise UnsupportedProgramError(
            "memopt.analyze on a step runs in dynamic mode: call paddle.disable_static() "
            "first (the step is a dygraph model)")
    recorder = _OpRecorder(root)
    try:
        with _model_kept(layer if layer is not None else root), recorder:
            static_fn = paddle.jit.to_static(fn, full_graph=True, backend=None)
            cast = paddle.amp.auto_cast(**amp) if amp else contextlib.nullcontext()
            with cast:
                _, partial = static_fn.get_concrete_program(*specs)
            # building the train program would reset each parameter's
            # gradient (PartialProgramLayer._set_grad_type): not on a model
            # memopt only reads
            partial._set_grad_type = _leave_gradients
            runnable = partial.train_program
    except UnsupportedProgramError:
        raise
    except Exception as exc:
        raise UnsupportedProgramError(
            f"paddle.jit.to_static(full_graph=True) could not trace the step "
            f"{getattr(fn, '__qualname__', type(fn).__name__)}{_where(exc)}: "
            f"{type(exc).__name__}: {_first_line(exc)}. memopt predicts from the program Paddle builds: make "
            "the step traceable by to_static(full_graph=True) (tensor-dependent Python "
            "control flow through paddle.static.nn.cond / while_loop or a plain if/for "
            "on tensors, no numpy() calls, no Python side effects on tensors)") from exc
    return _captured(runnable, specs, root, recorder)


def _leave_gradients(params, train_program) -> None:
    """Stands in for ``PartialProgramLayer._set_grad_type`` on memopt's own
    partial program: Paddle's sets each parameter's gradient type, dropping
    the gradient a ``clear_grad()`` kept."""
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _where(exc: BaseException) -> str:
    """`` at model.py:41 (vals = x.tolist())``: the user's line Paddle's dy2st
    error points at (its "<--- HERE" mark), or ''."""
    text = str(exc)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.search(line)
        if not m or "site-packages" in m.group(1) or "/paddle/" in m.group(1):
            continue
        code = ""
        for later in lines[i + 1:i + 12]:
            if "<--- HERE" in later:
                break
            if later.strip() and "~~~" not in later:
                code = later.strip()
        return f" at {os.path.basename(m.group(1))}:{m.group(2)} ({code})" if code else \
            f" at {os.path.basename(m.group(1))}:{m.group(2)}"
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    lines = [t for t in text if t.strip()]
    return (lines[-1] if lines else "")[:400]


def _closure_layer(fn):
    """The first ``nn.Layer`` a step function closes over or reads as a
    global (its model), or None."""
    import paddle

    cells = getattr(fn, "__closure__", None) or ()
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, paddle.nn.Layer):
            return value
    code = getattr(fn, "__code__", None)
    globs = getattr(fn, "__globals__", {})
    for name in (code.co_names if code else ()):
        value = globs.get(name)
        if isinstance(value, paddle.nn.Layer):
            return value
    return None


def _captured(runnable, specs, root, recorder: _OpRecorder) -> CapturedStep:
    from ..pir.program import value_names

    program = runnable.program
    outs = runnable.out_values
    if not outs:
        raise UnsupportedProgramError("the step returns nothing: it must return the loss")
    loss = outs[0]
    shape = list(loss.shape)
    if any(d not in (1,) for d in shape):
        raise UnsupportedProgramError(
            f"the step returns a tensor of shape {shape}: it must return the scalar loss "
            "(e.g. paddle.mean(...) of the per-example losses)")
    if runnable.backward_range[0] >= runnable.backward_range[1]:
        raise UnsupportedProgramError(
            "no op of the step needs a gradient: the loss does not depend on a trainable "
            "parameter (are all parameters frozen, or the step under paddle.no_grad?)")
    params = _parameters(root)
    by_name = {p.name: p for p in params.values()} if params else {}
    parameters = {}
    for name in runnable.param_names:
        if name in by_name:
            parameters[name] = by_name[name]
    param_grads = {}
    names = value_names(program)   # once: a lookup per value would read the program each time
    for pname, gvalue in zip(runnable.param_names, runnable.param_grad_values, strict=True):
        if gvalue is None or _is_fake(gvalue):
            continue
        param_grads[pname] = names[gvalue.id]
    paths = {}
    for path, p in (params or {}).items():
        paths.setdefault(p.name, path)
    for name in runnable.param_names:
        paths.setdefault(name, name)
    return CapturedStep(
        program=program, forward_range=tuple(runnable.forward_range),
        backward_range=tuple(runnable.backward_range),
        input_names=[s.name for s in specs], parameters=parameters,
        param_grads=param_grads, param_paths=paths,
        op_layers=_innermost(recorder.ranges), layer_ranges=dict(recorder.ranges),
        layer_inputs_need_grad=dict(recorder.need_grad), layers=dict(recorder.layers),
        root=root)


def _is_fake(value) -> bool:
    try:
        from paddle.base.libpaddle.pir import is_fake_value
        return bool(is_fake_value(value))
    except Exception:  # pragma: no cover - older names
        return not hasattr(value, "get_defining_op") or value.get_defining_op() is None


def _parameters(root) -> Dict[str, Any]:
    """``{path: Parameter}`` of ``root`` (shared parameters under each path)."""
    if root is None:
        return {}
    return {path: p for path, p in root.named_parameters(include_sublayers=True)}


def is_step(obj) -> bool:
    """Whether ``obj`` is a step :func:`capture` takes rather than a static
    program: an ``nn.Layer``, a ``paddle.jit.to_static`` result or a Python
    function (checked without importing Paddle when ``obj`` is neither)."""
    import sys

    if "paddle" not in sys.modules:
        return callable(obj) and not hasattr(obj, "global_block")
    import paddle
    from paddle.jit.dy2static.program_translator import StaticFunction

    if isinstance(obj, (paddle.nn.Layer, StaticFunction)):
        return True
    if hasattr(obj, "global_block") or type(obj).__name__ in ("Program", "CompiledProgram"):
        return False
    return callable(obj) and not isinstance(obj, type)
