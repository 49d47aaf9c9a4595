#!/usr/bin/env python3
"""pip install of the checkout into a fresh venv, used the way a torch user would.

usage: pip_install_check.py SOURCE_ROOT WORK_DIR [WHEELHOUSE]

1. A new venv in WORK_DIR/venv gets python/requirements.txt (torch, numpy)
   from WHEELHOUSE (default: $COMMS_WHEELS, else ~/.cache/comms/wheels,
   which tools/dev fills), with --no-index: no network.
2. The README's block marked <!-- doc-example: pip-install --> runs verbatim,
   line by line, in SOURCE_ROOT with the venv's bin first on PATH (the
   README's user path, so it cannot go stale); pip's own variables point it
   at the wheelhouse, and the build gets -j2, no optimization and the folder
   WORK_DIR/build, kept across runs (ninja and ccache reuse it).
3. From a folder outside the checkout, with PYTHONPATH, LD_LIBRARY_PATH and
   every COMMS_* variable unset: import comms and comms.torch from the venv;
   comms-info lists gloo and ucx from inside the package; commsrun and
   `python -m comms.run` run a 2-rank all_reduce; torchrun runs a plain torch
   program naming "comms" at 4 ranks, which all_reduces by value; the
   installed libraries' RUNPATHs are $ORIGIN-relative.
4. pip uninstall comms leaves the venv's files exactly as before the install.
   The venv is then removed (torch is 5 GB); the build folder stays.

Prints one line per check and "N passed, N failed[, N skipped]" last.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SOURCE, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
WHEELS = sys.argv[3] if len(sys.argv) > 3 else os.environ.get(
    "COMMS_WHEELS", os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "comms", "wheels"))
VENV = os.path.join(WORK, "venv")
VPY = os.path.join(VENV, "bin", "python")
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok or not detail else ": " + detail.strip()[-3000:]),
          flush=True)
    return ok


def clean_env():
    """The user's environment: nothing of the build tree, no comms variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COMMS_") and k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")}
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # so that uninstall's before/after compare holds
    return env


def run(cmd, cwd, env, timeout, **kw):
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True, **kw)
    return p, time.monotonic() - start


def readme_pip_block():
    text = open(os.path.join(SOURCE, "README.md")).read()
    m = re.search(r"<!-- doc-example: pip-install -->\n```sh\n(.*?)```", text, re.S)
    if not m:
        return None
    return [line.split("#")[0].strip() for line in m.group(1).splitlines() if line.split("#")[0].strip()]


def readme_apt_packages():
    """The packages of the README's apt-get line (this machine must have them
    all, or the pip build below would not be what a user gets from it)."""
    text = open(os.path.join(SOURCE, "README.md")).read().replace("\\\n", " ")
    m = re.search(r"sudo apt-get install ([^\n`]*)", text)
    return m.group(1).split() if m else []


def venv_files():
    """Every file and folder in the venv."""
    out = set()
    for root, dirs, files in os.walk(VENV):
        out.update(os.path.relpath(os.path.join(root, f), VENV) for f in files + dirs)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCH_PROGRAM = r"""
import os, sys, torch, torch.distributed as dist
assert "comms" not in sys.modules
dist.init_process_group("comms")   # found through torch's entry points: no import
rank, world = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "comms", dist.get_backend()
t = torch.full((8,), float(rank + 1))
dist.all_reduce(t)
expect = world * (world + 1) / 2
assert torch.equal(t, torch.full((8,), expect)), (rank, t)
out = [torch.empty(2) for _ in range(world)]
dist.all_gather(out, torch.full((2,), float(rank)))
assert [o[0].item() for o in out] == [float(r) for r in range(world)], out
print(f"rank {rank}/{world} all_reduce {t[0].item():g}", flush=True)
dist.destroy_process_group()
"""

COMMS_PROGRAM = r"""
import numpy as np, comms
world = comms.new_comm(device="cpu", name="world")
x = np.full(4, world.rank + 1.0, dtype=np.float32)
world.all_reduce(x, op="sum")
assert (x == world.size * (world.size + 1) / 2).all(), x
print("rank", world.rank, "sum", x[0], "from", comms.__file__, flush=True)
"""


