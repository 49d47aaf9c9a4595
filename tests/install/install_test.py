#!/usr/bin/env python3
"""comms installed to a temporary prefix works from there: an outside program
built against it with pkg-config, with CMake (find_package(comms CONFIG)) and
with Meson runs a 2-rank all_reduce on cpu:gloo under the installed commsrun,
with nothing on LD_LIBRARY_PATH; the installed programs and plugins carry an
$ORIGIN RUNPATH; and comms as a Meson subproject with tests, tools and
examples off builds only the library and its plugins.

usage: install_test.py BUILD_DIR SOURCE_DIR PREFIX LIBDIR BINDIR
Prints one line per check and "N passed, N failed, N skipped".
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BUILD, SOURCE, PREFIX, LIBDIR, BINDIR = sys.argv[1:6]
TIMEOUT = 240
results = {"passed": 0, "failed": 0, "skipped": 0}


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH", "COMMS_PLUGIN_PATH",
                        "COMMS_BACKEND", "COMMS_STORE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                        "LOCAL_RANK", "LOCAL_WORLD_SIZE")
           and not k.startswith("COMMS_BACKEND_LIB_") and not k.startswith("SLURM_")}
    env.update(extra)
    return env


def sh(argv, cwd=None, env=None, timeout=TIMEOUT):
    p = subprocess.run(argv, cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s" % (" ".join(argv), p.returncode, p.stdout))
    return p.stdout


def check(name, fn):
    try:
        detail = fn()
        results["passed"] += 1
        print("PASS %s%s" % (name, ": " + detail if detail else ""), flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        results["failed"] += 1
        print("FAIL %s: %s" % (name, e), flush=True)


def runpath(path):
    out = sh(["readelf", "-d", path])
    for line in out.splitlines():
        if "RUNPATH" in line or "RPATH" in line:
            return line.split("[", 1)[1].rstrip("]")
    return ""


def main():
    work = tempfile.mkdtemp(prefix="comms-install-")
    try:
        run_checks(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
    return 1 if results["failed"] else 0


def run_checks(work):
    destdir = os.path.join(work, "dest")
    sh(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet", "--destdir", destdir])
    # Moved after installing: nothing may depend on the configured prefix.
    root = os.path.join(work, "moved")
    os.rename(destdir + PREFIX, root)
    libdir = os.path.join(root, LIBDIR)
    bindir = os.path.join(root, BINDIR)
    commsrun = os.path.join(bindir, "commsrun")
    pcdirs = [d for d in (os.path.join(libdir, "pkgconfig"), os.path.join(root, "share", "pkgconfig"))
              if os.path.exists(os.path.join(d, "comms.pc"))]

    def runpaths():
        for tool in ("commsrun", "comms-info", "comms-bench", "comms-conformance"):
            rp = runpath(os.path.join(bindir, tool))
            if "$ORIGIN/" not in rp:
                raise RuntimeError("%s has RUNPATH '%s', not $ORIGIN-relative" % (tool, rp))
        plugin = os.path.join(libdir, "comms", "libcomms-gloo.so")
        if runpath(plugin) != "$ORIGIN/..":
            raise RuntimeError("the gloo plugin's RUNPATH is '%s'" % runpath(plugin))
        nccl = os.path.join(libdir, "comms", "libcomms-nccl.so")
        if os.path.exists(nccl) and "cuda" not in runpath(nccl):
            raise RuntimeError("the nccl plugin lost its CUDA path: RUNPATH '%s'" % runpath(nccl))
        return "tools $ORIGIN-relative, plugins too"
    check("runpath", runpaths)

    def info_finds_installed_plugin():
        out = sh([os.path.join(bindir, "comms-info"), "--json", "-"])
        info = json.loads(out)
        gloo = [p for p in info["plugins"] if p.get("name") == "gloo"]
        if not gloo or not gloo[0].get("path", "").startswith(libdir):
            raise RuntimeError("comms-info does not find the installed gloo plugin: %s" % info["plugins"])
        # The NCCL plugin loads (libcudart and libnccl through its RUNPATH).
        nccl = [p for p in info["plugins"] if p.get("name") == "nccl"]
        if os.path.exists(os.path.join(libdir, "comms", "libcomms-nccl.so")) and (not nccl or "error" in nccl[0]):
            raise RuntimeError("the installed nccl plugin does not load: %s" % nccl)
        return gloo[0]["path"] + (", and the nccl plugin loads" if nccl else "")
    check("comms-info from the moved prefix", info_finds_installed_plugin)

    def run_consumer(exe):
        out = sh([commsrun, "-n", "2", "--timeout", "60", exe])
        if out.count(" ok") != 2:
            raise RuntimeError("the consumer did not report two right sums:\n" + out)
        return out.strip().splitlines()[-1]

    def perf_names():
        out = sh([commsrun, "-n", "2", "--timeout", "60", os.path.join(bindir, "all_gather_perf"), "-b", "8K", "-e",
                  "8K", "-n", "1", "-w", "0"])
        if "# comms-bench all_gather, 2 ranks" not in out or "# no wrong results" not in out:
            raise RuntimeError("all_gather_perf did not run all_gather:\n" + out)
        return "all_gather_perf runs all_gather"
    check("nccl-tests program names", perf_names)

    def pkg_config():
        if not pcdirs:
            raise RuntimeError("no comms.pc installed")
        env = clean_env(PKG_CONFIG_PATH=pcdirs[0])
        flags = {}
        for mode in ("--define-prefix", "--dont-define-prefix"):
            cflags = sh(["pkg-config", mode, "--cflags", "comms"], env=env).split()
            libs = sh(["pkg-config", mode, "--libs", "comms"], env=env).split()
            lib_dir = sh(["pkg-config", mode, "--variable=libdir", "comms"], env=env).strip()
            if os.path.realpath(lib_dir) != os.path.realpath(libdir):
                raise RuntimeError("pkg-config %s: libdir %s, not %s" % (mode, lib_dir, libdir))
            flags[mode] = (cflags, libs, lib_dir)
        cflags, libs, lib_dir = flags["--define-prefix"]
        exe = os.path.join(work, "consumer-pkg-config")
        sh(["c++"] + cflags + [os.path.join(SOURCE, "tests/install/consumer/main.cc"), "-o", exe] + libs +
           ["-Wl,-rpath," + lib_dir])
        return run_consumer(exe)
    check("pkg-config", pkg_config)

    def cmake():
        build = os.path.join(work, "cmake-build")
        sh(["cmake", "-S", os.path.join(SOURCE, "tests/install/consumer"), "-B", build, "-G", "Ninja",
            "-DCMAKE_PREFIX_PATH=" + root, "-DCMAKE_BUILD_TYPE=Release"])
        sh(["cmake", "--build", build])
        return run_consumer(os.path.join(build, "consumer"))
    check("cmake", cmake)

    def meson_outside():
        build = os.path.join(work, "meson-build")
        env = clean_env(PKG_CONFIG_PATH=pcdirs[0] if pcdirs else "")
        sh(["meson", "setup", build, os.path.join(SOURCE, "tests/install/consumer")], env=env)
        sh(["ninja", "-C", build], env=env)
        return run_consumer(os.path.join(build, "consumer"))
    check("meson", meson_outside)

    def subproject():
        user = os.path.join(work, "subproject-user")
        os.makedirs(os.path.join(user, "subprojects"))
        shutil.copy(os.path.join(SOURCE, "tests/install/subproject/meson.build"), user)
        shutil.copy(os.path.join(SOURCE, "tests/install/consumer/main.cc"), user)
        with open(os.path.join(user, "meson.build")) as f:
            text = f.read().replace("'../consumer/main.cc'", "'main.cc'")
        with open(os.path.join(user, "meson.build"), "w") as f:
            f.write(text)
        os.symlink(SOURCE, os.path.join(user, "subprojects", "comms"))
        build = os.path.join(user, "build")
        sh(["meson", "setup", build, user, "-Dcomms:nccl=disabled"])
        targets = json.loads(sh(["meson", "introspect", "--targets", build]))
        names = sorted(t["name"] for t in targets)
        tests = json.loads(sh(["meson", "introspect", "--tests", build]))
        # The library, its plugins, their .packages files and helper
        # libraries, the Python package (comms._comms, comms.torch._C and
        # their .py files) and the user's program; no tool, test or example.
        tools = ("commsrun", "comms-info", "comms-bench", "comms-conformance", "comms-trace", "mpi-bench", "trainer")

        def wanted(n):
            return (n in ("comms", "consumer") or n.startswith(("comms-", "comms_", "_C.cpython", "_comms.cpython"))
                    or n.endswith(".py") or (n.startswith("libcomms-") and n.endswith(".so.packages")))
        unwanted = [n for n in names if "test" in n or n in tools or not wanted(n)]
        if tests or unwanted:
            raise RuntimeError("the subproject builds more than the library: %d targets %s, %d tests"
                               % (len(names), names, len(tests)))
        return "%d targets: %s" % (len(names), " ".join(names))
    check("meson subproject (tests, tools, examples off)", subproject)


if __name__ == "__main__":
    sys.exit(main())
