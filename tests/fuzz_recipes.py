"""Random legacy Paddle programs for the memory_optimize fuzzing (shared by
tests/memopt/paddle/test_fuzz_paddle.py and scripts/fuzz_paddle.py).

:func:`recipes` draws a *recipe*: plain data (nested tuples) saying which
real Paddle ops to chain -- elementwise (``elementwise_add``/``sub``/``mul``),
matrix products (``matmul_v2`` appended with ``LayerHelper``, as
``paddle.matmul`` no longer builds legacy programs; ``static.nn.fc``, whose
``mul`` op has a parameter), ``concat``/``split``, ``reshape2`` round trips,
reductions (``reduce_mean``/``reduce_max`` with a broadcast subtract),
activations, ``while`` loops (``static.nn.while_loop``) and
``conditional_block`` branches (two blocks and ``select_input``), optionally
with a backward pass and an SGD step.  :func:`build` turns a recipe into a
legacy ``Program``, the same names every time, so a recipe is built once as
the reference and once per configuration.

Property: for every recipe, every level (0, 1) and both runtime modes of
Paddle's garbage collector (off: renaming; on: in place only), the program
after ``memory_optimize`` fetches bit-identical values (``np.array_equal``)
and ends with bit-identical parameters, over two steps.

CI runs :data:`CI_EXAMPLES` recipes; ``scripts/fuzz_paddle.py`` runs more.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np
from hypothesis import HealthCheck, Phase, settings, strategies as st

CI_EXAMPLES = 30
BATCH = 3
STEPS = 2
WIDTHS = (2, 4, 8)
MAX_WIDTH = 16

UNARY = ("relu", "softmax", "scale", "square", "leaky_relu", "relu6", "silu", "clip")
BINARY = ("elementwise_add", "elementwise_sub", "elementwise_mul")
REDUCE = ("reduce_mean", "reduce_max")

# -- recipes (plain data) ---------------------------------------------------------

_index = st.integers(0, 50)


def _simple():
    """Instructions that keep a value's shape (loop and branch bodies)."""
    return st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(UNARY), _index),
        st.tuples(st.just("binary"), st.sampled_from(BINARY), _index, _index),
        st.tuples(st.just("reduce"), st.sampled_from(REDUCE), _index),
        st.tuples(st.just("reshape"), _index),
    )


def _instruction():
    body = st.lists(_simple(), min_size=1, max_size=4)
    return st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(UNARY), _index),
        st.tuples(st.just("binary"), st.sampled_from(BINARY), _index, _index),
        st.tuples(st.just("matmul"), _index, st.sampled_from(WIDTHS), st.booleans()),
        st.tuples(st.just("concat"), _index, _index),
        st.tuples(st.just("split"), _index),
        st.tuples(st.just("reshape"), _index),
        st.tuples(st.just("reduce"), st.sampled_from(REDUCE), _index),
        st.tuples(st.just("while"), _index, st.integers(0, 3), body),
        st.tuples(st.just("cond"), _index, st.floats(-0.5, 0.5), body, body),
    )


@st.composite
def recipes(draw, max_ops: int = 14) -> Dict[str, Any]:
    """A random program recipe (see the module docstring)."""
    return {
        "inputs": draw(st.lists(st.sampled_from(WIDTHS), min_size=1, max_size=3)),
        "ops": draw(st.lists(_instruction(), min_size=1, max_size=max_ops)),
        "train": draw(st.booleans()),
        "keep": draw(st.lists(_index, max_size=2)),
        "seed": draw(st.integers(0, 2 ** 16)),
    }


# -- building a program -----------------------------------------------------------

@dataclass
class Built:
    """A built recipe: programs, feed, what to fetch, what to keep."""

    main: Any
    startup: Any
    feed: Dict[str, np.ndarray]
    fetch: List[Any]
    keep: List[str] = field(default_factory=list)


def _append(op_type: str, inputs: Dict[str, Any], like, attrs=None, out_dtype=None):
    """Append a raw legacy op with one output ``Out`` (shape inferred by Paddle)."""
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper(op_type)
    out = helper.create_variable_for_type_inference(out_dtype or like.dtype)
    helper.append_op(type=op_type, inputs=inputs, outputs={"Out": [out]}, attrs=attrs or {})
    return out


