"""PIR values are named in messages as the user knows them: the ``name=``
given in Python where there is one, else the op that makes the value, its
position and the line of Python that built it -- with ``%N`` (what
``print(program)`` shows) beside it.  Errors, memory_optimize's report and
print_log, and memopt.analyze's holders all use these labels; the JSON keeps
the raw names and adds the labels."""
import json
import re

import numpy as np
import pytest

import memopt
from memopt.paddle.pir import program as pir

HERE = "test_pir_labels.py"


def _program(paddle):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 8], "float32")
        h = paddle.nn.Linear(8, 8)(x)
        r = paddle.nn.functional.relu(h, name="my_relu")
        s = paddle.add(r, h, name="my_sum")
        loss = paddle.mean(paddle.nn.functional.relu(s))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, {"h": h, "r": r, "s": s, "loss": loss}


def _printed_ops(program):
    """``%N`` -> op name, from print(program)."""
    out = {}
    for line in str(program).splitlines():
        m = re.match(r'\s*\(([^)]*)\) = "([\w.]+)"', line)
        if m:
            for res in m.group(1).split(","):
                out[res.strip()] = m.group(2)
    return out


def test_labels_of_values(paddle):
    main, _, v = _program(paddle)
    pg = pir.convert(main)
    printed = _printed_ops(main)
    name_r, name_s, name_h = pg.name(v["r"]), pg.name(v["s"]), pg.name(v["h"])
    assert pir.label(pg, name_r) == f"'my_relu' ({name_r})"
    assert pir.label(pg, name_s) == f"'my_sum' ({name_s})"
    # no name=: the op, its position, the line that built it, %N beside
    text = pir.label(pg, name_h)
    index = next(k for k, op in enumerate(main.global_block().ops)
                 if any(res.id == v["h"].id for res in op.results()))
    assert text.startswith(f"pd_op.add at op {index}, {HERE}:") and text.endswith(f"({name_h})")
    assert printed[name_h] == "pd_op.add"
    # every %N value of the graph has a label carrying its own name; data and
    # parameters keep their names
    for _, var in pg.graph.all_vars():
        if var.name.startswith("%") and not var.name.startswith(("%arg_", "%stack_")):
            assert var.display.endswith(f"({var.name})"), var.display
        elif not var.name.startswith("%"):
            assert var.display == var.name
    # an op with several results says which
    grads = [var.display for _, var in pg.graph.all_vars() if "pd_op.add_grad" in var.display]
    # (as the op's output slot, which no user-named y_grad can be mistaken for)
    assert any(g.startswith("pd_op.add_grad(...).x_grad at op ") for g in grads)
    assert any(g.startswith("pd_op.add_grad(...).y_grad at op ") for g in grads)


def test_report_and_error_use_labels(paddle, capsys):
    main, startup, v = _program(paddle)
    report = memopt.memory_optimize(main, print_log=True, skip_grads=False)
    out = capsys.readouterr().out
    assert "'my_sum' (%" in out                           # a reuse line names it
    doc = json.loads(report.to_json())
    raw = {n for r in doc["reuses"] for n in (r["var"], r["takes"])}
    assert raw and all(n.startswith("%") for n in raw)    # JSON keeps the names
    assert all(doc["labels"][n].endswith(f"({n})") for n in raw)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.ones((2, 8), "float32")}
    with pytest.raises(memopt.MergedVariableError, match=r"cannot fetch 'my_sum' \(%\d+\)"):
        exe.run(main, feed=feed, fetch_list=[v["s"]])


def test_analysis_holders_use_labels(paddle):
    main, _, v = _program(paddle)
    from memopt.analysis import RuntimeModel

    a = memopt.analyze(main, 4, runtime=RuntimeModel(gc=False, inplace=False))  # all held
    by_name = {h.name: h for h in a.holders}
    s_name = pir.convert(main).name(v["s"])
    assert by_name[s_name].label == f"'my_sum' ({s_name})"
    text = a.report(top=50)
    assert f"'my_sum' ({s_name})" in text
    held = a.to_json(top=50)["held_at_peak"]
    assert all(h["label"].endswith(f"({h['name']})") or h["label"] == h["name"] for h in held)


def test_labels_in_nested_regions(paddle):
    """A value made inside a while body says where the loop is."""
    from memopt.testing import models

    model = models.build("while_loop", "pir")
    pg = pir.convert(model.main)
    inner = [var.display for _, var in pg.graph.all_vars() if " in pd_op.while at op " in
             var.display]
    assert inner and all("models.py:" in d or "_grad" in d or "pd_op." in d for d in inner)
