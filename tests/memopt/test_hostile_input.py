"""Hostile and broken input: memopt never crashes, never corrupts, and says what is wrong.

Each case of issue 8 has a test here:

- ``memory_optimize`` on legacy programs with unknown op types, variables
  missing from the block, ops that read and write one variable, no ops at
  all, a second pass over an optimized program, huge shapes, non-tensor
  variables (tensor arrays, selected rows, step scopes), and wrong argument
  types and values.  Where the call must fail, the exception is a specific
  class whose message names the culprit, and the program's serialized form
  is exactly what it was; where it must work, the program still computes
  bit-identical results on Paddle's executor.
- The ``memopt`` command on corrupt, truncated, hostile (deeply nested JSON,
  binary) and pickle-bearing files: exit code 1 and one line naming the
  file; and loading a model never unpickles anything.
- Interval problems (CSV) with negative sizes, reversed intervals and
  duplicate ids: :class:`~memopt.errors.ProblemFormatError` naming the row,
  and exit 1 from the command.
"""
import pickle

import numpy as np
import pytest

import memopt
from memopt.errors import (GraphError, ModelFileError, ProblemFormatError,
                           UnsupportedProgramError)
from memopt.graph import Graph, Op, OpFacts, Var
from memopt.plan import Options
from memopt.planner import plan_memory

# -- helpers ------------------------------------------------------------------------


def snapshot(program) -> bytes:
    """The serialized program: equal bytes, unchanged program."""
    return program.desc.serialize_to_string()


def legacy_program(paddle, body):
    """``(main, startup, fetch)`` built by ``body(paddle) -> fetch list`` in the legacy IR."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            fetch = body(paddle)
    return main, startup, fetch


def run_fresh(paddle, main, startup, feed, fetch, steps=2):
    """Startup then ``steps`` runs in a fresh scope: fetched arrays of every step."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(startup)
            return [[np.array(a) for a in exe.run(main, feed=feed, fetch_list=fetch)]
                    for _ in range(steps)]


def gc_off():
    from memopt.testing.models import flags

    return flags(eager_delete_tensor_gb=-1.0)


def optimized_same(paddle, body, feed, levels=(0, 1), skip_grads=False):
    """Build twice per level; the optimized program fetches what the original does."""
    from paddle.pir_utils import OldIrGuard

    main, startup, fetch = legacy_program(paddle, body)
    want = run_fresh(paddle, main, startup, feed, fetch)
    reports = []
    for level in levels:
        main, startup, fetch = legacy_program(paddle, body)
        with gc_off(), OldIrGuard():
            report = memopt.memory_optimize(main, skip_opt_set=fetch, level=level,
                                            skip_grads=skip_grads)
            got = run_fresh(paddle, main, startup, feed, fetch)
        for step, (a, b) in enumerate(zip(want, got)):
            for k, (x, y) in enumerate(zip(a, b)):
                assert np.array_equal(x, y), f"level {level}, step {step}, fetch {k}\n{report}"
        reports.append(report)
    return reports


def chain(paddle, x, n=4):
    for _ in range(n):
        x = paddle.nn.functional.relu(paddle.scale(x, 0.5, 0.1))
    return x


# -- unknown op types ------------------------------------------------------------------

def _with_unknown_op(paddle, sub_block=False):
    """relu -> my_unknown_op -> relu chain; the unknown op is added through the
    desc (Python refuses an unregistered type), as a file from another build
    would hold it."""
    def body(p):
        x = p.static.data("x", [-1, 8], "float32")
        a = chain(p, x, 2)
        block = p.static.default_main_program().global_block()
        out = block.create_var(name="unknown_out", shape=[-1, 8], dtype="float32")
        desc = block.desc.append_op()
        desc.set_type("my_unknown_op")
        desc.set_input("X", [a.name])
        desc.set_output("Out", [out.name])
        if sub_block:
            program = p.static.default_main_program()
            sub = program._create_block()
            inner = sub.create_var(name="inner_tmp", shape=[-1, 8], dtype="float32")
            sub.append_op(type="relu", inputs={"X": [out]}, outputs={"Out": [inner]})
            program._rollback()
            desc.set_block_attr("sub_block", sub.desc)
        block._sync_with_cpp()
        return [chain(p, out, 3)]
    return legacy_program(paddle, body)


