"""Memory Paddle's CPU kernels allocate that PIR's types do not show.

PIR types some outputs as empty (shape ``[0]``) because their size is known
only inside the kernel, and some kernels allocate scratch memory for the
length of one op.  Both are real allocations the allocator sees; the facts
here come from Paddle 3.3.1's CPU kernels and were checked against
``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``
(``benchmarks/bench_analysis.py``, the ``lstm`` and ``gru`` rows).

``pd_op.rnn`` (``paddle.nn.LSTM`` / ``GRU`` / ``SimpleRNN``), when training
(``is_test`` false):

- ``reserve`` keeps every step's gates, cell states and hidden states for
  the backward pass: a ``[rows, T * B * directions * H]`` tensor of the
  output's dtype (the output is ``[T, B, directions * H]``), with
  ``rows = (num_layers - 1) + per_layer * num_layers`` and ``per_layer`` 6
  for LSTM (4 gates, cell, cell activation), 4 for GRU (3 gates, reset
  output), 1 for a simple RNN;
- ``dropout_state_out`` is filled with ones of the output's shape, one byte
  per element (uint8), whether dropout is on or not.

``pd_op.rnn`` for inference (``is_test`` true: a model saved with
``paddle.jit.save`` in eval mode, a program cloned for test) allocates no
``reserve`` but holds, for as long as it runs (its *workspace*), with
``[T, B, D * H]`` the ``out`` shape:

- ``X * W_ih + b`` of every step, ``[T, B, gates * H]`` per direction
  (``gates x out`` in all; one buffer the layers reuse);
- bidirectional: each direction's output, ``[T, B, H]`` twice, before
  they are concatenated into ``out``;
- with ``num_layers > 1`` a ``[T, B, D * H]`` buffer the layers' outputs
  swap with;
- a copy of the initial hidden state, the running cell state (LSTM; a
  GRU's reset output instead) and, from the second step, a second state
  buffer: three ``[B, H]`` (one for a simple RNN); with per-row
  ``sequence_length`` the ``[T, B]`` mask and its transpose.

Measured (``paddle.nn.LSTM(64, 128)`` after an embedding, ``[64, 20]``
tokens, ``paddle.jit.save`` then ``load_inference_model``, PIR, GC on,
lowest of 4 steps): the model without this fell short by 2.41 MiB of the
allocator's 3.67 MiB step peak (the gates alone are 2.5 MiB).

``pd_op.rnn_grad`` holds, for as long as the op runs (its *workspace*),
with ``[T, B, D * H]`` the forward ``out`` shape (``D`` directions):

- the gradient of one layer's gates, ``[T * D, B, H * gates]`` of the
  output's dtype (gates: 4 LSTM, 3 GRU, 1 simple RNN);
- the gradient of ``x`` when PIR gives the op no ``x_grad`` (``x`` is a feed
  or stops gradient): the kernel allocates ``x``'s shape all the same;
- with ``num_layers > 1`` the dropped-out input of a layer and the gradient
  of a layer's input, ``[T, B, D * H]`` each, and with ``num_layers > 2`` a
  third such buffer the layers swap with;
- the gradients of the initial states (``pre_state_grad``, ``[L * D, B,
  H]`` each: one for GRU / simple RNN, two for LSTM) when PIR types them
  but nothing reads them (the vector has no consumer, so the model sees no
  value);
- per direction, ``[B, H]`` copies of the running state gradients: the last
  hidden state's, the LSTM's last cell state's, and a GRU's (or LSTM's
  without ``pre_state_grad``) previous-state buffer; with per-row
  ``sequence_length`` one more (two for LSTM: the cell backs up the state
  gradients it masks) and a ``[T, B]`` mask of the output's dtype;
- bidirectional: copies of ``out`` and of its gradient split into the two
  directions, ``[T, B, D * H]`` each.

Measured (``paddle.nn.GRU(24, 48)`` / ``LSTM`` on ``[B, 16, 24]``, mean,
SGD, batch 16, peak over the startup's memory): the model with only the
gate gradients fell short by 33,712 bytes for one GRU layer (x_grad 24,576
+ init_h grad 3,072 + two [B, H] 6,144 = 33,792), 135,168 for two layers
(+ 2 x 49,152 + 3,072 more), 187,152 for three (+ 49,152 + 3,072), 141,312
for a two-layer LSTM (init_c grad 6,144 more): every gap exactly this
count (to 80 bytes), and twice the two-layer figure at batch 32.
Bidirectional GRU (1 and 2 layers) and LSTM (2 layers) then fell short by
196,608 bytes each, the two split copies ([16, 16, 96] float32 each).

``pd_op.add_grad`` where ``y`` is broadcast (a bias) and its gradient is
wanted reduces ``out_grad`` through a temporary of ``out_grad``'s size
(Paddle's general broadcast path on CPU): its workspace.

``pd_op.conv2d`` and ``pd_op.depthwise_conv2d`` (Paddle's CPU kernels for
both run im2col + GEMM one image at a time) and their ``_grad`` ops
allocate one *column* buffer for as long as the op runs, unless the
convolution needs no expansion (a 1x1 filter, stride 1, no padding,
dilation 1): ``[C_in / groups * kh * kw, out_h * out_w]`` of the input's
dtype, one image's worth whatever the batch (measured: a U-Net's conv2d
over 24 channels at 32x32 holds 884,736 bytes beyond what PIR's types
show, the gap between the model and the allocator's peak).  NCHW only:
an NHWC convolution also transposes its input and output on CPU (not
modelled).

``pd_op.layer_norm_grad`` (when ``x``'s or ``scale``'s gradient is
wanted) holds two temporaries of ``x``'s shape and dtype (the normalised
``x`` and a product with ``out_grad``) and one of ``mean``'s shape
(``[left]``, the rows normalised) for as long as it runs.  Measured
(``paddle.nn.LayerNorm`` on ``[16, S, D]``, mean, ``append_backward``,
sequential executor, lowest step peak): the allocator's peak exceeded the
model by 264,192 bytes at S=32, D=64 (2 x 131,072 + 512 x 4), 133,120 at
S=32, D=32 (2 x 65,536 + 2,048) and 132,096 at S=16, D=64 (2 x 65,536 +
1,024).

``pd_op.dropout`` with ``is_test`` (a model in eval mode, as
``paddle.jit.save`` writes it) copies or scales ``x`` into ``out`` and
never allocates its ``mask`` (typed as ``x``'s shape in uint8).  Measured
(``F.dropout(x, 0.1, training=False)`` on ``[32, 16, 64]`` float32, PIR):
the allocator's peak was ``x`` plus ``out``, 32,764 bytes under the model
that counted the mask; a jit.saved 2-layer ``TransformerEncoder`` (4 eval
dropouts a layer) with GC off was predicted 4.97 MiB against 4.53 MiB.

``pd_op.lamb`` / ``lamb_`` (``paddle.optimizer.Lamb``, fleet's ``lamb``)
holds, for as long as it runs, the update direction ``trust_ratio_div`` of
the parameter's shape in its compute type (float32 for float16, bfloat16
and float32 parameters, float64 for float64).  Measured (a legacy MLP
64-h-h-1, batch 16, run translated to PIR, GC off, lowest of steps 2-4):
the model without it fell short by 65,612 bytes at h = 128 (the largest
parameter 65,536 bytes) and 262,220 at h = 256 (262,144); Adam: 4,228 at
both.

``pd_op.rprop_`` (``paddle.optimizer.Rprop``) holds, for as long as it
runs, four buffers of the parameter's shape and dtype: a copy of the
gradient, the product of gradient and previous gradient, a copy of the
per-element learning rate and the per-element eta.  Measured (the kernel
alone, ``_C_ops.rprop_`` on float32 ``[N]``, dygraph): the allocator's peak
above its count before was exactly ``4 * 4N`` bytes at N = 2**20 and 2**22.
Without it a PIR MLP 16-1024-1024-4 (batch 64, GC on) measured 33.8 MB a
step against 25.8 MB analysed, and at ``budget=`` the smallest budget
BudgetError named (26.6 MB) a step measured 1.47x the budget.

``pd_op.index_put`` with fewer index tensors than ``x`` has dimensions
(``paddle.optimizer.ASGD`` writing a parameter's row of its ``[batch_num,
*shape]`` history; ``x[idx] = v`` on a leading axis) broadcasts every
index, and a range over each dimension left unindexed, to the result's
shape as int64, and copies the value to that shape unless it is a single
element.  With ``res`` the indexed region (the indices' broadcast shape,
then ``x``'s unindexed dimensions) and ``r`` ``x``'s rank: ``r`` int64
buffers of ``res``, one int64 range per unindexed dimension, and the value
at ``res`` in its dtype.  Measured (the kernel alone, dygraph, float32,
``N = 2**18``): ``x [4, N]``, one ``[1]`` index, ``v [N]``: 7340040 bytes
over its output (the formula: 7340032); ``v`` one element: 6291464
(6291456); ``x [8, N/4]``, a ``[4]`` index, ``v [4, N/4]``: 5.5 x 4N
(5.5 x 4N); ``x [64, 1024]``, an ``[8]`` index: 172032 (172032); ``x [4,
32, 256]``, a ``[2, 1]`` index, ``v [256]``: 461056 (461056); both indices
given: 16 bytes (0).  ``pd_op.set_value_with_tensor``
/ ``_`` holds the value broadcast to the assigned slice of ``x``: measured
``x [2, N]`` whole (2 x 4N), ``x [4, N][1:2]`` with a ``[1, N]`` and a
one-element value (4N each), ``x [4, N][0:4:2]`` (2 x 4N).  Without them a
PIR MLP 16-1024-1024-4 (batch 64) trained by ASGD measured 59.1 MB a step
against 34.0 MB analysed, and at BudgetError's smallest budget (46.6 MB)
1.27x the budget.

Sizes keep the batch dimension symbolic (``-1``), as everywhere in memopt.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..graph import Size, size_of

#: gates per RNN cell, by the rnn op's ``mode`` attribute
GATES = {"LSTM": 4, "GRU": 3, "RNN_RELU": 1, "RNN_TANH": 1}
#: rows of ``reserve`` per layer: gates plus the states kept for backward
_RESERVE_ROWS = {"LSTM": 6, "GRU": 4, "RNN_RELU": 1, "RNN_TANH": 1}


def rnn_outputs(mode: str, num_layers: int, is_test: bool, out_shape: tuple,
                dtype: str) -> Dict[str, Tuple[tuple, str]]:
    """``{output slot: (shape, dtype)}`` for the outputs of ``pd_op.rnn``
    whose PIR type is empty: ``reserve`` and ``dropout_state_out`` (nothing
    when ``is_test``, or for an unknown ``mode``).  ``out_shape`` is the
    op's ``out`` shape ``[T, B, directions * H]`` (``-1`` for the batch)."""
    if is_test or mode not in _RESERVE_ROWS or len(out_shape) != 3:
        return {}
    rows = (num_layers - 1) + _RESERVE_ROWS[mode] * num_layers
    return {"reserve": ((rows, *out_shape), dtype),
            "dropout_state_out": (tuple(out_shape), "uint8")}


