"""memopt.pages: the interactive memory page, its data and a real browser.

Data tests (NumPy only): what the page draws adds up to the analysis's own
figures on the reference's x axis.  Browser tests open the written file in
headless Chromium (Selenium; Debian's chromium and chromium-driver): no
console error, the peak label and the largest holder's name on the page,
hovering the peak shows its op, all of it with every network request
failing.
"""
import json
import re

import pytest
from test_analysis import chain_graph

from memopt import analyze
from memopt.analysis import RuntimeModel, from_graph
from memopt.pages.model import lane, page
from memopt.pages.render import render
from memopt.report import Report

PROGRAM_ORDER = RuntimeModel(inplace=False, schedule="program")


def _read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _page_data(text: str) -> dict:
    m = re.search(r'<script id="memopt-data" type="application/json">(.*?)</script>', text,
                  re.DOTALL)
    return json.loads(m.group(1))


def test_stacks_add_up_to_the_timeline_and_name_the_peak():
    before = analyze(chain_graph(), 2, runtime=PROGRAM_ORDER)
    after = from_graph(chain_graph(), 2, PROGRAM_ORDER, inplace=[(1, "a", "b")])
    data = lane([before, after], ["before", "after"], 2)
    assert [op[0] for op in data["ops"]] == before.op_types
    for s, an in zip(data["series"], (before, after), strict=True):
        totals = [sum(k[x] for k in s["stack"]) for x in range(len(before.op_types))]
        assert totals == [v + an.persistable_bytes(2) for v in an.timeline(2)]
        assert s["peak"] == an.peak(2) and s["peak_x"] == an.peak_position(2)
        assert s["persistable"] == an.persistable_bytes(2) == 64
        top = [s["holders"][i] for i in s["at_peak"]]
        assert [(h[0], h[1]) for h in top] == [(h.label, h.bytes(2))
                                               for h in an.held_at(None, 2)]
    # the parameter W: read by a forward op, so "parameters", not optimizer state
    assert data["series"][0]["stack"][0][0] == 64 and data["series"][0]["stack"][1][0] == 0
    after_top = [data["series"][1]["holders"][i] for i in data["series"][1]["at_peak"]]
    shared = [h for h in after_top if h[7]]
    assert shared and shared[0][7] == ["b"]  # a and b share one buffer: visible


def test_added_ops_are_listed_at_their_x_and_names_come_from_the_original():
    from test_alignment import _bookkeeping, _with_ids

    before = analyze(_with_ids(chain_graph()), 2, runtime=PROGRAM_ORDER)
    g = _bookkeeping(_with_ids(chain_graph()), 3, "memopt@buf_9")
    after = analyze(g, 2, runtime=PROGRAM_ORDER)
    s = lane([before, after], ["before", "after"], 2)["series"][1]
    assert s["added"] == {"2": ["added by memopt: pd_op.full at op 3"]}
    assert s["peak_x"] == before.peak_position(2)
    names = {h[0] for h in s["holders"]}
    # the original's names; what memopt's own op writes says so
    assert {"c", "x", "b", "[added by memopt] memopt@buf_9"} <= names


def test_the_html_is_self_contained_deterministic_and_escaped(tmp_path):
    g = chain_graph()
    g.global_block.vars["c"].label = "</script><script>alert(1)</script>"
    an = analyze(g, 2, runtime=PROGRAM_ORDER)
    a = an.to_html(str(tmp_path / "a.html"))
    b = an.to_html(str(tmp_path / "b.html"))
    text = _read(a)
    assert text == _read(b)
    assert text.count("</script>") == 2  # the data's and the code's: the label is escaped
    names = [h[0] for h in _page_data(text)["lanes"][0]["series"][0]["holders"]]
    assert "</script><script>alert(1)</script>" in names
    assert not external_references(text)


def external_references(text: str) -> list:
    """What in an HTML text would load from elsewhere: ``src=``/``href=``
    to a URL, CSS ``url(...)``/``@import``, ``fetch``/``XMLHttpRequest``."""
    pattern = (r"""(?:src|href)\s*=\s*["']?\s*(?:https?:|//)|url\(\s*["']?\s*(?:https?:|//)"""
               r"""|@import|\bfetch\(|XMLHttpRequest""")
    return re.findall(pattern, text, re.IGNORECASE)


def test_report_without_analyses_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=r"before.to_html\(path, compare=\[after\]\)"):
        Report(released=["x"], operation="release_memory").to_html(str(tmp_path / "r.html"))
    assert not (tmp_path / "r.html").exists()


def test_what_a_report_did():
    assert Report().what() == "memory_optimize(level=0)"
    assert Report(level=2, budget=8 << 20).what() == "memory_optimize(level=2, budget=8.0 MiB)"
    assert Report(operation="release_memory").what() == "release_memory"