def test_unknown_op_is_read_conservatively(paddle):
    from memopt.paddle.legacy.program import program_to_graph

    main, _, _ = _with_unknown_op(paddle)
    graph = program_to_graph(main)
    op = next(op for op in graph.global_block.ops if op.type == "my_unknown_op")
    assert op.facts.inplace is None          # never assumed to run in place
    with gc_off():
        report = memopt.memory_optimize(main, level=1)
    assert report.merged_count > 0            # the rest of the program is optimized
    assert all(r.op != "my_unknown_op" for r in report.reuses)
    types = [op.type for op in main.global_block().ops]
    assert types.count("my_unknown_op") == 1   # and the unknown op is kept as it was
    op = main.global_block().ops[types.index("my_unknown_op")]
    # it writes what it wrote: its own variable, or the fresh name that
    # variable's memory (shared with later ones) now lives under
    from memopt.paddle.legacy.program import merged_record

    out = op.output("Out")
    assert out == ["unknown_out"] or merged_record(main).get("unknown_out") == out[0], out


def test_unknown_op_with_a_sub_block(paddle):
    """An unknown op that runs a sub-block is a control-flow op: what it and
    its block touch keeps its own memory."""
    main, _, _ = _with_unknown_op(paddle, sub_block=True)
    assert main.num_blocks == 2
    with gc_off():
        report = memopt.memory_optimize(main, level=1)
    merged = {r.var for r in report.reuses} | {r.takes for r in report.reuses}
    assert "unknown_out" not in merged and "inner_tmp" not in merged


# -- variables missing from the block -----------------------------------------------------

def test_variable_missing_from_the_block(paddle):
    def body(p):
        x = p.static.data("x", [-1, 8], "float32")
        return [chain(p, x)]

    main, _, _ = legacy_program(paddle, body)
    victim = main.global_block().ops[2].output_arg_names[0]
    main.global_block()._remove_var(victim)
    before = snapshot(main)
    with pytest.raises(GraphError, match=victim.replace(".", r"\.")):
        memopt.memory_optimize(main)
    assert snapshot(main) == before
    with pytest.raises(GraphError, match=r"op '\w+'"):  # the op using it is named too
        memopt.memory_optimize(main)


def test_graph_with_an_undeclared_name():
    g = Graph()
    g.global_block.add_var(Var("a", (4,)))
    g.global_block.add_op(Op("relu", ("a",), ("ghost",)))
    with pytest.raises(GraphError, match="'ghost'"):
        g.validate()


# -- ops that read and write the same variable ---------------------------------------------

def test_ops_reading_and_writing_one_variable(paddle):
    """``increment`` and ``assign(output=)`` write a variable they (or earlier
    ops) read; SGD updates a parameter in place."""
    def body(p):
        x = p.static.data("x", [-1, 8], "float32")
        counter = p.full([1], 0, "int64")
        p.increment(counter)                       # X = Out = counter
        h = chain(p, x, 2)
        acc = p.scale(h, 1.0)
        p.assign(p.add(acc, h), output=acc)        # acc = acc + h
        p.increment(counter)
        y = p.static.nn.fc(chain(p, acc, 2), 8)
        loss = p.mean(y)
        p.optimizer.SGD(0.1).minimize(loss)
        return [loss, counter, acc]

    feed = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype("float32")}
    reports = optimized_same(paddle, body, feed)
    assert all(r.merged_count > 0 for r in reports)


# -- empty programs -------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0, 1])
def test_empty_programs(paddle, level):
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        empty = paddle.static.Program()
        only_data = paddle.static.Program()
        with paddle.static.program_guard(only_data, paddle.static.Program()):
            paddle.static.data("x", [-1, 8], "float32")
    for program in (empty, only_data):
        before = snapshot(program)
        with gc_off():
            report = memopt.memory_optimize(program, level=level)
        assert report.merged_count == 0 and snapshot(program) == before
        assert "merged variables: 0" in str(report)
        assert memopt.release_memory(program).merged_count == 0


