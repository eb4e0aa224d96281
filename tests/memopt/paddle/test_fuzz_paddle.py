"""Fuzzing memory_optimize on random legacy Paddle programs run by Paddle's executor.

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

import pytest
from hypothesis import given, strategies as st

from fuzz_recipes import CI_EXAMPLES, _legacy, build, check_recipe, fuzz_settings, recipes, structure


@fuzz_settings(CI_EXAMPLES)
@given(recipes(), st.booleans())
def test_random_programs_bit_identical(paddle, recipe, skip_grads):
    check_recipe(paddle, recipe, skip_grads=skip_grads)


#: A while loop whose counter (int64 [1], 8 B) level 1 once renamed to a
#: float32 [-1, 1, 2] temporary (8*B B: provably large enough).
DTYPE_RECIPE = {"inputs": [2], "ops": [("while", 0, 0, [("reshape", 0)])], "train": False,
                "keep": [], "seed": 0}


def test_level1_keeps_dtypes(paddle):
    """Level 1 once renamed the int64 loop counter to a float32 temporary;
    Paddle's executor reads declared dtypes and refused to run."""
    check_recipe(paddle, DTYPE_RECIPE, configs=[(1, False)])


def test_recipes_reach_control_flow_and_reuse(paddle):
    """A fixed recipe with a loop, a branch, a matmul and training: the
    optimizer really merges something (the fuzzer is not vacuous)."""
    recipe = {
        "inputs": [4, 4],
        "ops": [("matmul", 0, 4, True), ("unary", "relu", 2), ("unary", "relu", 3),
                ("binary", "elementwise_add", 4, 2),
                ("while", 5, 2, [("unary", "relu", 0), ("binary", "elementwise_mul", 0, 1)]),
                ("cond", 6, 0.0, [("unary", "square", 0)], [("reduce", "reduce_mean", 0)]),
                ("unary", "scale", 7), ("matmul", 8, 4, False), ("unary", "relu", 9),
                ("unary", "silu", 10)],
        "train": True, "keep": [], "seed": 7,
    }
    reports = check_recipe(paddle, recipe)
    assert reports[0].merged_count > 0 and reports[1].merged_count > 0
    with _legacy():
        ops = {op.type for blk in build(paddle, recipe).main.blocks for op in blk.ops}
    assert {"while", "conditional_block", "mul", "matmul_v2", "sgd", "select_input"} <= ops, ops


@pytest.mark.parametrize("seed", range(3))
def test_builds_are_deterministic(paddle, seed):
    from hypothesis import find

    recipe = find(recipes(), lambda r: len(r["ops"]) >= 3 and r["seed"] >= seed)
    with _legacy():
        a, b = build(paddle, recipe), build(paddle, recipe)
    assert structure(a.main) == structure(b.main)
