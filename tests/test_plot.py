"""memopt.plot: the pictures are written, non-empty PNGs (matplotlib, Agg)."""
import pytest

from memopt.analysis import RuntimeModel, analyze, from_graph
from memopt.problems import Buffer

from test_analysis import chain_graph

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


def test_arena(plot, tmp_path):
    from memopt.bounds import peak_live_bytes

    buffers = [Buffer(0, 0, 3, 100), Buffer(1, 1, 4, 50), Buffer(2, 3, 6, 120)]
    offsets = {0: 0, 1: 100, 2: 150}
    path = plot.plot_arena(buffers, offsets, str(tmp_path / "a.svg"),
                           lower_bound=int(peak_live_bytes(buffers)))
    text = open(path, encoding="utf-8").read()
    assert "<svg" in text and "arena height 270 B" in text
