"""The demo: the liveness of a small built-in program (a loop inside a loop).

Later the demo grows into the real main job (memory_optimize on ResNet-50).
"""
from memopt.graph import Graph, Op, Var
from memopt.liveness import analyze_graph


def build() -> Graph:
    g = Graph(fetch_names=("out",))
    b0 = g.global_block
    for name in ("x", "acc", "h", "out"):
        b0.add_var(Var(name, (-1, 256)))
    b0.add_op(Op("feed", writes=("x",)))
    b0.add_op(Op("fill_zeros", writes=("acc",)))
    body = g.new_block(0)
    b0.add_op(Op("while", reads=("x", "acc"), writes=("acc",), sub_blocks=(body.idx,), loop=True))
    body.add_op(Op("relu", reads=("x",), writes=("h",)))
    body.add_op(Op("add", reads=("acc", "h"), writes=("acc",)))
    b0.add_op(Op("mean", reads=("acc",), writes=("out",)))
    return g


def main() -> None:
    graph = build()
    live = analyze_graph(graph)
    print("pos  block  op            live-in -> live-out")
    for pos, (block, _, op) in enumerate(live.positions):
        print(f"{pos:>3}  {block:>5}  {op.type:<12}  {sorted(live.live_in(pos))} -> "
              f"{sorted(live.live_out(pos))}")
    print("\nlive intervals (op positions, inclusive):")
    for name, iv in live.intervals().items():
        print(f"  {name:<4} [{iv.start}, {iv.end}]  {graph.var(name).size}")


if __name__ == "__main__":
    main()
