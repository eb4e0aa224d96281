"""Graph, Block, Op and Var print as a program reads (what a failing test shows)."""
from memopt.graph import Graph, Op, OpFacts, Var


def small_graph() -> Graph:
    g = Graph(fetch_names=("y",))
    b = g.global_block
    b.add_var(Var("x", (-1, 784), is_feed=True, is_data=True))
    b.add_var(Var("w", (784, 10), persistable=True))
    b.add_var(Var("y", (-1, 10), is_fetch=True, label="fc out"))
    b.add_var(Var("steps", kind="step_scopes"))
    b.add_op(Op("matmul", ("x", "w"), ("y",)))
    b.add_op(Op("relu", ("y",), ("y",), role="backward", facts=OpFacts(inplace=("y", "y"))))
    sub = g.new_block(0)
    sub.add_op(Op("add", ("y", "y"), ("z",)))
    b.add_op(Op("while", ("y",), (), sub_blocks=(1,), loop=True))
    return g


def test_graph_prints_as_a_listing():
    assert str(small_graph()).splitlines() == [
        "block 0: 3 ops, 4 vars",
        "  var x: float32[-1, 784] (3136*batch B) feed data",
        "  var w: float32[784, 10] (31360 B) persistable",
        "  var y (fc out): float32[-1, 10] (40*batch B) fetch",
        "  var steps: step_scopes (0 B)",
        "  0: y = matmul(x, w)",
        "  1: y = relu(y)  # backward; inplace=('y', 'y')",
        "  2: while(y)  # loop blocks 1",
        "block 1 (in block 0): 1 ops, 0 vars",
        "  0: z = add(y, y)",
        "fetch: y",
    ]


def test_a_bounded_var_says_at_most_and_an_empty_graph_fetches_nothing():
    from memopt.graph import Size

    assert str(Var("m", (-1,), dtype="int64", bound=Size(800))) == "m: int64[-1] (at most 800 B)"
    assert str(Graph()) == "block 0: 0 ops, 0 vars\nfetch: (nothing)"
