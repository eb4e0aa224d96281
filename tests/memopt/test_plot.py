"""memopt.plot: the pictures are written, non-empty PNGs (matplotlib, Agg)."""
import pytest

from memopt import analyze
from memopt.analysis import RuntimeModel, from_graph
from memopt.problems import Buffer

from test_analysis import chain_graph, declared_chain_graph

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plot():
    from conftest import need

    need("matplotlib")
    from memopt import plot as module

    return module


def test_timeline_before_after(plot, tmp_path):
    model = RuntimeModel(inplace=False, schedule="program")
    before = analyze(chain_graph(), 8, runtime=model)
    after = from_graph(chain_graph(), 8, model, inplace=[(1, "a", "b")])
    path = plot.plot_timeline([before, after], str(tmp_path / "t.png"),
                              labels=["before", "after"], top=3)
    data = open(path, "rb").read()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_timeline_starts_after_declarations_and_names_peaks_in_legend(plot, tmp_path):
    import xml.etree.ElementTree as ET

    model = RuntimeModel(inplace=False)
    before = analyze(declared_chain_graph(), 2, runtime=model)
    after = from_graph(declared_chain_graph(), 2, model, inplace=[(4, "a", "b")])
    assert before.setup_ops() == after.setup_ops() == 3
    path = plot.plot_timeline([before, after], str(tmp_path / "t.svg"),
                              labels=["before", "after"])
    text = open(path, encoding="utf-8").read()
    ET.fromstring(text)  # well-formed
    assert "ops 0-2 declare parameters and feeds" in text
    for label, an in (("before", before), ("after", after)):
        pos = an.peak_position()
        assert f"{label}: peak " in text and f"at op {pos} ({an.op_types[pos]})" in text
    assert text.count(" at op ") == 2  # one per curve, in the legend only


def test_arena(plot, tmp_path):
    from memopt.bounds import peak_live_bytes

    buffers = [Buffer(0, 0, 3, 100), Buffer(1, 1, 4, 50), Buffer(2, 3, 6, 120)]
    offsets = {0: 0, 1: 100, 2: 150}
    path = plot.plot_arena(buffers, offsets, str(tmp_path / "a.svg"),
                           lower_bound=int(peak_live_bytes(buffers)))
    text = open(path, encoding="utf-8").read()
    assert "<svg" in text and "arena height 270 B" in text


def test_bar_names_fit_the_figure(plot):
    """A workspace's name ("workspace of pd_op.rnn_grad at op 28 (rnn_grad)")
    ran off the figure's left edge: bars say "workspace" (the op is on the
    next line) and cut other long names."""
    from memopt.analysis import Holder
    from memopt.graph import Size

    def holder(name, category):
        return Holder(name, (), Size(8, 1), category, "pd_op.rnn_grad", 3, 3, 3)

    assert plot._bar_name(holder("workspace of pd_op.rnn_grad at op 28 (rnn_grad)",
                                 "workspace")) == "workspace"
    long = "a_very_long_variable_name_of_a_legacy_program.tmp_0"
    assert plot._bar_name(holder(long, "gradient")) == long[:plot.BAR_NAME_CHARS - 3] + "..."
    assert plot._bar_name(holder("fc_0.w_0@GRAD", "gradient")) == "fc_0.w_0@GRAD"


def test_bars_name_values_by_user_name_or_source_line(plot):
    """A PIR value's bar said ``%64``: it says the ``name=`` given in Python,
    else the line that built it (and which output of the op), else the op."""
    from memopt.analysis import Holder
    from memopt.graph import Size

    def bar(label):
        return plot._bar_name(Holder("%66", ("%66",), Size(8, 1), "gradient",
                                     "pd_op.matmul_grad", 3, 3, 3, label=label))

    assert bar("'my_sum' (%7)") == "'my_sum'"
    assert bar("pd_op.matmul_grad(...).y_grad at op 59, model.py:12 (%66)") == "model.py:12 .y_grad"
    assert bar("pd_op.conv2d at op 27, models.py:273 (%27)") == "models.py:273"
    assert bar("pd_op.pool2d_grad at op 59 (%72)") == "pool2d_grad %72"
    assert bar("pd_op.relu at op 23 (relu) (%107)") == "relu %107"


def test_after_curve_is_drawn_on_the_original_positions(plot, tmp_path):
    """Two ops memopt adds (its record of the rewrite) moved the after
    curve on: its peak said "op 85" for the op that is op 83 before.  Drawn
    on the original positions, both peaks name the same op."""
    from test_alignment import _bookkeeping, _with_ids

    model = RuntimeModel(inplace=False, schedule="program")
    before = analyze(_with_ids(chain_graph()), 2, runtime=model)
    after = analyze(_bookkeeping(_bookkeeping(_with_ids(chain_graph()), 0, "r0"), 2, "r1"), 2,
                    runtime=model)
    assert after.peak_position() == before.peak_position() + 2
    text = open(plot.plot_timeline([before, after], str(tmp_path / "t.svg"),
                                   labels=["before", "after"]), encoding="utf-8").read()
    pos = before.peak_position()
    assert "before: peak " in text and "after: peak " in text
    assert text.count(f" at op {pos} (scale)") == 2
