"""How many elements the ``-1`` dims of a PIR value hold, where it is not the batch.

Paddle writes ``-1`` for every dim it cannot infer at build time.  memopt
reads a ``-1`` as the batch size ``B`` (:mod:`memopt.graph`), which is what
it is for a fed value and most values computed from one.  Three kinds of
op make a ``-1`` that is something else:

- ops whose output length the data decides: ``masked_select``, ``nonzero``
  (and one-argument ``where`` / ``x[mask]``, which are built on it),
  ``unique``; such a dim holds at most as many elements as the input
  (``masked_select(h, h > 0)`` of a ``[B, 256]`` ``h`` is ``[-1]``: up to
  ``256 * B`` elements, not ``B``);
- ops whose dim is at most the input's same dim but Paddle cannot say
  which: ``slice`` / ``topk`` with tensor bounds, a reduction keeping its
  dims with a tensor axis (``argmax(x, axis=1, keepdim=True)`` is
  ``[-1, -1]``: ``B * B`` elements read as the batch);
- ops that fold the batch into another dim: ``reshape(h, [-1, k])`` of a
  ``[B, 6, 32]`` value is ``[-1, k]`` with ``6 * 32 / k * B`` rows.

:class:`DimExtents` follows each value's extents (a :class:`Size` in
elements per dim: ``c * B**p``) through the ops that make them and the ops
that carry a dim from input to output (same rank, ``-1`` in the same
places: elementwise ops, matmul, their gradients; ``transpose``;
``embedding`` / ``gather_nd`` rows from their indices), and
sets :attr:`memopt.graph.Var.bound` where the extents give another size
than the declared shape.  An extent from the data is the most it can be,
so predictions and ``budget=`` count the worst case.  A legacy program is
read through Paddle's translation to PIR, so the same.  Not followed (read
as the batch, as before): a dim whose length comes from a tensor's values
(``repeat_interleave`` with tensor repeats, ``reshape`` to a shape tensor
with several ``-1``), a reduction dropping dims of a data-decided value,
``gather`` / ``index_select`` rows, ``concat`` along a data-decided dim,
and a while loop's carried values.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from ..graph import DTYPE_BYTES, Size, Var

#: one ``-1`` dim read as the batch
BATCH = Size(1, 1)

#: ops whose output length the data decides, at most the input's elements
DATA_DEPENDENT = frozenset({"pd_op.masked_select", "pd_op.nonzero", "pd_op.unique",
                            "pd_op.unique_consecutive"})
#: ops whose output has exactly the input's elements (one ``-1`` in the output)
NUMEL_PRESERVING = frozenset({"pd_op.reshape", "pd_op.reshape_", "pd_op.flatten",
                              "pd_op.flatten_", "pd_op.squeeze", "pd_op.squeeze_",
                              "pd_op.unsqueeze", "pd_op.unsqueeze_"})
#: ops whose output dim is at most the input's same dim (same rank): slices,
#: topk, and reductions keeping their dims (Paddle leaves every dim of
#: ``argmax(x, axis=1, keepdim=True)`` unknown: ``[-1, -1]`` for a ``[B, 8]`` x)
AT_MOST_INPUT = frozenset({"pd_op.slice", "pd_op.strided_slice", "pd_op.topk",
                           "pd_op.argmax", "pd_op.argmin", "pd_op.max", "pd_op.min",
                           "pd_op.sum", "pd_op.mean", "pd_op.prod", "pd_op.all",
                           "pd_op.any", "pd_op.amax", "pd_op.amin", "pd_op.logsumexp"})
#: ops taking rows from an index: ``embedding(ids, weight)``,
#: ``gather_nd(x, index)`` (``gather`` / ``index_select`` take an axis
#: operand memopt does not read: their dims are carried from ``x``)
INDEXED = frozenset({"pd_op.embedding", "pd_op.gather_nd"})

Extents = Tuple[Size, ...]


def declared(shape: Iterable[int]) -> Extents:
    """The extents a shape says: a ``-1`` is the batch."""
    return tuple(BATCH if int(d) < 0 else Size(int(d), 0) for d in shape)


def _product(extents: Iterable[Size]) -> Size:
    coefficient, power = 1, 0
    for e in extents:
        coefficient *= e.coefficient
        power += e.power
    return Size(coefficient, power)


def _upper(a: Size, b: Size) -> Size:
    """The larger of ``a`` and ``b`` as the batch grows: the higher power
    (a broadcast of a ``[16]``-row value with a ``[B]``-row one has ``B``
    rows, not ``16 * B``), of equal powers the larger coefficient."""
    if a.power != b.power:
        return a if a.power > b.power else b
    return Size(max(a.coefficient, b.coefficient), a.power)


def _per_fixed(total: Size, fixed: int) -> Size:
    """``total`` elements spread over rows of ``fixed`` elements (rounded up)."""
    fixed = max(1, fixed)
    return Size(-(-total.coefficient // fixed), total.power)


def _fill_unknown(shape: tuple, total: Size) -> Extents:
    """Extents of ``shape`` whose ``-1`` dims together hold what ``total``
    elements leave after the fixed dims (all in the first ``-1``)."""
    fixed = 1
    for d in shape:
        if d >= 0:
            fixed *= d
    out, first = [], True
    for d in shape:
        if d >= 0:
            out.append(Size(int(d), 0))
        else:
            out.append(_per_fixed(total, fixed) if first else Size(1, 0))
            first = False
    return tuple(out)


class DimExtents:
    """The extents of every value whose ``-1`` dims are not (all) the batch,
    by variable name; every other value's extents are its shape's."""

    def __init__(self) -> None:
        self.of: Dict[str, Extents] = {}

    def extents(self, var: Var) -> Extents:
        return self.of.get(var.name) or declared(var.shape)

    def visit(self, op_name: str, attrs: dict, reads: list, writes: list,
              grad_of: Optional[dict] = None) -> None:
        """Give each value ``op_name`` writes (``Var``) its extents from the
        ``Var`` s it reads, and its :attr:`Var.bound` where they differ from
        its shape.  ``grad_of``: a gradient's name -> the ``Var`` it is the
        gradient of (same extents; :func:`grad_inputs`)."""
        inputs = [v for v in reads if v is not None and v.is_dense and v.shape]
        for var in writes:
            if var is None or not var.is_dense or not any(d < 0 for d in var.shape):
                continue
            shape = tuple(int(d) for d in var.shape)
            source = (grad_of or {}).get(var.name)
            if source is not None:
                ext = self.extents(source)
                ext = tuple(ext[i] if d < 0 else Size(d, 0) for i, d in enumerate(shape)) \
                    if len(ext) == len(shape) else None
            else:
                ext = self._infer(op_name, attrs, inputs, shape)
            if ext is None or ext == declared(var.shape):
                continue
            self.of[var.name] = ext
            elems = _product(ext)
            var.bound = Size(elems.coefficient * DTYPE_BYTES.get(var.dtype, 4), elems.power)

    def _infer(self, op_name: str, attrs: dict, inputs: list, shape: tuple) -> Optional[Extents]:
        if not inputs:
            return None
        first = self.extents(inputs[0])
        if op_name in DATA_DEPENDENT:
            total = _product(first)
            if op_name == "pd_op.masked_select" and len(inputs) > 1:
                total = _upper(total, _product(self.extents(inputs[1])))
            if op_name == "pd_op.nonzero":   # [n, rank]: n at most the elements
                return tuple(total if d < 0 else Size(d, 0) for d in shape)
            return _fill_unknown(shape, total)
        if op_name in NUMEL_PRESERVING and sum(d < 0 for d in shape) == 1:
            return _fill_unknown(shape, _product(first))
        if op_name in AT_MOST_INPUT and len(first) == len(shape):
            return tuple(first[i] if d < 0 else Size(d, 0) for i, d in enumerate(shape))
        if op_name == "pd_op.transpose":
            perm = [int(p) for p in attrs.get("perm", [])]
            if sorted(perm) == list(range(len(first))) and len(perm) == len(shape):
                return tuple(first[perm[i]] if d < 0 else Size(d, 0)
                             for i, d in enumerate(shape))
            return None
        if op_name in INDEXED and len(inputs) > 1:
            return self._indexed(op_name, inputs, shape)
        if op_name.endswith("_grad"):
            return None  # a gradient not matched to its input: as declared
        return self._carried(inputs, shape)

    def _indexed(self, op_name: str, inputs: list, shape: tuple) -> Optional[Extents]:
        """Rows taken by an index (``embedding``: the ids' dims, then the
        width; ``gather_nd``: the index's dims but the last, then the rest
        of ``x``)."""
        first, second = self.extents(inputs[0]), self.extents(inputs[1])
        if op_name == "pd_op.embedding":   # embedding(ids, weight): ids' dims, the width
            full = first + second[1:]
        else:                              # gather_nd(x, index)
            depth = int(inputs[1].shape[-1]) if inputs[1].shape else -1
            if depth < 0:
                return None
            full = second[:-1] + first[depth:]
        if len(full) != len(shape):
            return None
        return tuple(full[i] if d < 0 else Size(d, 0) for i, d in enumerate(shape))

    def _carried(self, inputs: list, shape: tuple) -> Optional[Extents]:
        """A dim carried from inputs of the same rank with ``-1`` in the same
        places (elementwise ops, matmul, their gradients): the largest."""
        unknown = [i for i, d in enumerate(shape) if d < 0]
        found = None
        for v in inputs:
            vshape = tuple(int(d) for d in v.shape)
            if len(vshape) != len(shape) or [i for i, d in enumerate(vshape) if d < 0] != unknown:
                continue
            ext = self.extents(v)
            found = ext if found is None else tuple(_upper(a, b) for a, b in zip(found, ext))
        if found is None:
            return None
        return tuple(found[i] if d < 0 else Size(d, 0) for i, d in enumerate(shape))


def grad_inputs(pir_op, name_of) -> dict:
    """A ``*_grad`` op's results that are the gradient of one of its
    operands (result slot ``x_grad``, operand slot ``x``): result name ->
    operand name, by ``name_of(value)`` (None for an unnamed value)."""
    if not pir_op.name().endswith("_grad"):
        return {}
    try:
        ins, outs = list(pir_op.get_input_names()), list(pir_op.get_output_names())
    except Exception:
        return {}
    operands = pir_op.operands_source()
    if len(ins) != len(operands):
        return {}
    by_slot = dict(zip(ins, operands))
    found = {}
    for slot, value in zip(outs, pir_op.results()):
        operand = by_slot.get(slot[:-len("_grad")]) if slot.endswith("_grad") else None
        if operand is None or not value.initialized():
            continue
        res, src = name_of(value), name_of(operand)
        if res is not None and src is not None:
            found[res] = src
    return found