class _Builder:
    """Builds a recipe's ops; ``values`` are ``(Variable, width)`` of shape
    ``[batch, width]``."""

    def __init__(self, paddle) -> None:
        self.paddle = paddle
        self.values: List[tuple] = []
        self.params = 0

    def pick(self, i: int, width=None):
        pool = [v for v in self.values if width is None or v[1] == width] or self.values
        return pool[i % len(pool)]

    def unary(self, op: str, x):
        F = self.paddle.nn.functional
        p = self.paddle
        fn = {"relu": F.relu, "softmax": F.softmax, "scale": lambda t: p.scale(t, 0.5, 0.25),
              "square": p.square, "leaky_relu": F.leaky_relu, "relu6": F.relu6,
              "silu": F.silu, "clip": lambda t: p.clip(t, -0.5, 0.5)}[op]
        return fn(x)

    def binary(self, op: str, x, y):
        if op == "elementwise_add":
            return self.paddle.add(x, y)
        if op == "elementwise_sub":
            return self.paddle.subtract(x, y)
        return _append("elementwise_mul", {"X": [x], "Y": [y]}, x, {"axis": -1})

    def reduce(self, op: str, x):
        if op == "reduce_mean":
            r = self.paddle.mean(x, axis=1, keepdim=True)
        else:
            r = self.paddle.max(x, axis=1, keepdim=True)
        return self.paddle.subtract(x, r)          # a broadcast back to x's shape

    def reshape(self, x, width: int):
        p = self.paddle
        if width % 2:
            return p.reshape(p.reshape(x, [-1, 1, width]), [-1, width])
        return p.reshape(p.transpose(p.reshape(x, [-1, 2, width // 2]), [0, 2, 1]), [-1, width])

    def simple(self, ins, h, width: int):
        """Apply a shape-keeping instruction to ``h`` (outer values of the same
        width may be read too)."""
        kind = ins[0]
        if kind == "unary":
            return self.unary(ins[1], h)
        if kind == "binary":
            other = self.pick(ins[3], width)[0] if ins[3] % 2 else h
            return self.binary(ins[1], h, other)
        if kind == "reduce":
            return self.reduce(ins[1], h)
        return self.reshape(h, width)

    def run(self, ins) -> None:
        p = self.paddle
        kind = ins[0]
        if kind in ("unary", "reduce", "reshape"):
            x, w = self.pick(ins[-1])
            self.values.append((self.simple(ins, x, w), w))
        elif kind == "binary":
            x, w = self.pick(ins[2])
            y, _ = self.pick(ins[3], w)
            self.values.append((self.binary(ins[1], x, y), w))
        elif kind == "matmul":
            x, w = self.pick(ins[1])
            out_w = ins[2]
            if ins[3]:
                self.params += 1
                y = p.static.nn.fc(x, out_w)
            else:
                weight = p.static.data(f"w{len(self.values)}", [w, out_w], "float32")
                y = _append("matmul_v2", {"X": [x], "Y": [weight]}, x,
                            {"trans_x": False, "trans_y": False})
            self.values.append((y, out_w))
        elif kind == "concat":
            x, w1 = self.pick(ins[1])
            y, w2 = self.pick(ins[2])
            if w1 + w2 <= MAX_WIDTH:
                self.values.append((p.concat([x, y], axis=1), w1 + w2))
        elif kind == "split":
            x, w = self.pick(ins[1])
            if w % 2 == 0:
                a, b = p.split(x, 2, axis=1)
                self.values += [(a, w // 2), (b, w // 2)]
        elif kind == "while":
            self.loop(ins)
        elif kind == "cond":
            self.cond(ins)

    def loop(self, ins) -> None:
        p = self.paddle
        _, i, trips, body = ins
        x, w = self.pick(i)
        h0 = p.scale(x, 1.0)                       # the while op writes its loop variables
        counter = p.full([1], 0, "int64")
        limit = p.full([1], trips, "int64")

        def step(k, h):
            for sub in body:
                h = self.simple(sub, h, w)
            return [k + 1, h]

        _, h = p.static.nn.while_loop(lambda k, h: k < limit, step, [counter, h0])
        self.values.append((h, w))

    def cond(self, ins) -> None:
        from memopt.testing.models import _legacy_cond

        p = self.paddle
        _, i, threshold, true_body, false_body = ins
        x, w = self.pick(i)
        m = p.mean(x)

        def branch(body):
            def fn():
                h = x
                for sub in body:
                    h = self.simple(sub, h, w)
                return h
            return fn

        out = _legacy_cond(m > threshold, m <= threshold, branch(true_body), branch(false_body))
        self.values.append((out, w))


def build(paddle, recipe: Dict[str, Any]) -> Built:
    """Build ``recipe`` as a legacy program (call under ``OldIrGuard``)."""
    rng = np.random.default_rng(recipe["seed"])
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        b = _Builder(paddle)
        for k, width in enumerate(recipe["inputs"]):
            b.values.append((paddle.static.data(f"x{k}", [-1, width], "float32"), width))
        for ins in recipe["ops"]:
            b.run(ins)
        inputs = len(recipe["inputs"])
        made = [v for v, _ in b.values[inputs:]] or [b.values[0][0]]
        read = {n for op in main.global_block().ops for n in op.input_arg_names}
        fetch = [v for v in made if v.name not in read] or [made[-1]]
        for k in recipe["keep"]:
            v = made[k % len(made)]
            if v.name not in {f.name for f in fetch}:
                fetch.append(v)
        if recipe["train"] and b.params:
            loss = paddle.mean(fetch[0])
            paddle.optimizer.SGD(learning_rate=0.1).minimize(loss)
            fetch.insert(0, loss)
    # a fetched variable some op reads must be kept by skip_opt_set (memory_optimize
    # keeps on its own only what nothing reads, and the loss)
    read = {n for blk in main.blocks for op in blk.ops for n in op.input_arg_names}
    keep = [v.name for v in fetch if v.name in read]
    feed = {}
    for var in main.global_block().vars.values():
        if getattr(var, "is_data", False):
            shape = [BATCH if d < 0 else d for d in var.shape]
            feed[var.name] = rng.standard_normal(shape).astype("float32")
    return Built(main, startup, feed, fetch, keep)


def structure(program) -> List[tuple]:
    """Every op of every block with its input and output names (attributes
    such as ``op_namescope`` differ between two builds; names do not)."""
    return [(blk.idx, op.type,
             tuple((k, tuple(op.input(k))) for k in sorted(op.input_names)),
             tuple((k, tuple(op.output(k))) for k in sorted(op.output_names)))
            for blk in program.blocks for op in blk.ops]


@contextlib.contextmanager
def _legacy():
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        yield


def execute(paddle, built: Built, seed: int):
    """Startup (seeded), then :data:`STEPS` steps: fetched arrays and parameters."""
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(seed)
        exe.run(built.startup)
        fetched = [[np.array(a) for a in exe.run(built.main, feed=built.feed,
                                                 fetch_list=built.fetch)]
                   for _ in range(STEPS)]
        params = [np.array(scope.find_var(p.name).get_tensor())
                  for p in sorted(built.main.all_parameters(), key=lambda p: p.name)]
    return fetched, params


def _flags(gc: bool):
    from memopt.testing.models import flags

    return flags(eager_delete_tensor_gb=0.0 if gc else -1.0)


def check_recipe(paddle, recipe, configs=((0, False), (1, False), (0, True), (1, True)),
                 skip_grads: bool = False) -> List[Any]:
    """Reference run, then one optimized run per ``(level, gc)``; assert
    bit-identical results.  Returns the reports."""
    import memopt

    with _legacy():
        ref = build(paddle, recipe)
        want = execute(paddle, ref, recipe["seed"])
        reports = []
        for level, gc in configs:
            built = build(paddle, recipe)
            assert structure(built.main) == structure(ref.main), "builds differ"
            with _flags(gc):
                report = memopt.memory_optimize(built.main, skip_opt_set=built.keep,
                                                skip_grads=skip_grads, level=level)
                got = execute(paddle, built, recipe["seed"])
            where = f"level {level}, gc {'on' if gc else 'off'}"
            for step, (a, b) in enumerate(zip(want[0], got[0], strict=True)):
                for k, (x, y) in enumerate(zip(a, b, strict=True)):
                    assert np.array_equal(x, y, equal_nan=True), \
                        f"{where}: step {step}, fetch {built.fetch[k].name} differs\n{report}"
            for k, (x, y) in enumerate(zip(want[1], got[1], strict=True)):
                assert np.array_equal(x, y), f"{where}: parameter {k} differs\n{report}"
            reports.append(report)
    return reports


def fuzz_settings(max_examples: int, shrink: bool = False, **kwargs):
    """Hypothesis settings for Paddle fuzzing: no deadline, no example
    database; shrinking (slow with an executor per example) only when asked."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=max_examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), phases=phases, **kwargs)


def has_control_flow(recipe) -> bool:
    return any(ins[0] in ("while", "cond") for ins in recipe["ops"])
