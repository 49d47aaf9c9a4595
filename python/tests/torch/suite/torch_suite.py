#!/usr/bin/env python3
"""Runs torch's own distributed suite (torch.testing._internal.distributed.
distributed_test, the _DistTestBase torch runs for gloo, nccl and ucc) over
one backend, one test at a time, and records each test's outcome; compares
two such runs.

usage:
  torch_suite.py run --backend gloo|comms [--world-size 4] [--json OUT] [--log LOG]
                     [--build BUILD] [--tests FILE] [-k SUBSTRING]... [--start-method spawn|fork]
                     [--test-timeout S] [--compare BASELINE.json [--allow FILE]] [--skip-unbuilt]
  torch_suite.py compare [--allow FILE] BASELINE.json CANDIDATE.json

run: OUT gets {"backend", "world_size", "torch", "summary", "tests": [{"name",
"outcome" (pass, fail, error, skip), "reason", "seconds", "detail"}]},
rewritten after every test; the ranks' output goes to LOG (default OUT with
.log). --tests FILE runs the names listed there (one per line, # comments);
-k keeps the names containing a substring. --test-timeout caps torch's own
limit per test (300 s; 400 and 500 s for two DDP tests). --compare ends the run with the
comparison below against BASELINE (its exit status, and as counts the
tests that pass on BASELINE: passed, failed (not allowed), skipped
(allowed)). BACKEND=comms imports comms.torch from BUILD/python (default
./build): when it is not built there the run stops with "comms.torch not
built" (exit 2; with --skip-unbuilt, exit 0 after the line "0 passed, 0
failed, 1 skipped", a skip for scripts/run_tests.py). Without --compare,
exit 0 when no test failed or errored.

compare: lists every test that passes on BASELINE and not on CANDIDATE, with
the candidate's outcome and reason (of the tests CANDIDATE ran, when it ran
a selection). Exit 1 when one of them is not in the allow-list FILE (lines
"test_name  # reason"; a reason is required), whatever its outcome (skip,
fail, error, missing); when a listed test passes, or does not pass on
BASELINE (skipped there, or not in its suite): the list is stale; or when
the two runs are on different torch releases (each has its own suite).
"""
import argparse
import contextlib
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

# Variables of whatever launched the driver: the suite spawns its own ranks.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COMMS_STORE",
                      "COMMS_STORE_TOKEN", "COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--backend", required=True)
    run.add_argument("--world-size", type=int, default=4)
    run.add_argument("--json", help="results file (default: torch-suite-BACKEND.json)")
    run.add_argument("--log", help="the ranks' output (default: the results file with .log)")
    run.add_argument("--build", default=os.path.join(SOURCE_ROOT, "build"))
    run.add_argument("--tests", help="file listing the tests to run")
    run.add_argument("-k", action="append", default=[], help="run the tests whose name contains this")
    run.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                     help="how the ranks start: spawn (as torch runs the suite) or fork (faster)")
    run.add_argument("--test-timeout", type=float, help="cap on torch's time limit per test, in seconds")
    run.add_argument("--compare", metavar="BASELINE", help="then compare with this run's results")
    run.add_argument("--allow", metavar="FILE", help="the compare's allow-list")
    run.add_argument("--skip-unbuilt", action="store_true",
                     help="a skip (exit 0) instead of an error (exit 2) when comms.torch is not built")
    compare = sub.add_parser("compare")
    compare.add_argument("--allow", metavar="FILE", help="tests allowed not to pass, each with its reason")
    compare.add_argument("baseline")
    compare.add_argument("candidate")
    return parser.parse_args(argv)


def read_list(path):
    with open(path) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def failure_reason(text):
    """The line that says what went wrong: the last exception line (for a rank's
    error, torch puts the rank's traceback last), else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        # "RuntimeError: ...", not the C++ frames ("Exception raised from ...").
        if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt|Timeout)(:|$)", line):
            return line[:400]
    return lines[-1][:400] if lines else ""


# torch's informational lines in the ranks' output: its logger's info and
# warning lines ("I1127 14:41:30.787000 6162 file.py:1038] ...", "INFO:..."),
# and the profiler's ("USDT:...").
TORCH_LOG_LINE = re.compile(r"^([IW]\d{4} \d\d:\d\d:\d\d|INFO:|USDT:)")


def rank_errors(log_text):
    """The ranks' tracebacks in a test's output, without torch's informational lines."""
    return "\n".join(line for line in log_text.splitlines() if not TORCH_LOG_LINE.match(line))


def skip_reason(reason, name, log_text):
    """torch's generic skip (a rank exited with a skip code) points at the
    rank's log: take the reason the rank logged there."""
    if "look at subprocess log" not in reason:
        return reason
    m = re.search(r"skipping test %s for following reason: (.*)" % re.escape(name), log_text)
    return m.group(1).strip() if m else reason