# -- programs already optimized ---------------------------------------------------------------

def _optimize_twice(paddle, name, level):
    from memopt.testing import models

    model = models.build(name, "legacy")
    keep = [model.fetch_list[1]]
    with model.guard(), gc_off():
        first = memopt.memory_optimize(model.main, skip_opt_set=keep, level=level,
                                       skip_grads=False)
        after_first = snapshot(model.main)
        second = memopt.memory_optimize(model.main, skip_opt_set=keep, level=level,
                                        skip_grads=False)
    return model, first, second, after_first


@pytest.mark.parametrize("name", ["mlp", "cnn", "while_loop", "nested_cond"])
@pytest.mark.parametrize("level", [0, 1])
def test_second_pass_changes_nothing(paddle, name, level):
    """memory_optimize is idempotent (with control flow it once merged 1-2 more
    variables on a second pass, freed by the first pass's dims-only rewrite)."""
    model, first, second, after_first = _optimize_twice(paddle, name, level)
    assert first.merged_count > 0
    assert second.merged_count == 0, str(second)
    assert snapshot(model.main) == after_first


@pytest.mark.parametrize("name", ["while_loop", "nested_cond"])
def test_twice_optimized_is_still_bit_identical(paddle, name):
    from memopt.testing import models

    want = models.run_steps(models.build(name, "legacy"), 3)
    model, _, _, _ = _optimize_twice(paddle, name, 1)
    with gc_off():
        got = models.run_steps(model, 3)
    for a, b in zip(want.fetches + [want.params], got.fetches + [got.params], strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# -- huge shapes -------------------------------------------------------------------------------

def _huge(paddle, shape):
    def body(p):
        x = p.static.data("x", shape, "float32")
        a = p.nn.functional.relu(x)
        b = p.scale(x, 2.0)
        return [p.add(p.add(a, b), x)]
    return legacy_program(paddle, body)[0]


def _peaks(paddle, shape):
    """``(rows, peak before, peak after)`` of memory_optimize(level=1) of
    ``_huge(shape)`` with GC off; ``rows`` is the bytes of one ``[-1, m, n]``
    float32 value at the report's batch."""
    main = _huge(paddle, shape)
    with gc_off():
        report = memopt.memory_optimize(main, level=1)
    return 4 * shape[1] * shape[2] * report.batch_size, report.peak_before, report.peak_after


def _assert_scaled_exactly(paddle, big):
    """The peaks of ``_huge(big)`` are exactly those of the same program at
    small shapes, scaled: each peak is ``k * rows + c`` with the ``k`` and
    ``c`` two small shapes give, to the byte (Python ints, no wrap)."""
    r1, *p1 = _peaks(paddle, [-1, 2, 2])
    r2, *p2 = _peaks(paddle, [-1, 4, 4])
    rows, *got = _peaks(paddle, big)
    for a, b, g in zip(p1, p2, got, strict=True):
        k, rest = divmod(b - a, r2 - r1)
        assert rest == 0 and k >= 1, (a, b)
        assert g == k * rows + (a - k * r1), (g, k, a)


def test_large_but_representable_shapes(paddle):
    """2**40-element tensors (4 TiB each): sizes are exact Python ints, the
    same figures as the program at a small shape, scaled."""
    _assert_scaled_exactly(paddle, [-1, 2 ** 20, 2 ** 20])


def test_huge_shapes_do_not_crash(paddle):
    """A 2**71-byte variable (2**64 bytes per row of the batch): planned
    with exact sizes (once an OverflowError from int64 sums), the same
    figures as the program at a small shape, scaled."""
    _assert_scaled_exactly(paddle, [-1, 2 ** 31, 2 ** 31])


def test_huge_estimates_do_not_wrap(paddle):
    """Four 2**61-byte variables (once wrapped to a negative peak in int64)."""
    main = _huge(paddle, [2 ** 20, 2 ** 20, 2 ** 19])  # 2**61 bytes each, 4 live
    with gc_off():
        report = memopt.memory_optimize(main, level=1)
    assert report.peak_before >= 3 * 2 ** 61 and report.peak_after >= 2 * 2 ** 61


# -- non-tensor variables -------------------------------------------------------------------------

def test_non_tensor_variables(paddle):
    """A tensor array (array_write/array_read), a sparse embedding gradient
    (SELECTED_ROWS) and a while loop's STEP_SCOPES: never merged, and the
    program still computes the same."""
    from paddle.base import core

    def body(p):
        x = p.static.data("x", [-1, 4], "float32")
        ids = p.static.data("ids", [-1, 1], "int64")
        arr = p.tensor.create_array("float32")
        i0, i1 = p.zeros([1], "int64"), p.ones([1], "int64")
        a = p.nn.functional.relu(x)
        p.tensor.array_write(a, i0, array=arr)
        b = p.scale(a, 2.0)
        p.tensor.array_write(b, i1, array=arr)
        c = p.add(p.tensor.array_read(arr, i0), p.tensor.array_read(arr, i1))
        emb = p.reshape(p.nn.Embedding(10, 4, sparse=True)(ids), [-1, 4])
        k = p.full([1], 0, "int64")
        limit = p.full([1], 2, "int64")
        _, h = p.static.nn.while_loop(lambda k, h: k < limit,
                                      lambda k, h: [k + 1, p.nn.functional.relu(h) * 0.5],
                                      [k, p.add(c, emb)])
        loss = p.mean(chain(p, h, 2))
        p.optimizer.SGD(0.1).minimize(loss)
        return [loss]

    main, _, _ = legacy_program(paddle, body)
    kinds = {v.name: v.type for b in main.blocks for v in b.vars.values()}
    special = {n for n, t in kinds.items() if t != core.VarDesc.VarType.DENSE_TENSOR}
    wanted = {core.VarDesc.VarType.DENSE_TENSOR_ARRAY, core.VarDesc.VarType.SELECTED_ROWS,
              core.VarDesc.VarType.STEP_SCOPES}
    assert wanted <= {kinds[n] for n in special}
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((3, 4)).astype("float32"),
            "ids": rng.integers(0, 10, (3, 1)).astype("int64")}
    for report in optimized_same(paddle, body, feed):
        assert report.merged_count > 0
        merged = {r.var for r in report.reuses} | {r.takes for r in report.reuses}
        assert not merged & special


