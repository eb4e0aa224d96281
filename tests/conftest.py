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
