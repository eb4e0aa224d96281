"""Sphinx configuration of memopt's documentation site (``make docs``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import memopt  # noqa: E402

project = "memopt"
author = "the memopt authors"
release = memopt.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "sphinx.ext.autosummary",
    "cli_reference",  # docs/cli_reference.py: the `memopt` command's help, generated
]

templates_path: list[str] = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_theme_options = {"description": "memory planning for ML programs; auto-batching",
                      "fixed_sidebar": True}
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures say it; numpydoc's Parameters explain it
autodoc_default_options = {"members": True, "undoc-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
nitpicky = False