# -- wrong argument types and values ------------------------------------------------------------

BAD_ARGUMENTS = [
    ({"program": "main"}, UnsupportedProgramError, "got str"),
    ({"program": 42}, UnsupportedProgramError, "got int"),
    ({"skip_opt_set": "fc_0.tmp_0"}, TypeError, "skip_opt_set"),
    ({"skip_opt_set": 42}, TypeError, "skip_opt_set"),
    ({"skip_opt_set": ["x", 3]}, TypeError, r"skip_opt_set\[1\]"),
    ({"skip_opt_set": [None]}, TypeError, r"skip_opt_set\[0\]"),
    ({"level": 3}, ValueError, "level"),
    ({"level": -1}, ValueError, "level"),
    ({"level": "1"}, ValueError, "level"),
    ({"level": True}, ValueError, "level"),
    ({"level": None}, ValueError, "level"),
    ({"skip_grads": "yes"}, TypeError, "skip_grads"),
    ({"skip_grads": None}, TypeError, "skip_grads"),
    ({"print_log": 1}, TypeError, "print_log"),
]


@pytest.mark.parametrize("kwargs, error, fragment", BAD_ARGUMENTS,
                         ids=[f"{next(iter(k))}={next(iter(k.values()))!r}"
                              for k, _, _ in BAD_ARGUMENTS])