@contextlib.contextmanager
def output_to(fd):
    """Sends this process's stdout and stderr, and so its ranks', to fd."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def run_test(case_class, name, log):
    """Runs one test; returns its record."""
    result = unittest.TestResult()
    log.flush()
    start_offset = os.lseek(log.fileno(), 0, os.SEEK_END)
    start = time.monotonic()
    with output_to(log.fileno()):
        print("=== %s" % name, flush=True)
        case_class(name).run(result)
    seconds = round(time.monotonic() - start, 2)
    with open(log.name, errors="replace") as f:
        f.seek(start_offset)
        log_text = f.read()
    record = {"name": name, "outcome": "pass", "reason": "", "seconds": seconds}
    if result.skipped:
        record.update(outcome="skip", reason=skip_reason(result.skipped[0][1], name, log_text))
    elif result.errors:
        record.update(outcome="error", reason=failure_reason(result.errors[0][1]), detail=result.errors[0][1][-4000:])
    elif result.failures:
        text = result.failures[0][1]
        reason = failure_reason(text)
        exit_code = re.search(r"Expected exit code 0 but got (-?\d+)", text)
        if exit_code:
            # A rank died outside torch's error reporting (in init_process_group,
            # say): what it raised is in its output.
            reason = "a rank exited with %s: %s" % (exit_code.group(1),
                                                    failure_reason(rank_errors(log_text)) or "no exception in its output")
        record.update(outcome="fail", reason=reason, detail=text[-4000:])
    elif result.unexpectedSuccesses:
        record.update(outcome="fail", reason="unexpected success")
    return record


def summarize(records):
    counts = {k: 0 for k in ("pass", "fail", "error", "skip")}
    for r in records:
        counts[r["outcome"]] += 1
    counts["total"] = len(records)
    return counts


def write_json(path, document):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def prepare_environment(args):
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    # The stand-in for expecttest, and the comms package of the build, for
    # this process and (spawn passes sys.path on) every rank.
    sys.path.insert(0, HERE)
    sys.path.insert(1, os.path.join(os.path.abspath(args.build), "python"))
    # torch's test utilities parse the command line at import: give them none.
    sys.argv = sys.argv[:1]


def run(args):
    prepare_environment(args)
    # comms.torch of BUILD, not one found elsewhere on the path (PYTHONPATH).
    package = os.path.join(os.path.abspath(args.build), "python", "comms", "torch", "__init__.py")
    missing = "comms.torch not built (no %s)" % package if args.backend == "comms" and not os.path.exists(package) else ""
    if not missing:
        try:
            import suite_cases
        except ImportError as e:
            if type(e).__name__ != "CommsTorchNotBuilt":
                raise
            missing = str(e)
    if missing:
        print("torch_suite: %s: build it (tools/dev build with torch installed), or point --build at a build "
              "that has BUILD/python/comms/torch" % missing, file=sys.stderr)
        if args.skip_unbuilt:
            print("0 passed, 0 failed, 1 skipped")
            return 0
        return 2
    import torch
    from torch.testing._internal import common_distributed
    suite_cases.start_method = args.start_method
    if args.test_timeout:
        torch_limit = common_distributed.get_timeout
        common_distributed.get_timeout = lambda test_id: min(torch_limit(test_id), args.test_timeout)
    case_class = suite_cases.TestDistBackendWithSpawn
    names = unittest.TestLoader().getTestCaseNames(case_class)
    if args.tests:
        wanted = read_list(args.tests)
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print("torch_suite: not tests of the suite: %s" % ", ".join(unknown), file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    out = args.json or "torch-suite-%s.json" % args.backend
    log_path = args.log or os.path.splitext(out)[0] + ".log"
    document = {"backend": args.backend, "world_size": args.world_size, "torch": torch.__version__,
                "start_method": args.start_method, "selection": bool(args.tests or args.k),
                "comms_backend": os.environ.get("COMMS_BACKEND", ""), "log": os.path.abspath(log_path),
                "summary": {}, "tests": []}
    started = time.monotonic()
    print("torch_suite: %d tests over %s at world size %d; results in %s, the ranks' output in %s"
          % (len(names), args.backend, args.world_size, out, log_path), flush=True)
    with open(log_path, "w") as log:
        for i, name in enumerate(names):
            record = run_test(case_class, name, log)
            document["tests"].append(record)
            document["summary"] = summarize(document["tests"])
            document["seconds"] = round(time.monotonic() - started, 1)
            write_json(out, document)
            print("[%d/%d] %-5s %6.1fs %s%s" % (i + 1, len(names), record["outcome"], record["seconds"], name,
                                                 "  (" + record["reason"] + ")" if record["reason"] else ""),
                  flush=True)
    s = document["summary"]
    print("torch_suite: %s at world size %d: %d passed, %d failed, %d errors, %d skipped of %d in %.0f s"
          % (args.backend, args.world_size, s["pass"], s["fail"], s["error"], s["skip"], s["total"],
             document["seconds"]))
    if args.compare:
        print()
        return compare_files(args.compare, out, args.allow, counts_line=True)
    # The line scripts/run_tests.py counts.
    print("%d passed, %d failed, %d skipped" % (s["pass"], s["fail"] + s["error"], s["skip"]))
    return 0 if s["fail"] + s["error"] == 0 else 1


def read_allow_list(path):
    """{test name: reason} from lines "name  # reason"."""
    allowed = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            name, _, reason = line.partition("#")
            name, reason = name.strip(), reason.strip()
            if not name:
                continue
            if not reason:
                raise SystemExit("torch_suite: %s:%d: %s has no reason" % (path, number, name))
            allowed[name] = reason
    return allowed


def torch_release(document):
    """"2.15" of a run on torch "2.15.0+cu132"; None where the run did not record it."""
    version = document.get("torch")
    return ".".join(version.split("+")[0].split(".")[:2]) if version else None


def compare_files(baseline_path, candidate_path, allow_path=None, counts_line=False):
    with open(baseline_path) as f:
        baseline = json.load(f)
    with open(candidate_path) as f:
        candidate = json.load(f)
    releases = torch_release(baseline), torch_release(candidate)
    if None not in releases and releases[0] != releases[1]:
        # Each torch release has its own suite (tests added, removed, gated
        # differently): the comparison would list differences of torch's.
        print("torch_suite: %s was recorded on torch %s and %s ran on torch %s: record the baseline on torch %s "
              "(docs/TESTING.md, torch's own suite)" % (baseline_path, releases[0], candidate_path, releases[1],
                                                        releases[1]), file=sys.stderr)
        if counts_line:
            print("0 passed, 1 failed, 0 skipped")
        return 1
    allowed = read_allow_list(allow_path) if allow_path else {}
    theirs = {r["name"]: r for r in candidate["tests"]}
    passing = [r["name"] for r in baseline["tests"] if r["outcome"] == "pass"]
    if candidate.get("selection"):  # -k or --tests: what it ran, not what it left out
        passing = [name for name in passing if name in theirs]
    broken, excused = [], []
    for name in passing:
        r = theirs.get(name, {"outcome": "missing", "reason": "not run on %s" % candidate["backend"]})
        if r["outcome"] == "pass":
            continue
        (excused if name in allowed else broken).append((name, r["outcome"], r["reason"]))
    stale = [name for name in allowed if name_outcome(candidate, name) == "pass"]
    # A listed test that does not pass on the baseline (skipped there, or no
    # longer in torch's suite) excuses nothing: the list is stale too.
    unneeded = [name for name in allowed if name_outcome(baseline, name) != "pass"]
    gained = [r["name"] for r in candidate["tests"]
              if r["outcome"] == "pass" and name_outcome(baseline, r["name"]) != "pass"]
    print("%d of the %d tests that pass on %s pass on %s" % (len(passing) - len(broken) - len(excused), len(passing),
                                                         baseline["backend"], candidate["backend"]))
    for title, rows in (("not passing and not allowed", broken), ("allowed not to pass", excused)):
        if rows:
            print("\n%s on %s (%d):" % (title, candidate["backend"], len(rows)))
            for name, outcome, reason in rows:
                print("  %-60s %-7s %s" % (name, outcome, reason))
    if stale:
        print("\nallowed not to pass, but pass on %s (remove them from %s): %s"
              % (candidate["backend"], allow_path, ", ".join(stale)))
    if unneeded:
        print("\nallowed not to pass, but do not pass on %s either (remove them from %s): %s"
              % (baseline["backend"], allow_path, ", ".join(
                  "%s (%s)" % (name, name_outcome(baseline, name)) for name in unneeded)))
    if gained:
        print("\npass on %s but not on %s (%d): %s" % (candidate["backend"], baseline["backend"], len(gained),
                                                       ", ".join(gained)))
    if counts_line:  # what scripts/run_tests.py counts: the baseline's passing tests
        print("%d passed, %d failed, %d skipped" % (len(passing) - len(broken) - len(excused),
                                                    len(broken) + len(stale) + len(unneeded), len(excused)))
    return 1 if broken or stale or unneeded else 0


def name_outcome(document, name):
    return next((r["outcome"] for r in document["tests"] if r["name"] == name), "missing")


def main(argv):
    args = parse_args(argv)
    if args.command == "compare":
        return compare_files(args.baseline, args.candidate, args.allow)
    # Stopped, the driver takes the ranks of the running test with it.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    try:
        return run(args)
    finally:
        for child in multiprocessing.active_children():
            child.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
