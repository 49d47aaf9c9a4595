#!/usr/bin/env python3
"""The GPU check: every promise of the NCCL path, run on a CUDA device.

  gpu_check.py run BUILD_OR_BUNDLE OUT_DIR   run the checks, write OUT_DIR/report.md and report.json
  gpu_check.py bundle BUILD BUNDLE_DIR       copy what `run` needs out of a build, for a machine
                                             that cannot build (tools/dev gpu-bundle; the device tool)
  gpu_check.py bundle-matches BUNDLE_DIR     exit 0 if the bundle was built from this tree's sources

`run` without a CUDA device prints one line saying so and exits 0. With one it
runs each check (the NCCL plugin's GPU unit tests, the conformance suite on
CUDA buffers at world size = number of GPUs, the GPU story tests under
commsrun, the elastic tests (planned shrink, revoke then recover; at 2 ranks too),
comms-bench --overhead --raw-nccl at four sizes, comms.torch built against the
machine's torch and its CUDA checks), prints a line per check, and
exits 1 if any failed. Every check has a time bound.
"""
import ctypes
import datetime
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What `run` needs, relative to a build directory (a bundle keeps the layout,
# so the programs' $ORIGIN-relative run paths to libcomms still hold).
PROGRAMS = [
    "tools/commsrun",
    "tools/comms-conformance",
    "tools/comms-bench",
    "tools/comms-info",
    "tests/backends/nccl/nccl_unit_test",
    "tests/backends/nccl/nccl_gpu_test",
    "tests/gpu/gpu_story_test",
    "tests/gpu/gpu_elastic_test",
    "tests/conformance/conformance_cuda_test",
]
LIBRARIES = ["core/libcomms.so.0", "backends/gloo/libcomms-gloo.so", "backends/nccl/libcomms-nccl.so"]
PLUGIN_DIRS = ["backends/gloo", "backends/nccl"]

# Libraries a CUDA machine has (the C and C++ runtimes, the driver, CUDA's
# runtime and NCCL, which must match the driver): never copied into a bundle.
SYSTEM_LIBRARIES = re.compile(
    r"^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|"
    r"libcuda\.|libcudart\.|libnccl\.|libnvidia)")

# Sources whose content a bundle was built from; `run` refuses a bundle whose
# sources differ from the tree beside it (a stale bundle would report on old code).
SOURCE_DIRS = ["core", "backends", "include", "tools", "scripts", "tests/unit", "tests/backends", "tests/gpu",
               "tests/conformance", "tests/support"]
SOURCE_SUFFIXES = (".cc", ".h", ".build", ".txt", ".py")

# The per-op overhead targets: at most 2 us at 8 B and 4 KiB, at
# most 3 % at 1 GiB; 1 MiB has none. A miss fails the check, not hidden.
OVERHEAD_TARGETS = {"8": (2.0, "us"), "4K": (2.0, "us"), "1G": (3.0, "%")}


# (size, iterations, warm-up iterations)
OVERHEAD_SIZES = [("8", 2000, 200), ("4K", 2000, 200), ("1M", 500, 50), ("1G", 40, 5)]
BENCH_RUNS = 3


def source_digest():
    h = hashlib.sha256()
    files = []
    for d in SOURCE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, d)):
            files += [os.path.join(dirpath, n) for n in names if n.endswith(SOURCE_SUFFIXES)]
    for path in sorted(files, key=lambda p: os.path.relpath(p, ROOT)):
        h.update(os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


# --- bundle -------------------------------------------------------------------

def needed_libraries(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m and m.group(2) != "not" and not SYSTEM_LIBRARIES.match(m.group(1)):
            libs[m.group(1)] = m.group(2)
    return libs


def bundle(build, dest):
    build = os.path.abspath(build)
    missing = [p for p in PROGRAMS + LIBRARIES if not os.path.exists(os.path.join(build, p))]
    if missing:
        sys.exit("gpu_check.py bundle: not built in %s: %s (is the NCCL plugin part of the build?)"
                 % (build, ", ".join(missing)))
    if os.path.exists(dest):
        shutil.rmtree(dest)
    extra = {}
    for rel in PROGRAMS + LIBRARIES:
        src = os.path.join(build, rel)
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        # Line tables and symbols stay out: the bundle has to travel (64 MiB).
        subprocess.run(["objcopy", "--strip-debug", os.path.realpath(src), out], check=True)
        extra.update(needed_libraries(src))
    if os.path.exists(os.path.join(dest, "core/libcomms.so.0")):
        os.symlink("libcomms.so.0", os.path.join(dest, "core/libcomms.so"))
    os.makedirs(os.path.join(dest, "lib"), exist_ok=True)
    for name, path in sorted(extra.items()):
        if name.startswith("libcomms"):
            continue
        subprocess.run(["objcopy", "--strip-debug", os.path.realpath(path), os.path.join(dest, "lib", name)],
                       check=True)
    manifest = {"sources": source_digest(), "built_on": platform.node(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "libraries": sorted(n for n in extra if not n.startswith("libcomms"))}
    with open(os.path.join(dest, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    size = sum(os.path.getsize(p) for p in glob.glob(dest + "/**", recursive=True) if os.path.isfile(p))
    print("gpu_check.py: bundle in %s, %.1f MiB" % (dest, size / 2**20))


# --- run ----------------------------------------------------------------------

def cuda_devices():
    """(count, reason): the CUDA devices the runtime sees, or 0 and why not."""
    for name in ["libcudart.so.13", "libcudart.so"]:
        try:
            rt = ctypes.CDLL(name)
            break
        except OSError:
            rt = None
    if rt is None:
        for path in glob.glob("/usr/local/cuda/lib64/libcudart.so*"):
            try:
                rt = ctypes.CDLL(path)
                break
            except OSError:
                pass
    if rt is None:
        return 0, "no CUDA runtime (libcudart) on this machine"
    count = ctypes.c_int(0)
    err = rt.cudaGetDeviceCount(ctypes.byref(count))
    if err != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        return 0, "cudaGetDeviceCount: %s" % rt.cudaGetErrorString(err).decode()
    if count.value == 0:
        return 0, "the CUDA runtime sees no device"
    return count.value, ""


def device_facts():
    facts = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        facts["gpus"] = q
    except (OSError, subprocess.SubprocessError) as e:
        facts["gpus"] = ["nvidia-smi failed: %s" % e]
    return facts


class Runner:
    def __init__(self, tree, out, gpus):
        self.tree = tree
        self.out = out
        self.gpus = gpus
        self.results = []
        self.targets_missed = 0
        self.env = dict(os.environ)
        lib = os.path.join(tree, "lib")
        if os.path.isdir(lib):
            self.env["LD_LIBRARY_PATH"] = lib + (":" + self.env["LD_LIBRARY_PATH"]
                                                 if self.env.get("LD_LIBRARY_PATH") else "")
        self.env["COMMS_PLUGIN_PATH"] = ":".join(os.path.join(tree, d) for d in PLUGIN_DIRS)
        self.env["COMMS_NCCL_PLUGIN"] = os.path.join(tree, "backends/nccl/libcomms-nccl.so")
        for k in ["COMMS_BACKEND", "COMMS_HINTS", "COMMS_ROUTE"]:
            self.env.pop(k, None)
        # NCCL says why it returned "invalid argument" only in its own log.
        self.env.setdefault("NCCL_DEBUG", "WARN")

    def path(self, rel):
        return os.path.join(self.tree, rel)

    def commsrun(self, n, timeout_s):
        return [self.path("tools/commsrun"), "-n", str(n), "--timeout", str(timeout_s), "--"]

    def execute(self, name, argv, timeout_s, env=None):
        log = os.path.join(self.out, name + ".log")
        start = time.monotonic()
        run_env = dict(self.env)
        run_env.update(env or {})
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", timeout=timeout_s, env=run_env)
            output, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            output += "\n(killed after %d s)" % timeout_s
            rc = 124
        with open(log, "w") as f:
            f.write("$ " + " ".join(argv) + "\n" + output)
        return rc, output, time.monotonic() - start

    def record(self, name, what, status, seconds, details, data=None):
        self.results.append({"check": name, "what": what, "status": status, "seconds": round(seconds, 1),
                             "details": details, "data": data or {}, "log": name + ".log"})
        print("gpu-check: %-24s %-6s %6.1f s  %s" % (name, status.upper(), seconds, details.splitlines()[0]
                                                      if details else ""), flush=True)

    # Each check ---------------------------------------------------------------

    def gtest(self, name, what, argv, timeout_s, env=None):
        json_dir = tempfile.mkdtemp(prefix="gpu-check-")
        env = dict(env or {})
        env["GTEST_OUTPUT"] = "json:%s/" % json_dir
        rc, output, secs = self.execute(name, argv, timeout_s, env)
        cases = []
        for path in sorted(glob.glob(json_dir + "/*.json")):
            with open(path) as f:
                report = json.load(f)
            for suite in report.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    failures = [x.get("failure", "") for x in t.get("failures", [])]
                    skipped = t.get("result") == "SKIPPED"
                    cases.append({"name": suite["name"] + "." + t["name"],
                                  "status": "fail" if failures else "skip" if skipped else "pass",
                                  "time": t.get("time", ""),
                                  "message": (failures[0] if failures else self.skip_message(output, t["name"]))[:2000]})
        shutil.rmtree(json_dir, ignore_errors=True)
        counts = {s: sum(c["status"] == s for c in cases) for s in ("pass", "fail", "skip")}
        # What the cases printed besides gtest's own lines (timings, what NCCL logged).
        printed = [line for line in output.splitlines()
                   if line.strip() and not re.match(r"^(\[\d+\] )?(\[[ =A-Z-]+\]|Note:|\.\./|NCCL version)", line)]
        status = "pass" if rc == 0 and cases and counts["fail"] == 0 else "fail"
        details = "%d passed, %d failed, %d skipped" % (counts["pass"], counts["fail"], counts["skip"])
        if rc != 0 and counts["fail"] == 0:
            details += " (exit %d: %s)" % (rc, output.strip().splitlines()[-1] if output.strip() else "no output")
        self.record(name, what, status, secs, details, {"cases": cases, "printed": printed[:40]})

    @staticmethod
    def skip_message(output, test):
        m = re.search(r"Skipped\s*\n?(.*)\n\[  SKIPPED \] [^\n]*\." + re.escape(test), output)
        return m.group(1).strip() if m else ""

    def conformance(self):
        json_path = os.path.join(self.out, "conformance.json")
        argv = self.commsrun(self.gpus, 400) + [self.path("tools/comms-conformance"), "--backend", "cuda:nccl",
                                                "--device", "cuda", "--json", json_path]
        rc, output, secs = self.execute("conformance", argv, 420)
        m = re.findall(r"(\d+) passed, (\d+) failed(?:, (\d+) skipped)?", output)
        details = ("%s passed, %s failed, %s skipped" % (m[-1][0], m[-1][1], m[-1][2] or 0)) if m else "no summary"
        skips = {}
        for m2 in re.finditer(r"SKIP \S+: (.*)", output):
            reason = re.sub(r"\b(u?int\d+|float\d+\w*|bfloat16|bool)\b", "<type>", m2.group(1))
            skips[reason] = skips.get(reason, 0) + 1
        data = {"skip_reasons": dict(sorted(skips.items(), key=lambda kv: -kv[1]))}
        if os.path.exists(json_path):
            with open(json_path) as f:
                data["report"] = json.load(f)
        failed = rc != 0 or not m or m[-1][1] != "0" or m[-1][0] == "0"
        if rc != 0:
            details += " (exit %d)" % rc
        self.record("conformance", "comms-conformance --device cuda --backend cuda:nccl, world size %d" % self.gpus,
                    "fail" if failed else "pass", secs, details, data)

    def bench(self, graph=False):
        """comms-bench --overhead --raw-nccl at each size, BENCH_RUNS times: the
        median and the spread of comms' p50 minus raw NCCL's p50 (same config,
        same stream): libcomms' and the plugin's overhead, what the targets are on.
        graph: both sides captured once in a CUDA graph and replayed (--graph)."""
        tag = "-graph" if graph else ""
        rows, failures, summary, total, missed = [], [], [], 0.0, 0
        for size, iters, warmup in OVERHEAD_SIZES:
            overheads = []
            for run in range(BENCH_RUNS):
                json_path = os.path.join(self.out, "bench%s-%s-%d.json" % (tag, size, run))
                argv = self.commsrun(self.gpus, 280) + [
                    self.path("tools/comms-bench"), "--device", "cuda", "--backend", "cpu:gloo,cuda:nccl",
                    "--overhead", "--raw-nccl", "-c", "1", "-b", size, "-e", size, "-n", str(iters), "-w", str(warmup),
                    "-C", "all_reduce", "-d", "float32", "--json", json_path] + (["--graph"] if graph else [])
                rc, output, secs = self.execute("bench%s-%s-%d" % (tag, size, run), argv, 300)
                total += secs
                if rc != 0:
                    failures.append("%s: exit %d: %s" % (size, rc, output.strip().splitlines()[-1]
                                                          if output.strip() else "no output"))
                    continue
                with open(json_path) as f:
                    report = json.load(f)
                for r in report if isinstance(report, list) else report.get("results", []):
                    r["run"] = run
                    rows.append(r)
                    overheads.append((r["overhead_us"], r["overhead_pct"], r["p50_us"], r["raw_p50_us"]))
                    if r.get("wrong", 0):
                        failures.append("%s: %d wrong values" % (size, r["wrong"]))
            if overheads:
                overheads.sort()
                mid = overheads[len(overheads) // 2]
                target = OVERHEAD_TARGETS.get(size)
                met = target is None or (mid[1] if target[1] == "%" else mid[0]) <= target[0]
                summary.append("%s B: overhead %.2f us (%.2f %%) median of %d, range %.2f..%.2f us; comms p50 %.2f us, "
                               "raw NCCL p50 %.2f us%s" % (
                                   size, mid[0], mid[1], len(overheads), overheads[0][0], overheads[-1][0], mid[2],
                                   mid[3], "" if target is None else "; target <= %g %s %s" % (
                                       target[0], target[1], "met" if met else "MISSED")))
                self.targets_missed += 0 if met else 1
                missed += 0 if met else 1
        self.record("bench_overhead" + tag.replace("-", "_"),
                    "comms-bench --device cuda --overhead --raw-nccl -c 1%s (all_reduce float32, %d runs per size%s)" % (
                        " --graph" if graph else "", BENCH_RUNS, ", captured once, replays timed" if graph else ""),
                    "fail" if failures or missed else "pass", total, "; ".join(failures + summary), {"rows": rows})

    def run_all(self):
        self.gtest("nccl_unit", "the NCCL plugin's logic through its fake NcclApi",
                   [self.path("tests/backends/nccl/nccl_unit_test")], 300)
        self.gtest("nccl_gpu", "the built plugin through its descriptor, on the device (world size 1)",
                   [self.path("tests/backends/nccl/nccl_gpu_test")], 600)
        self.gtest("conformance_buffers", "the conformance suite's device buffers round-trip on the GPU",
                   [self.path("tests/conformance/conformance_cuda_test")], 120)
        self.conformance()
        story_log = os.path.join(self.out, "nccl-debug")
        os.makedirs(story_log, exist_ok=True)
        self.gtest("gpu_story", "eager binding, hints on the device, offload/reload, timeout and abort "
                   "(world size %d)" % self.gpus,
                   self.commsrun(self.gpus, 580) + [self.path("tests/gpu/gpu_story_test")], 600,
                   {"GPU_STORY_NCCL_LOG_DIR": story_log})
        self.elastic()
        self.bench()
        self.bench(graph=True)
        self.torch()

    def elastic(self):
        """Planned shrink (empty exclude list) at one rank per GPU; then two ranks (on one GPU when
        there is one: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, else the cases skip): a planned
        shrink excluding rank 1, and revoke then recover."""
        env = {"COMMS_ELASTIC": "1"}
        self.gtest("gpu_elastic", "planned shrink through comms::shrink, ncclCommShrink where NCCL has it "
                   "(world size %d)" % self.gpus,
                   self.commsrun(self.gpus, 280) + [self.path("tests/gpu/gpu_elastic_test")], 300, env)
        env2 = dict(env, NCCL_MULTI_RANK_GPU_ENABLE="1", GPU_ELASTIC_SHARE_GPU="0" if self.gpus >= 2 else "1")
        self.gtest("gpu_elastic_2rank", "2 ranks%s: planned shrink excluding rank 1, revoke then recover"
                   % ("" if self.gpus >= 2 else " on one GPU"),
                   self.commsrun(2, 280) + [self.path("tests/gpu/gpu_elastic_test")], 300, env2)

    def torch(self):
        """comms.torch built against this machine's torch, its CUDA checks (scripts/gpu_check_torch.py)."""
        argv = [sys.executable, os.path.join(ROOT, "scripts", "gpu_check_torch.py"), self.tree, self.out]
        rc, output, secs = self.execute("torch", argv, 590)
        try:
            with open(os.path.join(self.out, "torch.json")) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            entries = [{"check": "torch", "status": "fail", "seconds": secs,
                        "details": "gpu_check_torch.py wrote no results (exit %d): %s" % (rc, output[-2000:])}]
        for e in entries:
            self.record(e["check"], "comms.torch on CUDA (docs/TORCH.md)", e["status"], e["seconds"], e["details"])


def write_report(out, facts, results, started):
    passed = sum(r["status"] == "pass" for r in results)
    failed = sum(r["status"] == "fail" for r in results)
    report = {"date": started, "machine": facts, "results": results,
              "summary": {"passed": passed, "failed": failed}}
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = ["# comms gpu-check report", "",
             "- date: %s" % started,
             "- GPUs: %s" % "; ".join(facts.get("gpus", [])),
             "- NCCL: %s" % facts.get("nccl_version", "unknown"),
             "- checks: %d passed, %d failed" % (passed, failed), "",
             "| check | what | result | time | details |", "|---|---|---|---|---|"]
    for r in results:
        lines.append("| %s | %s | %s | %.1f s | %s |" % (r["check"], r["what"], r["status"].upper(), r["seconds"],
                                                         r["details"].replace("|", "/").replace("\n", " ")))
    for r in results:
        if r["data"].get("skip_reasons"):
            lines += ["", "## %s: why cases skipped" % r["check"], ""]
            lines += ["- %d: %s" % (n, why) for why, n in r["data"]["skip_reasons"].items()]
        cases = r["data"].get("cases")
        if not cases:
            continue
        lines += ["", "## %s" % r["check"], ""]
        if r["data"].get("printed"):
            lines += ["```"] + r["data"]["printed"] + ["```", ""]
        for c in cases:
            msg = c["message"].strip().replace("\n", " ")
            lines.append("- %s %s%s" % (c["status"].upper(), c["name"], (": " + msg[:400]) if msg else ""))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return passed, failed


def run(tree, out):
    tree = os.path.abspath(tree)
    manifest_path = os.path.join(tree, "MANIFEST.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest["sources"] != source_digest():
            sys.exit("gpu-check: the bundle in %s was built from other sources than this tree; "
                     "rebuild it (tools/dev gpu-bundle)" % tree)
    gpus, why = cuda_devices()
    if gpus == 0:
        print("gpu-check: no CUDA device present (%s); nothing to run" % why)
        return 0
    os.makedirs(out, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    facts = device_facts()
    runner = Runner(tree, out, gpus)
    rc, info, _ = runner.execute("comms-info", [runner.path("tools/comms-info"), "--json", "-"], 60)
    try:
        # NCCL may print its banner first.
        for b in json.loads(info[info.index("{"):]).get("plugins", []):
            if b.get("name") == "nccl":
                facts["nccl_version"] = b.get("version", "unknown")
    except ValueError:
        pass
    print("gpu-check: %d CUDA device(s): %s" % (gpus, "; ".join(facts["gpus"])), flush=True)
    runner.run_all()
    passed, failed = write_report(out, facts, runner.results, started)
    print("gpu-check: report in %s/report.md; %d passed, %d failed" % (out, passed, failed))
    return 1 if failed else 0


def bundle_matches(tree):
    manifest_path = os.path.join(tree, "MANIFEST.json")
    if not os.path.exists(manifest_path):
        return False
    with open(manifest_path) as f:
        return json.load(f).get("sources") == source_digest()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "bundle-matches":
        return 0 if bundle_matches(sys.argv[2]) else 1
    if len(sys.argv) != 4 or sys.argv[1] not in ("run", "bundle"):
        sys.exit(__doc__)
    if sys.argv[1] == "bundle":
        bundle(sys.argv[2], sys.argv[3])
        return 0
    return run(sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    sys.exit(main())