def main():
    if not os.path.isdir(WHEELS) or not any(f.startswith("torch-") for f in os.listdir(WHEELS)):
        print(f"SKIP pip_install: no torch wheel in {WHEELS} (tools/dev fills it: tools/dev build)")
        print("0 passed, 0 failed, 1 skipped")
        return 0
    block = readme_pip_block()
    if not check("README has a pip-install block", block is not None and any("pip install" in l for l in block),
                 "README.md: no <!-- doc-example: pip-install --> ```sh block"):
        return 1
    apt = readme_apt_packages()
    missing = [p for p in apt if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                                text=True).stdout != "install ok installed"]
    check("README's apt line: installed packages", bool(apt) and not missing,
          "missing: " + " ".join(missing or ["(no line)"]))
    os.makedirs(WORK, exist_ok=True)
    shutil.rmtree(VENV, ignore_errors=True)
    env = clean_env()
    env["PIP_NO_INDEX"] = "1"
    env["PIP_FIND_LINKS"] = WHEELS
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    p, t = run([sys.executable, "-m", "venv", VENV], WORK, env, 120)
    if not check("fresh venv", p.returncode == 0, p.stderr):
        return 1
    # --no-compile: byte-compiling torch's thousands of modules is CPU this
    # check never looks at (the package's own install below compiles as usual).
    p, t = run([VPY, "-m", "pip", "install", "-q", "--no-compile", "-r",
                os.path.join(SOURCE, "python", "requirements.txt")], WORK, env, 900)
    print(f"  torch and its pins from {WHEELS}: {t:.0f} s", flush=True)
    if not check("torch into the venv, no network", p.returncode == 0, p.stdout + p.stderr):
        return 1
    before = venv_files()

    # The README's lines; the build itself gets a folder that stays for the
    # next run, two jobs (the machines that run the tests have two cores) and
    # no optimization: this checks what the package holds and does, and a
    # release build of torch's headers took most of the test's time.
    build_options = (" --config-settings=build-dir=" + os.path.join(WORK, "build") +
                     " --config-settings=compile-args=-j2 --config-settings=setup-args=-Dbuildtype=plain")
    for line in block:
        command = line + (build_options if "--no-build-isolation" in line else "")
        p, t = run(["bash", "-c", command], SOURCE, env, 1800)
        print(f"  README: {line}: {t:.0f} s", flush=True)
        if not check("README: " + line, p.returncode == 0, p.stdout + p.stderr):
            return 1

    outside = tempfile.mkdtemp(prefix="comms-pip-user-")
    try:
        user_checks(env_without_pip(env), outside)
    finally:
        shutil.rmtree(outside, ignore_errors=True)

    p, _ = run([VPY, "-m", "pip", "uninstall", "-y", "comms"], WORK, env, 300)
    left = sorted(venv_files() - before)
    check("pip uninstall leaves nothing of comms", p.returncode == 0 and not left,
          p.stderr + " left: " + " ".join(left[:20]))
    passed = sum(results)
    if passed == len(results):
        shutil.rmtree(VENV, ignore_errors=True)  # 5 GB of torch; the build folder stays
    else:
        print(f"  the venv stays for a look: {VENV}")
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


def env_without_pip(env):
    return {k: v for k, v in env.items() if not k.startswith("PIP_")}


