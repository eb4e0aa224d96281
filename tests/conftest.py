"""Shared test set-up.

Tests that need an optional dependency ask for it with :func:`need`.  Where
the package is missing the test is skipped, unless ``MEMOPT_REQUIRE_ALL=1``
(as in CI), where it fails: a green CI run has really run every test.
"""
import importlib
import os

import pytest

REQUIRE_ALL = os.environ.get("MEMOPT_REQUIRE_ALL") == "1"


def pytest_configure(config):
    """Import Paddle (when installed) before any test imports TensorFlow.

    Measured on Paddle 3.3.1 and TensorFlow 2.21 in this venv: ``import
    tensorflow; import paddle`` ends in a segmentation fault inside
    ``paddle/base/core.py``, while ``import paddle; import tensorflow`` works.
    tests/autobatch/ (TensorFlow) is collected before tests/memopt/ (Paddle),
    so Paddle goes first here.
    """
    try:
        importlib.import_module("paddle")
    except ImportError:  # pragma: no cover - the Paddle tests skip (or fail in CI)
        pass


def need(module_name: str):
    """Import and return ``module_name``; skip (or fail in CI) if missing."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:  # pragma: no cover - depends on the machine
        message = f"{module_name} is not installed ({exc})"
        if REQUIRE_ALL:
            pytest.fail(f"MEMOPT_REQUIRE_ALL=1 but {message}", pytrace=False)
        pytest.skip(message)


def need_file(path: str, what: str) -> str:
    """Return ``path``; skip (or fail in CI) when it does not exist."""
    if not os.path.exists(path):
        message = f"{what} not found at {path}"
        if REQUIRE_ALL:
            pytest.fail(f"MEMOPT_REQUIRE_ALL=1 but {message}", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def paddle():
    """Paddle in static mode (PIR by default; tests use OldIrGuard for legacy)."""
    mod = need("paddle")
    mod.enable_static()
    return mod


@pytest.fixture(scope="session")
def tf():
    """TensorFlow, real."""
    return need("tensorflow")


# Sweeps (tests/sweeps/): every test there is marked ``sweep``; pytest.ini
# deselects them (``-m "not sweep"``) and ``make sweep`` runs them.  These
# hooks live here, not in a tests/sweeps/conftest.py: test modules import
# this file as ``conftest`` (``from conftest import need``), and a second
# conftest module would take that name over.

@pytest.hookimpl(tryfirst=True)  # before the -m deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/sweeps/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.sweep)


def pytest_terminal_summary(terminalreporter):
    """At the end of a run, every sweep cell that was not ``ok`` is listed
    with its outcome (clean refusals, Paddle failures, bugs)."""
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