def test_wrong_arguments(paddle, kwargs, error, fragment):
    def body(p):
        return [chain(p, p.static.data("x", [-1, 8], "float32"))]

    main, _, _ = legacy_program(paddle, body)
    before = snapshot(main)
    kwargs = dict(kwargs)
    program = kwargs.pop("program", main)
    with pytest.raises(error, match=fragment):
        memopt.memory_optimize(program, **kwargs)
    assert snapshot(main) == before


def test_compiled_program_is_refused(paddle):
    def body(p):
        return [chain(p, p.static.data("x", [-1, 8], "float32"))]

    main, _, _ = legacy_program(paddle, body)
    before = snapshot(main)
    with pytest.raises(UnsupportedProgramError,
                       match="CompiledProgram: pass the Program the CompiledProgram was made"):
        memopt.memory_optimize(paddle.static.CompiledProgram(main))
    with pytest.raises(UnsupportedProgramError, match="got str"):
        memopt.release_memory("main")
    assert snapshot(main) == before


def test_plan_memory_on_a_graph_with_a_bad_sub_block():
    g = Graph()
    g.global_block.add_var(Var("a", (4,), is_feed=True))
    g.global_block.add_op(Op("while", ("a",), (), sub_blocks=(7,), loop=True))
    with pytest.raises(GraphError, match="sub-block 7"):
        g.validate()


# -- the command line on hostile files ---------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory, paddle):
    """A small training program saved by paddle.static.save in both IRs."""
    from memopt.testing import models

    root = tmp_path_factory.mktemp("hostile_saved")
    for ir in ("legacy", "pir"):
        model = models.build("mlp", ir=ir, batch_size=4, hidden=16, layers=1)
        with models.ir_guard(ir):
            scope = paddle.static.Scope()
            with paddle.static.scope_guard(scope):
                model.initialize(paddle.static.Executor(paddle.CPUPlace()))
                paddle.static.save(model.main, str(root / f"mlp_{ir}"))
    return root


def cli(capsys, *args):
    """Run ``memopt`` in this process: ``(exit code, stderr lines)``."""
    from memopt.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args] + ["--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


def assert_one_line(code, err, *fragments):
    assert code == 1, (code, err)
    assert len(err) == 1 and err[0].startswith("memopt: error: "), err
    for fragment in fragments:
        assert fragment in err[0], err[0]


@pytest.mark.parametrize("name", ["mlp_legacy.pdmodel", "mlp_pir.json"])
@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.3, 0.7, 0.98])
def test_truncated_model_files(saved, tmp_path, capsys, name, fraction):
    data = (saved / name).read_bytes()
    path = tmp_path / name
    path.write_bytes(data[: int(len(data) * fraction)])
    for command in ("analyze", "optimize"):
        extra = ["-o", tmp_path / "out"] if command == "optimize" else []
        assert_one_line(*cli(capsys, command, path, *extra), str(path))
    assert not list(tmp_path.glob("out*")), "nothing is written from a broken input"


@pytest.mark.parametrize("name", ["mlp_legacy.pdmodel", "mlp_pir.json"])
@pytest.mark.parametrize("seed", range(4))
def test_corrupted_model_files(saved, tmp_path, capsys, name, seed):
    """Random bytes overwritten: either still a program (exit 0) or exit 1
    and one line -- never a traceback."""
    rng = np.random.default_rng(seed)
    data = bytearray((saved / name).read_bytes())
    for pos in rng.integers(0, len(data), 6):
        data[pos] = int(rng.integers(0, 256))
    path = tmp_path / name
    path.write_bytes(bytes(data))
    code, err = cli(capsys, "analyze", path)
    if code != 0:
        assert_one_line(code, err)


def _deep_json(depth: int) -> str:
    """A PIR-looking program whose ops nest ``depth`` regions deep."""
    import json

    node = {"#": "pd_op.relu", "I": [], "O": []}
    for _ in range(depth):
        node = {"#": "pd_op.while", "I": [], "O": [], "regions": [{"blocks": [{"ops": [node]}]}]}
    return json.dumps({"base_code": {"magic": "pir", "version": 1},
                       "program": {"regions": [{"blocks": [{"ops": [node]}]}]}})


