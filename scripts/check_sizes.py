#!/usr/bin/env python3
"""Keeps files and functions small enough to read.

Fails when a source file under core/, backends/, tools/, scripts/, tests/ or
python/ has more than MAX_FILE_LINES lines, or a function (as Universal Ctags sees it: start and end
line of its body) more than MAX_FUNCTION_LINES, unless EXCEPTIONS below names
it with the reason it must be long. Without ctags it fails (it cannot check
function lengths; tools/dev installs universal-ctags). Prints each violation,
then one "N passed, N failed, N skipped" line (one case) for
scripts/run_tests.py.

usage: check_sizes.py SOURCE_ROOT
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
CHECKED_DIRS = ("core", "backends", "tools", "scripts", "tests", "python")
SUFFIXES = {".cc", ".h", ".c", ".cpp", ".py"}

# "path" or "path:function" -> why it must stay long. Keep this short.
EXCEPTIONS: dict[str, str] = {
    "tests/conformance/error_cases.cc:add_lifecycle_cases": "a table of cases: one registration per case",
    "tests/conformance/op_cases.cc:add_op_cases": "a table of cases: one registration per case",
    "tests/conformance/main.cc:run_suite": "the suite's steps in the order every rank runs them",
    "tests/mp/fault_helper.cc:main": "one branch per fault scenario, read top to bottom",
    "tests/install/install_test.py:run_checks": "the install checks in the order they run",
}


def sources(root: Path):
    for d in CHECKED_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES:
                yield p


def long_functions(root: Path, files):
    out = subprocess.run(
        ["ctags", "-x", "--output-format=json", "--fields=+ne", "--kinds-C++=f",
         "--kinds-C=f", "--kinds-Python=fm", "-f", "-", *map(str, files)],
        cwd=root, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if "end" not in tag:
            continue
        length = tag["end"] - tag["line"] + 1
        if length > MAX_FUNCTION_LINES:
            scope = tag.get("scope", "")
            name = f"{scope}::{tag['name']}" if scope else tag["name"]
            yield tag["path"], tag["line"], name, length


def main() -> int:
    root = Path(sys.argv[1]).resolve()
    if shutil.which("ctags") is None:
        print("check_sizes: ctags (Debian universal-ctags) not found, so function lengths cannot be "
              "checked; install it (tools/dev does)")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    files = list(sources(root))
    problems = []
    for p in files:
        rel = str(p.relative_to(root))
        n = sum(1 for _ in p.open(encoding="utf-8", errors="replace"))
        if n > MAX_FILE_LINES and rel not in EXCEPTIONS:
            problems.append(f"{rel}: {n} lines (limit {MAX_FILE_LINES}): split it along its seams")
    rels = [p.relative_to(root) for p in files]
    for path, line, name, length in long_functions(root, rels):
        short = name.split("::")[-1]
        if f"{path}:{short}" in EXCEPTIONS or f"{path}:{name}" in EXCEPTIONS:
            continue
        problems.append(f"{path}:{line}: {name} is {length} lines (limit {MAX_FUNCTION_LINES})")
    for p in problems:
        print(p)
    print(f"checked {len(files)} files; {len(problems)} over the limits")
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed, 0 skipped")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