def dropout_mask_unfilled(is_test: bool) -> bool:
    """Whether ``pd_op.dropout`` leaves its ``mask`` unallocated: in
    inference (``is_test``) only."""
    return bool(is_test)


def rnn_test_workspace(mode: str, out_shape: tuple, dtype: str, num_layers: int = 1,
                       directions: int = 1, sequence_length: bool = False) -> Optional[Size]:
    """Bytes an inference ``pd_op.rnn`` (``is_test``) holds while it runs
    (see the module docstring), given its ``out`` shape ``[T, B, D * H]``;
    None for an unknown mode.  Parts that do not grow with the batch as
    the gates do are left out."""
    if mode not in GATES or len(out_shape) != 3:
        return None
    total = size_of((GATES[mode], *out_shape), dtype)
    layer = size_of(tuple(out_shape), dtype)
    parts = [layer] * ((directions == 2) + (num_layers > 1))
    steps, batch, width = out_shape
    state = size_of((batch, int(width) // max(1, directions)), dtype)   # [B, H]
    parts += [state] * (1 if mode.startswith("RNN") else 3)
    if sequence_length:
        parts += [size_of((int(steps), batch), dtype)] * 2
    for part in parts:
        if part.power == total.power:
            total = total + part
    return total


def rnn_grad_workspace(mode: str, out_shape: tuple, dtype: str, num_layers: int = 1,
                       x_shape: Optional[tuple] = None,
                       unread_state_grads: Tuple[tuple, ...] = (),
                       has_state_grads: bool = True, directions: int = 1,
                       sequence_length: bool = False) -> Optional[Size]:
    """Bytes ``pd_op.rnn_grad`` holds while it runs (see the module
    docstring), given the forward ``out`` shape ``[T, B, D * H]``;
    ``x_shape`` when the op has no ``x_grad`` result (the kernel allocates
    one anyway), ``unread_state_grads`` the shapes of ``pre_state_grad``
    elements nothing reads, ``has_state_grads`` whether the op has
    ``pre_state_grad`` results at all, ``directions`` 2 when
    bidirectional, ``sequence_length`` whether the op reads per-row
    lengths.  None for an unknown mode; parts that
    do not grow with the batch as the gates do are left out."""
    if mode not in GATES or len(out_shape) != 3:
        return None
    total = size_of((GATES[mode], *out_shape), dtype)
    layer = size_of(tuple(out_shape), dtype)
    parts = [layer] * (0 if num_layers < 2 else 2 if num_layers == 2 else 3)
    if directions == 2:
        parts += [layer, layer]   # out and out_grad split into their two directions
    if x_shape is not None:
        parts.append(size_of(tuple(x_shape), dtype))
    parts += [size_of(tuple(s), dtype) for s in unread_state_grads]
    _, batch, width = out_shape
    state = size_of((batch, int(width) // max(1, directions)), dtype)   # [B, H]
    rows = 1 + (mode == "LSTM") + (not has_state_grads) \
        + (mode == "GRU" or (mode == "LSTM" and not has_state_grads))
    if sequence_length:
        rows += 1 + (mode == "LSTM")          # the cell's backups of the state gradients
        parts.append(size_of((int(out_shape[0]), batch), dtype))   # the [T, B] mask
    parts += [state] * rows
    for part in parts:
        if part.power == total.power:
            total = total + part
    return total


def add_grad_workspace(y_shape: tuple, out_grad_shape: tuple, dtype: str,
                       y_grad_wanted: bool) -> Optional[Size]:
    """Bytes ``pd_op.add_grad`` holds while it runs: a temporary of
    ``out_grad``'s size when ``y`` is broadcast and its gradient is wanted;
    None otherwise."""
    if not y_grad_wanted or tuple(y_shape) == tuple(out_grad_shape):
        return None
    return size_of(tuple(out_grad_shape), dtype)


def conv_workspace(filter_shape: tuple, out_shape: tuple, strides, paddings, dilations,
                   padding_algorithm: str, data_format: str, dtype: str) -> Optional[Size]:
    """Bytes a CPU ``conv2d`` / ``depthwise_conv2d`` (or its ``_grad``) holds
    while it runs: the im2col column buffer of one image,
    ``filter[1] * kh * kw * out_h * out_w`` elements; None when the
    convolution needs no expansion, for NHWC or for shapes it cannot read.
    ``out_shape`` is the forward output's (NCHW), ``filter_shape``
    ``[C_out, C_in / groups, kh, kw]``."""
    if data_format not in ("NCHW", "AnyLayout") or len(filter_shape) != 4 \
            or len(out_shape) != 4 or any(d < 0 for d in (*filter_shape, *out_shape[2:])):
        return None
    kh, kw = int(filter_shape[2]), int(filter_shape[3])
    pads = [0] if padding_algorithm == "VALID" else [int(p) for p in paddings]
    if padding_algorithm == "SAME":
        pads = [1] if (kh, kw) != (1, 1) or any(int(s) != 1 for s in strides) else [0]
    expand = (kh, kw) != (1, 1) or any(int(s) != 1 for s in strides) \
        or any(p != 0 for p in pads) or any(int(d) != 1 for d in dilations)
    if not expand:
        return None
    return size_of((int(filter_shape[1]) * kh * kw, int(out_shape[2]) * int(out_shape[3])),
                   dtype)


def layer_norm_grad_workspace(x_shape: tuple, x_dtype: str, mean_shape: tuple,
                              mean_dtype: str, wanted: bool) -> Optional[Size]:
    """Bytes ``pd_op.layer_norm_grad`` holds while it runs: two temporaries of
    ``x``'s shape and one of ``mean``'s, when ``x``'s or ``scale``'s gradient
    is ``wanted``; None otherwise (or when the parts grow differently with
    the batch)."""
    if not wanted:
        return None
    total = size_of(tuple(x_shape), x_dtype)
    total = total + total
    rows = size_of(tuple(mean_shape), mean_dtype)
    return total + rows if rows.power == total.power else total


def lamb_workspace(param_shape: tuple, dtype: str) -> Size:
    """Bytes ``pd_op.lamb`` / ``lamb_`` holds while it runs: the parameter's
    shape in its compute type (see the module docstring)."""
    return size_of(tuple(param_shape), "float64" if dtype == "float64" else "float32")


#: buffers of the parameter's shape ``pd_op.rprop_``'s CPU kernel allocates
RPROP_BUFFERS = 4


def rprop_workspace(param_shape: tuple, dtype: str) -> Size:
    """Bytes ``pd_op.rprop_`` holds while it runs: RPROP_BUFFERS buffers of
    the parameter's shape and dtype (see the module docstring)."""
    one = size_of(tuple(param_shape), dtype)
    total = one
    for _ in range(RPROP_BUFFERS - 1):
        total = total + one
    return total


def _broadcast(shapes) -> tuple:
    """The broadcast of ``shapes`` (numpy rules; a ``-1`` batch dimension wins)."""
    rank = max((len(sh) for sh in shapes), default=0)
    out = []
    for k in range(rank):
        dims = [sh[len(sh) - rank + k] for sh in shapes if len(sh) - rank + k >= 0]
        out.append(-1 if any(d < 0 for d in dims) else max(dims, default=1))
    return tuple(out)


def index_put_workspace(x_shape: tuple, index_shapes, value_shape: tuple,
                        value_dtype: str) -> Optional[Size]:
    """Bytes ``pd_op.index_put`` holds while it runs for integer indices
    (see the module docstring); None when every dimension is indexed."""
    rank, given = len(x_shape), len(index_shapes)
    if given >= rank or given == 0:
        return None
    res = _broadcast(index_shapes) + tuple(x_shape[given:])
    total = size_of(res, "int64")
    for _ in range(rank - 1):
        total = total + size_of(res, "int64")
    for dim in x_shape[given:]:
        total = total + size_of((dim,), "int64")
    numel = 1
    for d in value_shape:
        numel *= d
    if numel != 1:
        total = total + size_of(res, value_dtype)
    return total


def set_value_workspace(slice_shape: tuple, dtype: str) -> Size:
    """Bytes ``pd_op.set_value_with_tensor`` holds while it runs: the value
    broadcast to the assigned slice (see the module docstring)."""
    return size_of(tuple(slice_shape), dtype)