@pytest.mark.parametrize("text, fragment", [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),                 # recursion bomb
    (_deep_json(80), "nests too deeply"),
    ('{"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [{"ops": '
     '[{"#": 5}]}]}]}}', "malformed op"),
    ('{"base_code": {"magic": "pir"}, "program": 7}', "no ops"),
    ('{"magic": "pir"}', "not a PIR program"),
    ("", "not valid JSON"),
], ids=["json-bomb", "deep-regions", "bad-op", "no-ops", "not-pir", "empty"])
def test_hostile_json(tmp_path, capsys, text, fragment):
    path = tmp_path / "model.json"
    path.write_text(text)
    assert_one_line(*cli(capsys, "analyze", path), str(path), fragment)


def test_binary_and_empty_files(tmp_path, capsys):
    blob = bytes(range(256)) * 64
    for name, fragment in (("model.pdmodel", "not a valid legacy Paddle program"),
                           ("empty.pdmodel", "is empty"), ("model.csv", "not a UTF-8 text")):
        path = tmp_path / name
        path.write_bytes(b"" if name.startswith("empty") else blob)
        command = "plan" if name.endswith(".csv") else "analyze"
        assert_one_line(*cli(capsys, command, path), str(path), fragment)


class _Payload:
    """Unpickling this creates ``marker``: proof that code from a file ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name", ["model.pdmodel", "model.json", "model.pdparams",
                                  "model.pdiparams", "model"])
def test_pickle_bearing_files_are_refused(tmp_path, capsys, name):
    marker = tmp_path / "code_ran"
    data = pickle.dumps(_Payload(marker), protocol=2)
    path = tmp_path / name
    if name == "model":            # a prefix whose only files are pickles
        (tmp_path / "model.pdparams").write_bytes(data)
        (tmp_path / "model.pdopt").write_bytes(data)
    else:
        path.write_bytes(data)
    code, err = cli(capsys, "analyze", path)
    assert_one_line(code, err, str(path))
    assert not marker.exists(), "memopt unpickled a file"


def test_loading_never_unpickles(saved, monkeypatch):
    """Real saved programs load with every unpickling entry point disabled."""
    import _pickle

    from memopt.paddle.modelio import load_model

    def refuse(*args, **kwargs):
        raise AssertionError("memopt tried to unpickle a file")

    for module in (pickle, _pickle):
        for attr in ("load", "loads", "Unpickler"):
            monkeypatch.setattr(module, attr, refuse)
    for name, ir in (("mlp_legacy.pdmodel", "legacy"), ("mlp_pir.json", "pir"),
                     ("mlp_legacy", "legacy")):
        loaded = load_model(str(saved / name))
        assert loaded.ir == ir and loaded.program is not None


def test_parameter_files_are_named_as_such(saved, capsys):
    assert_one_line(*cli(capsys, "analyze", saved / "mlp_legacy.pdparams"),
                    "parameter file", "mlp_legacy.pdmodel")


# -- interval problems (CSV) --------------------------------------------------------------------------

BAD_CSV = [
    ("id,lower,upper,size\n0,0,4,16\n1,2,6,-8\n", "row 3", "negative size -8"),
    ("id,lower,upper,size\n0,0,4,16\n1,6,2,8\n", "row 3", "empty or reversed"),
    ("id,lower,upper,size\n0,0,4,16\n1,3,3,8\n", "row 3", "empty or reversed"),
    ("id,lower,upper,size\n7,0,4,16\n8,1,2,8\n7,5,6,8\n", "row 4", "duplicate id 7"),
    ("id,lower,upper,size\n0,0,4,1.5\n", "row 2", "'size' must be an integer"),
    ("id,lower,upper,size\n0,0,4\n", "row 2", "3 fields"),
]


@pytest.mark.parametrize("text, row, fragment", BAD_CSV,
                         ids=["negative-size", "reversed", "empty-interval", "duplicate-id",
                              "float-size", "short-row"])
def test_bad_csv_problems(tmp_path, capsys, text, row, fragment):
    from memopt.problems import read_csv

    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ProblemFormatError, match=fragment) as info:
        read_csv(path)
    assert str(path) in str(info.value) and row in str(info.value)
    for command in ("plan", "analyze"):
        assert_one_line(*cli(capsys, command, path), str(path), row, fragment)


def test_binary_csv_names_the_file(tmp_path):
    from memopt.problems import read_csv

    path = tmp_path / "binary.csv"
    path.write_bytes(b"id,lower,upper,size\n" + bytes(range(128, 256)))
    with pytest.raises(ProblemFormatError, match="binary.csv"):
        read_csv(path)


def test_missing_and_directory_inputs(tmp_path, capsys):
    assert_one_line(*cli(capsys, "analyze", tmp_path / "nothing.pdmodel"), "no such file")
    assert_one_line(*cli(capsys, "analyze", tmp_path), "directory")
    assert_one_line(*cli(capsys, "plan", tmp_path / "nothing.csv"), "nothing.csv")


def test_model_file_errors_are_value_errors():
    """Callers can catch the library's file errors as ValueError too."""
    assert issubclass(ModelFileError, ValueError) and issubclass(ProblemFormatError, ValueError)


