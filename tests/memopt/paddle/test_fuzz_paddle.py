"""Fuzzing memory_optimize on random legacy Paddle programs run by Paddle's
executor: the recipes, how they are built and the property checked are
described in ``tests/fuzz_recipes.py`` (shared with ``scripts/fuzz_paddle.py``).
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
