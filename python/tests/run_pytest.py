#!/usr/bin/env python3
"""Runs pytest on some test files and ends with the line scripts/run_tests.py
counts: "N passed, N failed, N skipped" (pytest leaves out zero counts and
reports collection errors separately, which count as failures here).

usage: run_pytest.py BUILD_DIR TEST_FILE... [-- PYTEST_ARGS...]
The package comes from BUILD_DIR/python; the interpreter is this one.
"""
import os
import re
import subprocess
import sys


def main():
    build, rest = os.path.abspath(sys.argv[1]), sys.argv[2:]
    files, extra = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["COMMS_BUILD_DIR"] = build
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python"), here])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"] + files + extra
    proc = subprocess.run(cmd, env=env, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if proc.returncode != 0 and failed == 0:
        failed = 1  # crashed, or collected nothing (exit 5)
    print("%d passed, %d failed, %d skipped" % (counts.get("passed", 0), failed, counts.get("skipped", 0)))
    return 0 if failed == 0 and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
