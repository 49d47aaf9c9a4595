"""Shared helpers: where the build is, and launching scripts under commsrun.

COMMS_BUILD_DIR (set by the Meson test, else ./build) holds tools/commsrun and
python/ (the package). Every job runs with commsrun's --timeout so a hang
fails the test instead of blocking it.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("COMMS_BUILD_DIR", os.path.join(SOURCE_ROOT, "build")))
COMMSRUN = os.path.join(BUILD, "tools", "commsrun")
PYTHON = sys.executable


def job_env(pythonpath=None, **extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath if pythonpath is not None else os.path.join(BUILD, "python")
    env.setdefault("COMMS_BACKEND", "cpu:gloo")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_job(n, args, env=None, timeout=60):
    """Runs `commsrun -n N -- ARGS`; returns the CompletedProcess (text)."""
    cmd = [COMMSRUN, "-n", str(n), "--timeout", str(timeout), "--"] + list(args)
    return subprocess.run(cmd, env=env or job_env(), capture_output=True, text=True, timeout=timeout + 15)


def run_rank_script(n, script, out_dir, *args, env=None, timeout=60):
    """Runs a rank script that writes OUT_DIR/rank<R>.json; returns their contents by rank."""
    proc = run_job(n, [PYTHON, os.path.join(HERE, script), str(out_dir)] + list(args), env=env, timeout=timeout)
    results = []
    for r in range(n):
        path = os.path.join(str(out_dir), "rank%d.json" % r)
        if not os.path.exists(path):
            pytest.fail("rank %d wrote no results (exit %d):\n%s\n%s" % (r, proc.returncode, proc.stdout[-3000:],
                                                                        proc.stderr[-3000:]))
        with open(path) as f:
            results.append(json.load(f))
    return proc, results
