"""Every test under tests/sweeps/ is marked ``sweep``: ``pytest.ini``
deselects them (``-m "not sweep"``); ``make sweep`` (``pytest -m sweep
tests/sweeps``) runs them.  At the end of a run, every cell that was not
``ok`` is listed with its outcome (clean refusals, Paddle failures, bugs)."""
import pytest


@pytest.hookimpl(tryfirst=True)  # before the -m deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/sweeps/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.sweep)


def pytest_terminal_summary(terminalreporter):
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == "sweep_outcome" and not value.startswith("ok"):
                    rows.append((report.nodeid, value))
    if rows:
        terminalreporter.write_sep("-", "sweep cells not ok")
        terminalreporter.write_line("| cell | outcome |")
        terminalreporter.write_line("|---|---|")
        for nodeid, value in sorted(rows):
            terminalreporter.write_line(f"| {nodeid} | {value.replace('|', '/')} |")