def test_plan_memory_rejects_nothing_it_cannot_name():
    """A graph whose op writes a variable declared only in a sibling block
    fails validation naming it, before any planning."""
    g = Graph()
    g.global_block.add_var(Var("a", (4,), is_feed=True))
    body = g.new_block(0)
    other = g.new_block(0)
    other.add_var(Var("hidden", (4,)))
    body.add_op(Op("relu", ("a",), ("hidden",)))
    g.global_block.add_op(Op("while", ("a",), (), sub_blocks=(1,), loop=True))
    g.global_block.add_op(Op("conditional_block", ("a",), (), sub_blocks=(2,)))
    with pytest.raises(GraphError, match="'hidden'"):
        g.validate()


# -- the planner on graphs the Paddle adapter never makes -------------------------------------------

def _graph(ops):
    g = Graph()
    for name in ("x", "a", "b", "c", "out"):
        g.global_block.add_var(Var(name, (4,), is_feed=name == "x", is_fetch=name == "out"))
    for op in ops:
        g.global_block.add_op(op)
    g.fetch_names = ("out",)
    return g


def _plan_passes_its_checks(graph):
    """Plan ``graph`` at levels 0 and 1, GC off and on: each plan passes
    memopt.verify's checks and the interpreter's comparison; the plans."""
    from memopt import interpreter
    from memopt.verify import check_plan

    plans = []
    for level in (0, 1):
        for gc in (False, True):
            plan = plan_memory(graph, Options(level=level), gc)
            check_plan(graph, plan)
            assert interpreter.compare(graph, plan.renames) is None
            plans.append(plan)
    return plans


def _shares(plan, a, b):
    """Whether ``plan`` runs ``b`` in place of ``a`` or puts them in one group."""
    return any((i, o) == (a, b) for i, o, _ in plan.inplace) or \
        any(a in group and b in group for group in plan.groups)


def test_op_reading_one_name_twice():
    _plan_passes_its_checks(_graph([
        Op("relu", ("x",), ("a",)), Op("elementwise_add", ("a", "a"), ("b",)),
        Op("relu", ("b",), ("c",)), Op("relu", ("c",), ("out",))]))


def test_inplace_pair_whose_source_is_also_written():
    """An in-place pair (a, b) on an op that also writes a is skipped, not planned."""
    plans = _plan_passes_its_checks(_graph([
        Op("relu", ("x",), ("a",)),
        Op("my_op", ("a",), ("a", "b"), facts=OpFacts(inplace=("a", "b"))),
        Op("relu", ("b",), ("c",)), Op("relu", ("c",), ("out",))]))
    assert not any(_shares(plan, "a", "b") for plan in plans)


def test_inplace_source_never_written():
    """An in-place source nothing wrote before (live at the entry) is not taken over."""
    plans = _plan_passes_its_checks(_graph([
        Op("my_op", ("a",), ("b",), facts=OpFacts(inplace=("a", "b"))),
        Op("relu", ("b",), ("c",)), Op("relu", ("c",), ("out",))]))
    assert not any(_shares(plan, "a", "b") for plan in plans)


