#!/usr/bin/python3
"""tools/dev bench-steady's verdict follows its limits, whatever the timings:
p99 >= p50 always, so a tail limit under 1 must fail every launch and limits
no timing reaches must pass; both write the JSON the table came from.
Usage: bench_steady_test.py BUILD"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "bench_steady.py")


def run(build, out, *limits):
    cmd = [sys.executable, SCRIPT, "--build", build, "--out", out, "--backend", "cpu:gloo", "--launches", "2",
           "--iters", "20", "--warmup", "2", "--timeout", "60"] + list(limits)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=200)
    return p.returncode, p.stdout, json.load(open(os.path.join(out, "steady.json")))


def main():
    build = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as out:
        rc, text, result = run(build, out, "--max-launch-ratio", "1e9", "--max-tail-ratio", "1e9")
        if rc != 0 or not result["pass"] or "FAIL" in text:
            failures.append("limits no timing reaches: exit %d, pass %s\n%s" % (rc, result["pass"], text))
        if len(result["launches"]) != 2:
            failures.append("2 launches asked, %d in the JSON" % len(result["launches"]))
        for launch in result["launches"]:
            for size in ("8", "4096"):
                row = launch["rows"][size]
                if row["wrong"] != 0 or not row["p99_us"] >= row["p50_us"] > 0 or not row["floor_us"] > 0:
                    failures.append("launch row %s: %s" % (size, row))
        rc, text, result = run(build, out, "--max-tail-ratio", "0.5")
        if rc != 1 or result["pass"] or text.count("LONG TAIL") != 4:
            failures.append("tail limit 0.5: exit %d (want 1), pass %s, %d LONG TAIL marks (want 4)\n%s"
                            % (rc, result["pass"], text.count("LONG TAIL"), text))
    for f in failures:
        print("FAIL:", f)
    print("bench_steady: %s" % ("%d failures" % len(failures) if failures else "verdicts follow the limits"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
