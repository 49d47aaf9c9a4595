#!/usr/bin/env python3
"""Runs every test Meson knows about and sums the per-case results.

Each test binary writes per-rank gtest JSON reports into COMMS_TEST_REPORT_DIR
(tests/support/gtest_main.cc). A case counts once: failed if it failed on any
rank, skipped if skipped everywhere. Tools that are not gtest binaries print a
"N passed, N failed, N skipped" line, which is read instead; anything else
counts as one case by its exit status. The last line printed is the sum:
"N passed, N failed, N skipped".

usage: run_tests.py BUILD_DIR [--filter SUBSTRING]... [--exclude SUBSTRING]...
                    [--exact] [--jobs N] [--label WORD] [--env NAME=VALUE]...
A test runs when its name contains any --filter (is one, with --exact; all
when none is given) and no --exclude. --label prefixes the summary line ("asan: N passed, ...") and
the per-test lines, so tools/dev can run several builds and sum them.
A failed test's whole output is kept in BUILD_DIR/test-logs/ (the path is
printed, with the last 40 lines); a passing test's old log there is removed.

Order: tests Meson may run in parallel go --jobs at a time, then the others
one at a time. A test in the suite "waits" (fault and elastic tests whose
time goes to detection timeouts and heartbeats, a few percent of a core) runs
one at a time on a lane of its own beside all of that: its ranks need little
CPU, and the waiting would otherwise add up on the critical path.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SUMMARY = re.compile(r"(\d+) passed, (\d+) failed(?:, (\d+) skipped)?")
TAIL_LINES = 40


def load_tests(build):
    out = subprocess.run(["meson", "introspect", "--tests", build], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def merge_reports(report_dir):
    """Returns {case: 'passed'|'failed'|'skipped'} merged over ranks, and the
    failure messages."""
    cases, messages = {}, []
    for name in sorted(os.listdir(report_dir)):
        if not name.endswith(".json"):
            continue
        rank = name.rsplit(".rank", 1)[-1].split(".")[0]
        try:
            with open(os.path.join(report_dir, name)) as f:
                report = json.load(f)
        except (OSError, ValueError):
            continue
        for suite in report.get("testsuites", []):
            for case in suite.get("testsuite", []):
                key = suite["name"] + "." + case["name"]
                if case.get("failures"):
                    state = "failed"
                    for failure in case["failures"]:
                        messages.append("rank %s %s: %s" % (rank, key, failure.get("failure", "")[:2000]))
                elif case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                    state = "skipped"
                else:
                    state = "passed"
                previous = cases.get(key)
                if previous == "failed" or state == "failed":
                    cases[key] = "failed"
                elif previous == "passed" or state == "passed":
                    cases[key] = "passed"
                else:
                    cases[key] = state
    return cases, messages


def run_one(test, root):
    env = dict(os.environ)
    env.update(test.get("env") or {})
    timeout = test.get("timeout") or 300
    with tempfile.TemporaryDirectory(prefix="comms-test-") as report_dir:
        env["COMMS_TEST_REPORT_DIR"] = report_dir
        start = time.monotonic()
        proc = subprocess.Popen(test["cmd"], cwd=test.get("workdir") or root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
        elapsed = time.monotonic() - start
        text = output.decode(errors="replace")
        cases, messages = merge_reports(report_dir)

    passed = sum(1 for s in cases.values() if s == "passed")
    failed = sum(1 for s in cases.values() if s == "failed")
    skipped = sum(1 for s in cases.values() if s == "skipped")
    if not cases:
        found = SUMMARY.findall(text)
        if found:
            p, f, s = found[-1]
            passed, failed, skipped = int(p), int(f), int(s or 0)
        elif proc.returncode == 0 and not timed_out:
            passed = 1
    problem = None
    if timed_out:
        problem = "timed out after %ds" % timeout
    elif proc.returncode != 0 and failed == 0:
        problem = "exited with status %d" % proc.returncode
    if problem:
        failed += 1
    return {"name": test["name"], "passed": passed, "failed": failed, "skipped": skipped,
            "elapsed": elapsed, "problem": problem, "output": text, "messages": messages}


def log_path(build, label, name):
    """Where a failed test's output is kept: one file per test (and label, so
    the stages of tools/dev keep theirs apart), under the build dir."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", (label + "-" if label else "") + name)
    return os.path.join(os.path.abspath(build), "test-logs", safe + ".log")


def keep_log(path, result):
    """Writes the failed test's output (and its ranks' failure messages) to
    path; the printed tail is too short for a failure that shows early."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for m in result["messages"]:
            f.write(m + "\n")
        if result["messages"]:
            f.write("--- output ---\n")
        f.write(result["output"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--filter", action="append", default=[])
    parser.add_argument("--exclude", action="append", default=[])
    parser.add_argument("--exact", action="store_true", help="--filter names whole tests")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE set for every test (e.g. sanitizer options)")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra_env = dict(item.split("=", 1) for item in args.env)
    prefix = args.label + ": " if args.label else ""
    tests = [t for t in load_tests(args.build)
             if (not args.filter or any((f == t["name"]) if args.exact else (f in t["name"])
                                        for f in args.filter))
             and not any(x in t["name"] for x in args.exclude)]
    for t in tests:
        t["env"] = dict(t.get("env") or {}, **extra_env)
    waits = [t for t in tests if any(s.split(":")[-1] == "waits" for s in t.get("suite", []))]
    rest = [t for t in tests if t not in waits]
    parallel = [t for t in rest if t.get("is_parallel", True)]
    serial = [t for t in rest if not t.get("is_parallel", True)]

    lock = threading.Lock()
    results = []

    def report(result):
        with lock:
            results.append(result)
            status = "FAIL" if result["failed"] else "ok  "
            print("%s%s %-40s %4d passed %3d failed %3d skipped  %6.1fs%s" % (
                prefix, status, result["name"], result["passed"], result["failed"], result["skipped"],
                result["elapsed"], "  (%s)" % result["problem"] if result["problem"] else ""), flush=True)
            path = log_path(args.build, args.label, result["name"])
            if not result["failed"]:
                if os.path.exists(path):
                    os.remove(path)  # a stale failure's log would mislead
                return
            for m in result["messages"][:20]:
                print("    " + m.replace("\n", "\n    "))
            try:
                keep_log(path, result)
                print("    log: " + path)
            except OSError as e:
                print("    log not kept: %s" % e)
            print("    --- last %d lines of output ---" % TAIL_LINES)
            for line in result["output"].splitlines()[-TAIL_LINES:]:
                print("    " + line)
            sys.stdout.flush()

    def run_all(batch):
        for t in batch:
            try:
                result = run_one(t, root)
            except Exception as e:  # a lane thread's exception would vanish: count it
                result = {"name": t["name"], "passed": 0, "failed": 1, "skipped": 0, "elapsed": 0.0,
                          "problem": "the runner failed: %r" % e, "output": "", "messages": []}
            report(result)

    waits_lane = threading.Thread(target=run_all, args=(waits,))
    waits_lane.start()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for r in pool.map(lambda t: run_one(t, root), parallel):
            report(r)
    run_all(serial)
    waits_lane.join()

    passed = sum(r["passed"] for r in results)
    failed = sum(r["failed"] for r in results)
    skipped = sum(r["skipped"] for r in results)
    print("%s%d passed, %d failed, %d skipped" % (prefix, passed, failed, skipped))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
