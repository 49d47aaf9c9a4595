#!/usr/bin/env python3
"""Builds the plugin of docs/PLUGINS.md's walkthrough from that page alone and
runs the conformance suite on it, as the page says: it must pass with the ops
it does not claim skipped, and --require its four ops.

Usage: plugin_from_docs.py PLUGINS.md INCLUDE_DIR COMMSRUN CONFORMANCE -- COMPILER [ARGS...]

The plugin is the ```cpp block under the line
<!-- doc-example: not-a-program: the walkthrough plugin ... -->, built with
the page's flags. The last line is "N passed, N failed, N skipped" over every
run (for scripts/run_tests.py).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BLOCK = re.compile(r"^<!-- doc-example: not-a-program: the walkthrough plugin[^\n]*-->\n```cpp\n(.*?)^```", re.M | re.S)
SUMMARY = re.compile(r"^\[0\] (\d+) passed, (\d+) failed, (\d+) skipped$", re.M)
REQUIRE = "world/all_reduce/float32/sum/*,world/broadcast/float32/*,world/all_gather/float32/*,world/barrier/*"
WORLD_SIZES = (1, 2)


def main(argv):
    if "--" not in argv or argv.index("--") != 5:
        sys.exit(__doc__)
    page, include_dir, commsrun, conformance = argv[1:5]
    compiler = argv[6:]
    found = BLOCK.findall(open(page, encoding="utf-8").read())
    if len(found) != 1:
        print(f"FAILED: {page} has {len(found)} walkthrough plugin blocks, expected 1")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    workdir = tempfile.mkdtemp(prefix="comms-plugin-from-docs-")
    try:
        source = os.path.join(workdir, "my_backend.cc")
        with open(source, "w", encoding="utf-8") as f:
            f.write(found[0])
        plugin = os.path.join(workdir, "libcomms-mine.so")
        build = subprocess.run(compiler + ["-I", include_dir, "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden",
                                           "-Wl,--no-undefined", source, "-o", plugin],
                               capture_output=True, text=True, timeout=300)
        if build.returncode != 0:
            print(f"FAILED: the walkthrough plugin does not build:\n{build.stderr}")
            print("0 passed, 1 failed, 0 skipped")
            return 1
        totals, problems = [0, 0, 0], []
        for n in WORLD_SIZES:
            run = subprocess.run([commsrun, "-n", str(n), "--timeout", "250", "--", conformance, "--plugin", plugin,
                                  "--require", REQUIRE], capture_output=True, text=True, timeout=280)
            out = run.stdout + run.stderr
            summary = SUMMARY.findall(out)
            if run.returncode != 0 or not summary:
                problems.append(f"at {n} ranks the suite exited {run.returncode}:\n" +
                                "\n".join(l for l in out.splitlines() if "FAIL" in l or "passed" in l))
                totals[1] += 1
                continue
            passed, failed, skipped = map(int, summary[-1])
            totals = [totals[0] + passed, totals[1] + failed, totals[2] + skipped]
            unclaimed = out.count("does not claim gather (PluginDescriptor::capabilities)")
            print(f"{n} ranks: {passed} passed, {failed} failed, {skipped} skipped")
            if failed or passed == 0 or skipped == 0 or unclaimed == 0:
                problems.append(f"at {n} ranks: {passed} passed, {failed} failed, {skipped} skipped, "
                                f"{unclaimed} gather cases skipped as unclaimed (expected some of each but failures)")
                totals[1] += 1
        for p in problems:
            print(f"FAILED {p}")
        print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
        return 1 if problems else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
