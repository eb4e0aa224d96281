"""One measurement or one check per fresh Python process.

Benchmarks and sweeps run each configuration in a new process: Paddle keeps
global state (flags read at import, the allocator's peak, name counters,
the executor's caches) and aborts on some programs (SIGABRT, SIGSEGV), so a
configuration that shares a process measures or breaks the next one.  The
script runs itself in a worker mode (``script flag *args``) that prints one
JSON object on a line of its own; :func:`run_worker` starts it and returns
that object.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional, Sequence

#: the repository root (a worker imports this tree's memopt and autobatch)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_env(extra: Optional[dict] = None) -> dict:
    """This process's environment with the repository first on
    ``PYTHONPATH``, Paddle's C++ logging quiet (``GLOG_minloglevel=2``
    unless set) and ``extra`` added (values made strings)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOG_minloglevel", "2")
    env.update({key: str(value) for key, value in (extra or {}).items()})
    return env


def run_worker(script: str, args: Sequence[Any], env: Optional[dict] = None,
               timeout: float = 1800, flag: str = "--worker",
               python: Optional[str] = None) -> dict:
    """Run ``python script flag *args`` in a new process and return the last
    JSON object it printed on a line of its own (a line starting with
    ``{``).

    Parameters
    ----------
    script : the path of the script (made absolute).
    args : its arguments after ``flag`` (made strings).
    env : variables added to the environment (see :func:`worker_env`).
    timeout : seconds before the process is killed.
    flag : the worker mode's option (``None``: no flag).
    python : the interpreter (default: this one; a peer's own venv, e.g.
        TensorFlow Probability's, passes its ``bin/python``).

    Returns
    -------
    The object; when it printed none, ``{"error": "crashed (exit N): <its
    last stderr line>", "stderr": <its last 4,000 characters>, "crashed":
    True}``, or ``{"error": "timeout after N s", "crashed": True}``.
    """
    cmd = [python or sys.executable, os.path.abspath(script),
           *([flag] if flag else []), *map(str, args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(env),
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s", "crashed": True}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()] or ["?"]
        return {"error": f"crashed (exit {proc.returncode}): {last[-1][:200]}",
                "stderr": proc.stderr[-4000:], "crashed": True}
    return json.loads(lines[-1])
