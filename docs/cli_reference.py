"""Sphinx directive ``.. memopt-cli::``: the ``memopt`` command's help text.

The text comes from :func:`memopt.cli.build_parser` at build time, so the
reference cannot drift from the command.
"""
from __future__ import annotations

import argparse
import os

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands here only
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class MemoptCli(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from memopt.cli import build_parser

        os.environ["COLUMNS"] = "88"  # argparse wraps help at this width
        parser = build_parser()
        out: list[nodes.Node] = [nodes.literal_block(text=parser.format_help())]
        for name, sub in _subparsers(parser).items():
            out.append(nodes.rubric(text=f"memopt {name}"))
            out.append(nodes.literal_block(text=sub.format_help()))
        return out


def setup(app):  # noqa: ANN001 - Sphinx's extension hook
    app.add_directive("memopt-cli", MemoptCli)
    return {"parallel_read_safe": True}
