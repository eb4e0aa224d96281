"""``memopt analyze/optimize --html``: the memory page from the command line,
read back as data (the browser tests are in test_pages.py)."""
import json
import re

from test_cli import one_line_error, run_cli, saved  # noqa: F401  (saved: a fixture)


def page_data(path) -> dict:
    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script id="memopt-data" type="application/json">(.*?)</script>', text,
                  re.DOTALL)
    return json.loads(m.group(1))


def test_analyze_html(saved, tmp_path):  # noqa: F811
    out = tmp_path / "page.html"
    result = run_cli("analyze", saved / "mlp_pir.json", "-b", "32", "--json", "--quiet",
                     "--html", out)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # the JSON stays alone on stdout
    (series,) = page_data(out)["lanes"][0]["series"]
    assert series["peak"] == doc["peak_bytes"] and series["peak_x"] == doc["peak_position"]
    assert series["persistable"] == doc["persistable_bytes"]
    assert f"wrote {out}" in result.stderr


def test_optimize_budget_html_and_release_html(saved, tmp_path):  # noqa: F811
    out, page = tmp_path / "budget.json", tmp_path / "budget.html"
    result = run_cli("optimize", saved / "mlp_pir.json", "--budget", "1GiB", "-b", "8",
                     "-o", out, "--json", "--quiet", "--html", page)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    before, after = page_data(page)["lanes"][0]["series"]
    assert after["label"] == "after memory_optimize(level=0, budget=1.0 GiB)"
    # the page draws frees on time; the report's figure is the step peak,
    # which adds the collector's allowance on top of that curve
    assert 0 < before["peak"] + before["persistable"] <= doc["peak_before"]
    assert 0 < after["peak"] + after["persistable"] <= doc["peak_after"]
    # release_memory with the garbage collector off: three programs, one x axis
    out, page = tmp_path / "released.pdmodel", tmp_path / "released.html"
    result = run_cli("optimize", saved / "mlp_legacy.pdmodel", "--level", "1", "--release",
                     "-o", out, "--quiet", "--html", page,
                     env={"FLAGS_eager_delete_tensor_gb": "-1"})
    assert result.returncode == 0, result.stderr
    lane = page_data(page)["lanes"][0]
    assert [s["label"] for s in lane["series"]] == [
        "before", "after memory_optimize(level=1)", "and release_memory"]
    n = len(lane["ops"])
    assert all(len(k) == n for s in lane["series"] for k in s["stack"])
    released = lane["series"][2]
    assert released["added"] and released["peak"] < lane["series"][0]["peak"]
    assert all(t.startswith("added by memopt: pd_op.share_data_")
               for texts in released["added"].values() for t in texts
               if "share_data" in t)


def test_html_output_errors(saved, tmp_path):  # noqa: F811
    one_line_error(run_cli("analyze", saved / "mlp_pir.json", "--html", tmp_path / "p.png",
                           "--quiet"), "--html", ".html")
    one_line_error(run_cli("analyze", saved / "problem.csv", "--html", tmp_path / "p.html",
                           "--quiet"), "--html", "saved program")
    one_line_error(run_cli("analyze", saved / "mlp_pir.json", "--html",
                           tmp_path / "missing" / "p.html", "--quiet"), "--html")


def test_estimate_html(saved, tmp_path):  # noqa: F811
    out = tmp_path / "ranks.html"
    result = run_cli("estimate", saved / "mlp_legacy.pdmodel", "-b", "32", "--dp", "2",
                     "--sharding-stage", "1", "--quiet", "--html", out)
    assert result.returncode == 0, result.stderr
    titles = [lane["title"] for lane in page_data(out)["lanes"]]
    assert [t.split(":")[0] for t in titles] == ["rank 0", "rank 1"]
    assert f"wrote {out}" in result.stdout
