"""What print_log prints (``str(report)``): the summary first, then the
reuses one line per shared memory, largest first, capped with a count of the
rest; ``report.to_json()`` keeps every reuse."""
import json

from memopt.graph import Size
from memopt.report import SHOWN_GROUPS, SHOWN_PER_GROUP, Report, Reuse


def _report(groups, per_group):
    reuses = []
    for g in range(groups):
        for k in range(per_group):
            prev = f"buf{g}" if k == 0 else f"v{g}_{k - 1}"
            reuses.append(Reuse(var=f"v{g}_{k}", takes=prev, renamed_to=f"buf{g}",
                                shape=(-1, g + 1), dtype="float32",
                                size=Size(4 * (g + 1), 1), how="rename" if k else "in-place",
                                op="" if k else "relu"))
    return Report(reuses=reuses, batch_size=8)


def test_summary_first_then_groups_capped():
    report = _report(groups=40, per_group=6)        # 240 reuses
    lines = str(report).splitlines()
    assert lines[0].startswith("memopt: ")
    head = next(i for i, ln in enumerate(lines) if ln.startswith("  reuses ("))
    assert all("<-" not in ln for ln in lines[:head])        # no reuse before the summary
    assert any("merged variables: 240" in ln for ln in lines[:head])
    body = lines[head + 1:]
    assert len(body) == SHOWN_GROUPS + 1
    # largest memory first: buf39 (160 B per row) down
    assert [ln.split()[0] for ln in body[:3]] == ["buf39", "buf38", "buf37"]
    first = body[0]
    assert "v39_0 (in-place at relu)" in first and f"+{6 - SHOWN_PER_GROUP} more" in first
    rest = 240 - SHOWN_GROUPS * 6
    assert body[-1].strip() == (f"... and {rest} more in {40 - SHOWN_GROUPS} shared memories "
                                "(report.to_json() lists every reuse)")
    doc = json.loads(report.to_json())
    assert len(doc["reuses"]) == 240 == doc["merged_count"]


def test_few_reuses_are_all_shown_without_a_count():
    report = _report(groups=2, per_group=2)
    text = str(report)
    assert "... and" not in text and "more" not in text
    assert text.count("<-") == 2 and "v1_1 (rename)" in text
    assert report.reuse_lines(limit=None) == report.reuse_lines()


def test_nothing_merged_prints_just_the_summary():
    text = str(Report())
    assert "merged variables: 0" in text and "reuses (" not in text


def test_print_log_on_a_real_program(paddle, capsys):
    """memory_optimize(print_log=True) prints the summary before any reuse
    line, and no more lines than the cap."""
    import memopt
    from memopt.testing import models

    model = models.build("resnet50", "legacy", 8, image_size=32)
    with models.flags(eager_delete_tensor_gb=-1.0), model.guard():
        report = memopt.memory_optimize(model.main, level=1, print_log=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("memopt: legacy program, level 1")
    head = out.index(next(ln for ln in out if ln.startswith("  reuses (")))
    assert all("<-" not in ln for ln in out[:head])
    assert len(report.reuses) > SHOWN_GROUPS
    assert sum("<-" in ln for ln in out) <= SHOWN_GROUPS
    assert out[-1].lstrip().startswith("... and ")
    shown = sum(ln.count(" (rename") + ln.count(" (in-place") for ln in out)
    hidden = int(out[-1].split()[2])
    assert shown + hidden + sum(int(x) for ln in out if "<-" in ln
                                for x in [ln.rsplit("+", 1)[-1].split()[0]]
                                if ln.rstrip().endswith(" more")) == len(report.reuses)