def user_checks(env, cwd):
    site = subprocess.run([VPY, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                          env=env, capture_output=True, text=True).stdout.strip()
    pkg = os.path.join(site, "comms")
    p, _ = run([VPY, "-c", "import comms, comms.torch; print(comms.__file__); print(comms.torch.__file__)"],
               cwd, env, 120)
    check("import comms, comms.torch from the venv",
          p.returncode == 0 and all(l.startswith(pkg + "/") for l in p.stdout.split()), p.stdout + p.stderr)

    p, _ = run(["comms-info", "--json", "-"], cwd, env, 60)
    try:
        plugins = {pl["name"]: pl for pl in json.loads(p.stdout)["plugins"]}
    except (ValueError, KeyError):
        plugins = {}
    for name in ("gloo", "ucx"):
        pl = plugins.get(name, {})
        check(f"comms-info lists {name} from the package",
              "error" not in pl and pl.get("path", "").startswith(pkg + "/lib/comms/"), p.stdout + p.stderr)

    script = os.path.join(cwd, "allreduce_comms.py")
    with open(script, "w") as f:
        f.write(COMMS_PROGRAM)
    for launcher in (["commsrun"], [VPY, "-m", "comms.run"]):
        p, _ = run(launcher + ["-n", "2", "--timeout", "120", "--", VPY, script], cwd,
                   dict(env, COMMS_BACKEND="cpu:gloo"), 180)
        check(" ".join(launcher[-2:] if len(launcher) > 1 else launcher) + " -n 2: all_reduce by value",
              p.returncode == 0 and p.stdout.count(" sum 3.0 from " + pkg) == 2, p.stdout + p.stderr)

    script = os.path.join(cwd, "allreduce_torch.py")
    with open(script, "w") as f:
        f.write(TORCH_PROGRAM)
    p, t = run(["torchrun", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), script], cwd, env, 300)
    print(f"  torchrun --nproc-per-node 4: {t:.0f} s", flush=True)
    check("torchrun --nproc-per-node 4, init_process_group(\"comms\"): all_reduce by value",
          p.returncode == 0 and all(f"rank {r}/4 all_reduce 10" in p.stdout for r in range(4)),
          p.stdout + p.stderr)

    # Two nodes of 2 ranks (torchrun's static rendezvous), here on loopback.
    port = str(free_port())
    nodes = [subprocess.Popen(["torchrun", "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2",
                               "--master-addr", "127.0.0.1", "--master-port", port, script],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in range(2)]
    outs, codes = [], []
    for node in nodes:
        try:
            outs.append(node.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            node.kill()
            outs.append(node.communicate()[0] + "\n(timed out)")
        codes.append(node.returncode)
    check("torchrun --nnodes 2 --nproc-per-node 2: all_reduce by value",
          codes == [0, 0] and all(f"rank {r}/4 all_reduce 10" in "".join(outs) for r in range(4)), "\n".join(outs))

    bad = []
    for root, _, files in os.walk(pkg):
        for fname in files:
            path = os.path.join(root, fname)
            if fname.endswith(".packages") or (".so" not in fname and os.path.basename(root) != "bin"):
                continue
            d = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
            for rp in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", d):
                # $ORIGIN-relative, the venv's own (torch's lib), or the
                # system's (CUDA): never the checkout or its build folder.
                bad += [f"{path}: {e}" for e in rp.split(":")
                        if (e + "/").startswith(SOURCE + "/") and not e.startswith(site + "/")]
                if not rp.startswith("$ORIGIN") and "libcomms" not in fname:
                    bad.append(f"{path}: {rp} (libcomms is found through $ORIGIN first)")
    check("RUNPATHs: $ORIGIN-relative, none into the checkout", not bad, "\n".join(bad))

    # Each plugin's .packages names a package for every system library it
    # links beyond the C and C++ runtimes (and CUDA's, versioned per release).
    base = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux", "libpthread.so", "libdl.so",
            "libcudart.so")
    unnamed = []
    plugin_dir = os.path.join(pkg, "lib", "comms")
    for fname in sorted(os.listdir(plugin_dir)):
        if not fname.endswith(".so"):
            continue
        d = subprocess.run(["readelf", "-d", os.path.join(plugin_dir, fname)], capture_output=True, text=True).stdout
        sidecar = os.path.join(plugin_dir, fname + ".packages")
        listed = set()
        if os.path.exists(sidecar):
            listed = {l.split()[0] for l in open(sidecar) if l.strip() and not l.startswith("#")}
        unnamed += [f"{fname}: {lib}" for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", d)
                    if not lib.startswith(base) and lib not in listed]
    check("each plugin's .packages names its system libraries' packages", not unnamed, "\n".join(unnamed))


if __name__ == "__main__":
    sys.exit(main())
