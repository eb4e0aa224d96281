"""Every code example of README.rst and docs/ runs, and prints what it shows.

Examples are read from the reStructuredText sources:

- ``.. code-block:: python`` runs.  All Python blocks of one file run in
  order in one fresh process (they share one namespace, as a reader follows
  the page), in an empty working directory holding a link to ``examples/``;
  each block is written to a file there first (``README_166.py`` for the
  block at line 166), as a function's source must be readable.
- A ``.. code-block:: text`` that follows a Python block, with no other
  code block between, is what that block prints: compared with doctest's
  checker (``...`` matches anything, runs of whitespace are equal).
- ``.. code-block:: console``: each ``$ memopt ...`` line runs the command
  line in that directory; the lines after it, up to the next ``$``, are its
  output, compared the same way.

Plain ``::`` literal blocks and other languages are shown, not run; so is a
Python block with the option ``:class: no-run``, for code that needs another
environment (TFP's venv, where its own tests run it).  A failure names the
file and line of the block.
"""
from __future__ import annotations

import doctest
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.rst"] + sorted(
    p for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.parts)

_DIRECTIVE = re.compile(r"^(\s*)\.\. code-block::\s*(\w+)\s*$")
_CHECK = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    """One code block: its language, text, first line (1-based) and the
    output it is shown with (None: not checked)."""

    lang: str
    code: str
    line: int
    want: str | None = None
    commands: list[tuple[str, str]] = field(default_factory=list)


def read_blocks(path: Path) -> list[Block]:
    """The code blocks of ``path`` with outputs attached as the module
    docstring says."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        i += 1
        while i < len(lines) and re.match(r"^\s+:\w[\w-]*:", lines[i]):
            if re.match(r"^\s+:class:.*\bno-run\b", lines[i]):
                lang = "shown"   # needs another environment: shown, not run
            i += 1  # directive options (:caption: ...)
        body: list[str] = []
        start = None
        while i < len(lines):
            text = lines[i]
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break
            if text.strip() and start is None:
                start = i + 1
            body.append(text)
            i += 1
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        blocks.append(Block(lang, code, start or i))
    # attach outputs
    out: list[Block] = []
    for block in blocks:
        if block.lang == "text" and out and out[-1].lang == "python" and out[-1].want is None:
            out[-1].want = block.code
            continue
        if block.lang == "console":
            cmds: list[tuple[str, str]] = []
            for text in block.code.splitlines():
                if text.startswith("$ "):
                    cmds.append((text[2:], ""))
                elif cmds:
                    cmds[-1] = (cmds[-1][0], cmds[-1][1] + text + "\n")
            block.commands = cmds
        out.append(block)
    return [b for b in out if b.lang in ("python", "console")]


# The driver runs in the fresh process: it executes each block and writes what
# each printed (or the traceback that stopped it) as JSON to the path given.
_DRIVER = r'''
import contextlib, io, json, os, subprocess, sys, traceback
blocks, out_path = json.load(open(sys.argv[1])), sys.argv[2]
results, ns = [], {"__name__": "__main__"}
for b in blocks:
    if b["lang"] == "python":
        # a real file: inspect (autobatch's frontend) reads functions' source
        with open(b["file"], "w") as f:
            f.write(b["code"])
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(b["code"], b["file"], "exec"), ns)
            results.append({"out": buf.getvalue()})
        except BaseException:
            results.append({"out": buf.getvalue(), "error": traceback.format_exc()})
            break
    else:
        outs = []
        for cmd in b["argv"]:
            run = subprocess.run([sys.executable, "-c",
                                  "import sys; from memopt.cli import main; sys.exit(main())"]
                                 + cmd[1:], capture_output=True, text=True)
            outs.append({"out": run.stdout, "err": run.stderr, "rc": run.returncode})
        results.append({"commands": outs})
json.dump(results, open(out_path, "w"))
'''


def _where(path: Path, block: Block) -> str:
    return f"{path.relative_to(ROOT)}:{block.line}"


def _check(want: str, got: str, where: str) -> None:
    if not _CHECK.check_output(want, got, _FLAGS):
        pytest.fail(f"{where}: the example prints something else than the page shows.\n"
                    f"--- shown ---\n{want}--- printed ---\n{got}")


def _pages_with_examples() -> list[Path]:
    return [p for p in DOCS if read_blocks(p)]


@pytest.mark.parametrize("page", _pages_with_examples(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run_as_shown(page: Path, tmp_path: Path) -> None:
    blocks = read_blocks(page)
    payload = []
    for block in blocks:
        entry: dict = {"lang": block.lang, "where": _where(page, block)}
        if block.lang == "python":
            entry["code"] = block.code
            entry["file"] = str(tmp_path / f"{page.stem}_{block.line}.py")
        else:
            argv = [shlex.split(cmd) for cmd, _ in block.commands]
            for args in argv:
                assert args and args[0] == "memopt", (
                    f"{entry['where']}: console examples run `memopt ...` only, got {args}")
            entry["argv"] = argv
        payload.append(entry)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    spec, result = tmp_path / "blocks.json", tmp_path / "results.json"
    spec.write_text(json.dumps(payload))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_minloglevel="2",
               TF_CPP_MIN_LOG_LEVEL="3", MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, str(driver), str(spec), str(result)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, f"{page.name}: the driver failed\n{run.stderr[-4000:]}"
    results = json.loads(result.read_text())
    for block, res in zip(blocks[:len(results)], results, strict=True):
        where = _where(page, block)
        if "error" in res:
            pytest.fail(f"{where}: the example raised\n{res['error']}")
        if block.lang == "python":
            if block.want is not None:
                _check(block.want, res["out"], where)
            continue
        for (cmd, want), got in zip(block.commands, res["commands"], strict=True):
            assert got["rc"] == 0, f"{where}: `{cmd}` exited {got['rc']}\n{got['err']}"
            if want.strip():
                _check(want, got["out"], f"{where} `{cmd}`")
    assert len(results) == len(blocks), f"{page.name}: only {len(results)} blocks ran"


def test_the_reader_finds_blocks_and_outputs(tmp_path: Path) -> None:
    page = tmp_path / "page.rst"
    page.write_text(textwrap.dedent("""\
        Title
        =====

        .. code-block:: python

            print(1 + 1)

        prints

        .. code-block:: text

            2

        .. code-block:: console

            $ memopt --version
            memopt ...

        ::

            not run

        .. code-block:: python
           :class: no-run

            import tensorflow_probability
        """))
    blocks = read_blocks(page)
    assert [(b.lang, b.line) for b in blocks] == [("python", 6), ("console", 16)]
    assert blocks[0].code == "print(1 + 1)\n" and blocks[0].want == "2\n"
    assert blocks[1].commands == [("memopt --version", "memopt ...\n")]


def test_every_public_name_is_in_the_api_reference() -> None:
    import autobatch
    import memopt

    def documented(page: str) -> set[str]:
        text = (ROOT / "docs" / "reference" / page).read_text(encoding="utf-8")
        names = set(re.findall(r"^\.\. auto\w+:: (\w+)", text, re.M))
        return names | set(re.findall(r"^   (\w+)$", text, re.M))  # autosummary entries

    missing = sorted(f"memopt.{n}" for n in memopt.__all__
                     if n not in documented("memopt.rst"))
    missing += sorted(f"autobatch.{n}" for n in autobatch.__all__
                      if n not in documented("autobatch.rst"))
    assert not missing, f"public names without an entry in docs/reference: {missing}"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.rst").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.rst has {len(lines)} lines; the depth goes in docs/"
