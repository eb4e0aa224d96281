"""memopt.problems: buffers, problems, the CSV format and problems from graphs."""
import os

import pytest

from memopt.errors import ProblemFormatError
from memopt.graph import Graph, Op, Size, Var
from memopt.problems import Buffer, Problem, problem_from_graph, read_csv, write_csv
from conftest import need_file

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "minimalloc")  # A and K, vendored


def write(tmp_path, text, name="p.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_buffer_validation():
    assert Buffer(0, 1, 2, 8).overlaps(Buffer(1, 0, 2, 8))
    assert not Buffer(0, 1, 2, 8).overlaps(Buffer(1, 2, 3, 8))  # half-open
    with pytest.raises(ProblemFormatError, match="reversed"):
        Buffer("a", 3, 3, 8)
    with pytest.raises(ProblemFormatError, match="negative size"):
        Buffer("a", 0, 3, -1)
    with pytest.raises(ProblemFormatError, match="negative size"):
        Buffer("a", 0, 3, Size(-4, 1))
    with pytest.raises(ProblemFormatError, match="must be an int"):
        Buffer("a", 0.5, 3, 4)
    with pytest.raises(ProblemFormatError, match="twice"):
        Problem([Buffer("a", 0, 1, 4), Buffer("a", 1, 2, 4)])


def test_round_trip(tmp_path):
    problem = Problem([Buffer(0, 0, 3, 10), Buffer(7, 2, 5, 0), Buffer(3, 1, 9, 4)])
    path = tmp_path / "toy.64.csv"
    write_csv(problem, path)
    back = read_csv(path)
    assert back.buffers == problem.buffers
    assert back.capacity == 64 and back.name == "toy"
    assert read_csv(path, capacity=5).capacity == 5


def test_columns_in_any_order_and_blank_lines(tmp_path):
    path = write(tmp_path, "size,upper,lower,id\n16,4,1,a\n\n8,2,0,b\n")
    problem = read_csv(path)
    assert problem.buffers == [Buffer("a", 1, 4, 16), Buffer("b", 0, 2, 8)]
    assert problem.capacity is None


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("id,lower,upper\n0,0,1\n", "missing \\['size'\\]"),
    ("id,lower,upper,size,alignment\n0,0,1,4,8\n", "unknown \\['alignment'\\]"),
    ("id,lower,upper,size\n0,0,1,4\n1,0,2,-5\n", "row 3: buffer 1 has negative size -5"),
    ("id,lower,upper,size\n0,4,1,4\n", "row 2: buffer 0 has the empty or reversed"),
    ("id,lower,upper,size\n0,1,1,4\n", "row 2: .*empty or reversed"),
    ("id,lower,upper,size\n0,0,1,4\n1,0,1,4\n0,2,3,4\n", "row 4: duplicate id 0 .*row 2"),
    ("id,lower,upper,size\n0,0,x,4\n", "row 2: column 'upper' must be an integer"),
    ("id,lower,upper,size\n0,0,1\n", "row 2: 3 fields, expected 4"),
])
def test_bad_files_name_the_row(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ProblemFormatError, match=message) as info:
        read_csv(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ProblemFormatError, match="cannot read"):
        read_csv(tmp_path / "nope.csv")


def test_symbolic_sizes_are_not_written(tmp_path):
    problem = Problem([Buffer("x", 0, 1, Size(4, 1))])
    with pytest.raises(ProblemFormatError, match="at_batch"):
        write_csv(problem, tmp_path / "s.csv")
    write_csv(problem.at_batch(8), tmp_path / "s.csv")
    assert read_csv(tmp_path / "s.csv").buffers == [Buffer("x", 0, 1, 32)]


def test_minimalloc_files_load():
    path = need_file(os.path.join(DATA, "A.1048576.csv"),
                     "the MiniMalloc problems (tests/data/minimalloc)")
    problem = read_csv(path)
    assert problem.name == "A" and problem.capacity == 1048576
    assert len(problem) == 154


def small_graph():
    """x (fed, batch-sized) -> fc -> h -> relu -> y, with a parameter w."""
    g = Graph(fetch_names=("y",))
    b = g.global_block
    b.add_var(Var("x", (-1, 8), "float32", is_data=True, is_feed=True))
    b.add_var(Var("w", (8, 4), "float32", persistable=True))
    b.add_var(Var("h", (-1, 4), "float32"))
    b.add_var(Var("t", (3,), "int64"))
    b.add_var(Var("y", (-1, 4), "float32"))
    b.add_op(Op("matmul", ("x", "w"), ("h",)))
    b.add_op(Op("shape", ("h",), ("t",)))
    b.add_op(Op("relu", ("h", "t"), ("y",)))
    return g


def test_problem_from_graph_keeps_sizes_symbolic():
    problem = problem_from_graph(small_graph())
    by_id = {b.id: b for b in problem.buffers}
    assert set(by_id) == {"x", "h", "t", "y"}  # the parameter is left out
    assert by_id["x"] == Buffer("x", 0, 1, Size(32, 1))
    assert by_id["h"] == Buffer("h", 0, 3, Size(16, 1))
    assert by_id["t"] == Buffer("t", 1, 3, 24)
    assert by_id["y"] == Buffer("y", 2, 3, Size(16, 1))
    assert problem.symbolic


def test_problem_from_graph_at_a_batch_size():
    problem = problem_from_graph(small_graph(), batch_size=10, include_persistable=True)
    by_id = {b.id: b for b in problem.buffers}
    assert by_id["x"].size == 320 and by_id["w"].size == 128
    assert not problem.symbolic


def test_problem_from_a_real_paddle_program(paddle):
    """Live intervals of a real legacy program: plans on them pass the checker."""
    from memopt.arena import plan_arena
    from memopt.bounds import peak_live_bytes, whole_buffer_lower_bound
    from memopt.testing.models import build
    from memopt.paddle.legacy.program import program_to_graph
    from memopt.reuse import assign_groups
    from memopt.simulate import check_groups, check_offsets

    model = build("cnn", ir="legacy", batch_size=8)
    graph = program_to_graph(model.main)
    symbolic = problem_from_graph(graph)
    assert symbolic.symbolic  # activations keep the batch dimension
    problem = problem_from_graph(graph, batch_size=8)
    assert problem.buffers == symbolic.at_batch(8).buffers
    assert all(b.upper > b.lower and b.size > 0 for b in problem.buffers)
    image = next(b for b in problem.buffers if b.id == "image")
    assert image.size == 8 * 3 * 16 * 16 * 4 and image.lower == 0
    plan = plan_arena(problem)
    assert check_offsets(problem.buffers, plan.offsets) == plan.height
    assert plan.height >= peak_live_bytes(problem.buffers)
    groups = assign_groups(problem.buffers)
    check_groups(problem.buffers, groups)
    assert groups.cost >= whole_buffer_lower_bound(problem.buffers)