# -- programs read back from a file --------------------------------------------------------------------

def _input_into_relu(p):
    x = p.static.data("x", [-1, 8], "float32")
    return [chain(p, x, 4)]


@pytest.mark.parametrize("gc", [False, True])
def test_program_read_back_from_bytes(paddle, gc):
    """A program read back from bytes has lost the Python-only ``is_data``
    flags: its input must still keep its memory (once a PlanError)."""
    from paddle.pir_utils import OldIrGuard

    from memopt.testing.models import flags

    main, startup, fetch = legacy_program(paddle, _input_into_relu)
    feed = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype("float32")}
    want = run_fresh(paddle, main, startup, feed, [fetch[0].name])
    with OldIrGuard():
        loaded = paddle.static.Program.parse_from_string(snapshot(main))
    with flags(eager_delete_tensor_gb=0.0 if gc else -1.0):
        memopt.memory_optimize(loaded, level=1)
        got = run_fresh(paddle, loaded, startup, feed, [fetch[0].name])
    assert all(np.array_equal(a, b) for a, b in zip(want[0], got[0], strict=True))


def test_cli_optimize_of_a_saved_program(paddle, tmp_path, capsys):
    """``memopt optimize`` of a program saved as bytes writes ``out.pdmodel``:
    read back, it shares memory (its temporaries under memopt's names) and
    computes what the saved program does."""
    from paddle.pir_utils import OldIrGuard

    main, startup, fetch = legacy_program(paddle, _input_into_relu)
    path = tmp_path / "chain.pdmodel"
    path.write_bytes(snapshot(main))
    code, err = cli(capsys, "optimize", path, "--level", "1", "-o", tmp_path / "out")
    assert code == 0, err
    with OldIrGuard():
        written = paddle.static.Program.parse_from_string(
            (tmp_path / "out.pdmodel").read_bytes())
    assert any(name.startswith("memopt@") for name in written.global_block().vars)
    feed = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype("float32")}
    want = run_fresh(paddle, main, startup, feed, [fetch[0].name])
    got = run_fresh(paddle, written, startup, feed, [fetch[0].name])
    assert len(want) == len(got) == 2
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a[0], b[0])


# -- scale: work that grows with the program, not with its square ----------------------------------------

def _matmul_chain(n: int) -> Graph:
    """x -> matmul_v2 -> ... (n ops, all [-1, 64] float32, none in place):
    renaming packs the temporaries into two big groups."""
    g = Graph()
    g.global_block.add_var(Var("x", (-1, 64), is_feed=True))
    g.global_block.add_var(Var("w", (64, 64), persistable=True))
    prev = "x"
    for i in range(n):
        name = f"t{i}"
        g.global_block.add_var(Var(name, (-1, 64)))
        g.global_block.add_op(Op("matmul_v2", (prev, "w"), (name,)))
        prev = name
    g.global_block.vars[prev].is_fetch = True
    g.fetch_names = (prev,)
    return g


def test_checking_a_plan_is_linear_in_the_group_size():
    """The compatibility check of a plan grows with the group, not its square
    (it once called compatible() for every pair: 87 of the 100 s
    memory_optimize took on benchmarks/bench_scale.py's 100,000 ops)."""
    from memopt import planner

    calls = [0]
    original = planner._predicates

    def counting(*args, **kwargs):
        compatible, fits = original(*args, **kwargs)

        def counted(a, b):
            calls[0] += 1
            return compatible(a, b)
        return counted, fits

    n = 3000
    graph = _matmul_chain(n)
    planner._predicates = counting
    try:
        plan = plan_memory(graph, Options(level=0), gc=False)
    finally:
        planner._predicates = original
    assert len(plan.groups) == 2 and len(plan.reuses) == n - 3
    assert calls[0] <= 20 * n, f"{calls[0]} compatible() calls for {n} buffers"