def test_page_header(tmp_path):
    an = analyze(chain_graph(), 2, runtime=PROGRAM_ORDER)
    data = page([lane([an], ["program"], 2)], title="T", subtitle="S", notes=["n1"])
    text = render(data)
    assert "<title>T</title>" in text and _page_data(text)["notes"] == ["n1"]


# -- in a real browser -------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    from conftest import REQUIRE_ALL, need

    need("selenium")
    import browser as module

    chrome, driver = module.binaries()
    if not (chrome and driver):
        message = "chromium and chromedriver are not installed (apt-get install chromium " \
                  "chromium-driver)"
        if REQUIRE_ALL:
            pytest.fail(f"MEMOPT_REQUIRE_ALL=1 but {message}", pytrace=False)
        pytest.skip(message)
    with module.chromium(offline=True) as driver:
        yield driver, module


@pytest.fixture(scope="module")
def rewritten_page(tmp_path_factory, paddle):
    """The page of a PIR CNN before and after memory_optimize (level 1)."""
    import memopt
    from memopt.testing.models import build

    m = build("cnn", "pir", 32)
    with m.guard():
        report = memopt.memory_optimize(m.main, level=1, batch_size=32,
                                        fetch_list=m.fetch_list[:1])
    path = str(tmp_path_factory.mktemp("page") / "cnn.html")
    report.to_html(path)
    return path, report


def _format_bytes(n):
    from memopt.report import format_bytes

    return format_bytes(n)


def test_page_loads_shows_the_peak_and_its_holders(browser, rewritten_page):
    driver, module = browser
    path, report = rewritten_page
    module.open_page(driver, path)
    assert module.console_problems(driver) == []
    text = driver.find_element("tag name", "body").text
    before, after = report.analyses
    from memopt.alignment import align

    for label, an in (("before", before), (f"after {report.what()}", after)):
        pos = align(before, an, 32).xs[an.peak_position(32)]  # on before's positions
        peak = (f"{label}: peak {_format_bytes(an.peak(32))} at x {pos} ({before.op_types[pos]} "
                f"at {before.place(pos)})")
        assert peak in text
    largest = after.held_at(None, 32)[0]
    table = driver.find_element("css selector", "table.holders").text
    assert largest.label in table.splitlines()[1]  # first row: sorted by size
    # the table sorts: by name ascending on a click
    header = driver.find_elements("css selector", "table.holders th")[0]
    header.click()
    rows = [r.text for r in driver.find_elements("css selector", "table.holders tbody tr")]
    names = [r.find_element("css selector", "td").text
             for r in driver.find_elements("css selector", "table.holders tbody tr")]
    assert names == sorted(names) and len(rows) >= 5


def test_hovering_the_peak_shows_its_op(browser, rewritten_page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    driver, module = browser
    path, report = rewritten_page
    module.open_page(driver, path)
    before = report.analyses[0]
    for k in (0, 1):
        marker = driver.find_element("id", f"peak-0-{k}")
        ActionChains(driver).move_to_element(marker).perform()
        details = driver.find_element("id", "details-0").text
        x = int(marker.get_attribute("data-x"))
        assert x == before.peak_position(32)
        assert f"x {x} (run position of before)" in details
        assert f"op: {before.op_types[x]} at {before.place(x)}" in details
        assert "(its peak)" in details
    # the arrow keys step one op on
    ActionChains(driver).send_keys(Keys.ARROW_RIGHT).perform()
    x = before.peak_position(32) + 1
    assert f"x {x} (run position of before)" in driver.find_element("id", "details-0").text
    assert module.console_problems(driver) == []


def test_programs_without_ops_or_with_one_draw_cleanly(browser, tmp_path):
    from memopt.graph import Graph, Op, Var

    driver, module = browser
    empty = Graph()
    empty.global_block.add_var(Var("x", (4,), is_data=True))
    one = Graph()
    one.global_block.add_var(Var("x", (4,), is_data=True))
    one.global_block.add_var(Var("y", (4,)))
    one.global_block.add_op(Op("relu", ("x",), ("y",)))
    one.fetch_names = ("y",)
    for k, g in enumerate((empty, one)):
        an = analyze(g, 1)
        module.open_page(driver, an.to_html(str(tmp_path / f"{k}.html")))
        assert module.console_problems(driver) == []
        text = driver.find_element("tag name", "body").text
        assert f"program: peak {an.peak(1)} B at x 0" in text and an.peak(1) == 32 * k


def test_page_needs_no_network(browser, rewritten_page):
    """The browser runs with every request sent to a dead proxy: the page
    still draws, and nothing in it points elsewhere."""
    driver, module = browser
    path, _ = rewritten_page
    assert not external_references(_read(path))
    module.open_page(driver, path)
    assert driver.execute_script("return document.querySelectorAll('svg path').length") > 10
    entries = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; })")
    assert entries == []
    assert module.console_problems(driver) == []


