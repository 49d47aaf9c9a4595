#!/usr/bin/env python3
"""The torch part of the GPU check (run by scripts/gpu_check.py on a CUDA machine).

  gpu_check_torch.py TREE OUT_DIR

TREE is a build or a gpu-bundle (its core/libcomms.so.0). A GPU machine has
torch 2.x but cannot build the project, so this compiles the Python package's
two extensions (comms._comms and comms.torch._C, with CUDA) against that
torch with its own compiler flags (torch.utils.cpp_extension's include and
library paths), lays out OUT_DIR/torch-pkg/comms, then runs the checks at
world size 1 in a child process with that package:

  calls          every call on CUDA tensors, backend "comms" against torch's "nccl"
  device_id      init_process_group("cpu:gloo,cuda:comms", device_id=cuda:0) binds eagerly
  side_stream    an op issued on a side stream is ordered after that stream's work
  ddp            DDP on CUDA over "comms" ends with the parameters of DDP over "nccl"
  priority       is_high_priority_stream through pg_options, read back from the stream
  p50            per-op p50 of "comms" and "nccl" at 8 B, 4 KiB, 1 MiB, alternating in one run

Writes OUT_DIR/torch.json: [{"check", "status", "details", "seconds"}].
Without torch or CUDA it writes one "skip" entry saying why.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every source of each extension (what python/comms/meson.build and
# python/comms/torch/meson.build compile): a glob cannot go stale.
PKG_SOURCES = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ROOT, "python", "comms", "*.cc")))
TORCH_SOURCES = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ROOT, "python", "comms", "torch", "*.cc")))


def torch_paths(fn, cuda):
    try:
        return fn(cuda=cuda)
    except TypeError:  # torch >= 2.6 names the device type
        return fn(device_type="cuda" if cuda else "cpu")


def compile_extension(cxx, name, sources, out_dir, flags, link):
    """Compiles the sources, as many at once as there are cores, and links OUT_DIR/NAME<EXT_SUFFIX>."""
    objs, errors = [], []
    os.makedirs(out_dir, exist_ok=True)
    jobs = max(1, min(len(sources), os.cpu_count() or 1))
    for first in range(0, len(sources), jobs):
        procs = []
        for src in sources[first:first + jobs]:
            obj = os.path.join(out_dir, "%s.%s.o" % (name, os.path.basename(src)))
            objs.append(obj)
            procs.append((src, subprocess.Popen([cxx, "-c", src, "-o", obj] + flags, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True)))
        for src, p in procs:
            output = p.communicate()[0]
            if p.returncode != 0:
                errors.append("%s:\n%s" % (src, output[-4000:]))
    if errors:
        raise RuntimeError("compiling %s failed:\n%s" % (name, "\n".join(errors)))
    target = os.path.join(out_dir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cxx, "-shared", "-o", target] + objs + link, check=True, capture_output=True, text=True)
    return target


def build(tree, out, cuda=True):
    """Returns the PYTHONPATH of the package built under OUT. cuda=False
    builds without torch's CUDA parts (a check of this script on a machine
    without them)."""
    import torch
    import torch.utils.cpp_extension as ext
    if not torch._C._GLIBCXX_USE_CXX11_ABI:
        # comms' public API passes std::string: one extension cannot hold both ABIs.
        raise RuntimeError("torch %s uses the pre-C++11 std::string ABI, libcomms the C++11 one: a torch "
                           "built with _GLIBCXX_USE_CXX11_ABI=1 is needed" % torch.__version__)
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler on this machine (CXX, c++, g++)")
    pkg = os.path.join(out, "torch-pkg", "comms")
    shutil.rmtree(os.path.dirname(pkg), ignore_errors=True)
    os.makedirs(os.path.join(pkg, "torch"))
    for py in glob.glob(os.path.join(ROOT, "python", "comms", "*.py")):
        shutil.copy(py, pkg)
    shutil.copy(os.path.join(ROOT, "python", "comms", "torch", "__init__.py"), os.path.join(pkg, "torch"))
    core = os.path.join(tree, "core")
    cuda_home = ext.CUDA_HOME or "/usr/local/cuda"
    includes = torch_paths(ext.include_paths, cuda) + [os.path.join(cuda_home, "include"),
                                                 sysconfig.get_paths()["include"], os.path.join(ROOT, "include")]
    flags = ["-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden", "-w", "-D_GLIBCXX_USE_CXX11_ABI=1"] + ["-I" + i for i in includes]
    libcomms = ["-L" + core, "-l:libcomms.so.0", "-Wl,-rpath," + core]
    torch_libs = torch_paths(ext.library_paths, cuda)
    torch_link = ["-L" + d for d in torch_libs] + ["-Wl,-rpath," + d for d in torch_libs] + [
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"] + (["-lc10_cuda", "-ltorch_cuda"] if cuda else [])
    here = os.path.join(ROOT, "python", "comms")
    compile_extension(cxx, "_comms", [os.path.join(here, s) for s in PKG_SOURCES], pkg, flags + ["-I" + here],
                      libcomms)
    compile_extension(cxx, "_C", [os.path.join(here, "torch", s) for s in TORCH_SOURCES], os.path.join(pkg, "torch"),
                      flags + ["-I" + os.path.join(here, "torch")] + (["-DCOMMS_TORCH_CUDA"] if cuda else []),
                      libcomms + torch_link)
    return os.path.dirname(pkg)


def main():
    tree, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    results = []

    def save():
        with open(os.path.join(out, "torch.json"), "w") as f:
            json.dump(results, f, indent=1)

    try:
        import torch
    except ImportError as e:
        results.append({"check": "torch", "status": "skip", "details": "no torch here: %s" % e, "seconds": 0})
        return save() or 0
    if not torch.cuda.is_available():
        results.append({"check": "torch", "status": "skip", "details": "torch %s sees no CUDA device" %
                        torch.__version__, "seconds": 0})
        return save() or 0
    start = time.monotonic()
    try:
        pythonpath = build(tree, out)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        details = str(e) + (("\n" + e.stderr[-3000:]) if getattr(e, "stderr", None) else "")
        results.append({"check": "torch_build", "status": "fail", "details": details,
                        "seconds": round(time.monotonic() - start, 1)})
        return save() or 1
    results.append({"check": "torch_build", "status": "pass", "seconds": round(time.monotonic() - start, 1),
                    "details": "comms._comms and comms.torch._C against torch %s (CUDA %s)" % (
                        torch.__version__, torch.version.cuda)})
    env = dict(os.environ, PYTHONPATH=pythonpath, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533",
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    env.pop("COMMS_BACKEND", None)
    checks = os.path.join(ROOT, "scripts", "gpu_torch_checks.py")
    p = subprocess.run([sys.executable, checks, os.path.join(out, "torch-checks.json")], env=env, timeout=540,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(out, "torch-checks.log"), "w") as f:
        f.write(p.stdout)
    try:
        with open(os.path.join(out, "torch-checks.json")) as f:
            results += json.load(f)
    except (OSError, ValueError):
        results.append({"check": "torch_checks", "status": "fail", "seconds": 0,
                        "details": "the checks wrote no results (exit %d): %s" % (p.returncode, p.stdout[-3000:])})
    save()
    return 1 if any(r["status"] == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