def test_a_bert12_step_page_stays_small(paddle, tmp_path):
    """A 12-layer BERT training step (about 1,450 PIR ops) before and after
    memory_optimize: the file stays under 10 MB (its load time is
    benchmarks/bench_memory_page.py's: target under 2 s)."""
    import os

    import memopt
    from memopt.testing.models import build

    model = build("bert", "pir", 8, layers=12)
    with model.guard():
        report = memopt.memory_optimize(model.main, level=1, batch_size=8,
                                        fetch_list=model.fetch_list[:1])
    assert len(report.analyses[0].op_types) > 1400
    path = report.to_html(str(tmp_path / "bert12.html"))
    assert os.path.getsize(path) < 10 * 1000 * 1000
    lane = _page_data(_read(path))["lanes"][0]
    assert len(lane["ops"]) == len(report.analyses[0].op_types)
    assert [s["peak"] for s in lane["series"]] == [a.peak(8) for a in report.analyses]


def test_estimate_page_has_a_lane_per_rank(paddle, tmp_path):
    """memopt.estimate under fleet's static sharding (legacy, dp=2): each
    rank runs its own program; the page draws one lane per rank, headed by
    that rank's estimated peak.  Without sharding every rank runs one step:
    one lane."""
    from memopt.api import estimate
    from memopt.testing.models import build
    from memopt.report import format_bytes

    model = build("mlp", "legacy", 16)
    with model.guard():
        sharded = estimate(model.main, dp=2, sharding_stage=1, batch_size=32)
        plain = estimate(model.main, dp=2, batch_size=32)
    lanes = _page_data(_read(sharded.to_html(str(tmp_path / "s.html"))))["lanes"]
    assert len(sharded.per_rank) == 2
    assert [lane["title"] for lane in lanes] == [
        f"rank {r}: estimated peak {format_bytes(t)} (all components)"
        for r, t in enumerate(sharded.per_rank)]
    for lane, (_, an) in zip(lanes, sharded.rank_analyses, strict=True):
        (series,) = lane["series"]
        assert series["peak"] == an.peak(sharded.micro_batch_size)
    # the ranks' programs differ (each broadcasts the parameters it does not own)
    assert sharded.rank_analyses[0][1] is not sharded.rank_analyses[1][1]
    (lane,) = _page_data(_read(plain.to_html(str(tmp_path / "p.html"))))["lanes"]
    assert lane["title"].startswith("every rank: estimated peak ")


def test_holder_labels_of_the_adapter_name_values_before_and_after():
    """An adapter may label a buffer beyond its variable (the dygraph path
    names a Layer's output by its path): the page shows that label, for the
    program before and for the same value after the rewrite."""
    import dataclasses

    from test_alignment import _bookkeeping, _with_ids

    before = analyze(_with_ids(chain_graph()), 2, runtime=PROGRAM_ORDER)
    after = analyze(_bookkeeping(_with_ids(chain_graph()), 1), 2, runtime=PROGRAM_ORDER)
    before.holders = [dataclasses.replace(h, label="model.fc1: output") if h.name == "c" else h
                      for h in before.holders]
    series = lane([before, after], ["before", "after"], 2)["series"]
    for s in series:
        names = [s["holders"][i][0] for i in s["at_peak"]]
        assert names[0] == "model.fc1: output"


def test_a_dygraph_step_page(tmp_path):
    """A dygraph training step's analysis has a position beyond its graph's
    ops (the eager ``opt.step()``): the page draws every position, named
    as the analysis names it."""
    from conftest import need

    paddle = need("paddle")
    import memopt
    from paddle.static import InputSpec

    paddle.disable_static()
    try:
        paddle.seed(1)
        model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(),
                                     paddle.nn.Linear(32, 4))

        def step(x, y):
            return paddle.nn.functional.mse_loss(model(x), y)

        opt = paddle.optimizer.Adam(parameters=model.parameters())
        an = memopt.analyze(step, 8, input_spec=[InputSpec([None, 16], "float32"),
                                                  InputSpec([None, 4], "float32")],
                            optimizer=opt)
    finally:
        paddle.enable_static()
    assert len(an.op_types) > sum(1 for _ in an.graph.walk_ops())  # the eager update
    (series,) = _page_data(_read(an.to_html(str(tmp_path / "step.html"))))["lanes"][0]["series"]
    totals = [sum(k[x] for k in series["stack"]) for x in range(len(an.op_types))]
    assert totals == [v + an.persistable_bytes(8) for v in an.timeline(8)]
    top = [series["holders"][i][0] for i in series["at_peak"]]
    assert top == [h.label for h in an.held_at(None, 8)][:len(top)]
