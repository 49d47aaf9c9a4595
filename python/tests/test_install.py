"""meson install --destdir D: the installed package imports and runs a 2-rank
all_reduce with only D's files (its site-packages on PYTHONPATH, its
commsrun, its libcomms found through the extension's relative rpath)."""
import json
import os
import subprocess

from conftest import BUILD, HERE, PYTHON, job_env


def test_installed_package_runs_a_2_rank_all_reduce(tmp_path):
    dest = tmp_path / "dest"
    # --no-rebuild: the build is done (the Meson test depends on its targets).
    subprocess.run(["meson", "install", "-C", BUILD, "--destdir", str(dest), "--no-rebuild", "--quiet",
                    "--tags", "runtime,python-runtime"], check=True, capture_output=True, text=True, timeout=120)
    installed = json.loads(subprocess.run(["meson", "introspect", "--installed", BUILD], check=True,
                                          capture_output=True, text=True).stdout)
    ext = next(path for path in installed.values() if "/comms/_comms" in path)
    site = str(dest) + os.path.dirname(os.path.dirname(ext))
    commsrun = str(dest) + next(path for path in installed.values() if path.endswith("/bin/commsrun"))
    assert os.path.exists(os.path.join(site, "comms", "__init__.py"))

    env = job_env(pythonpath=site)
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("COMMS_PLUGIN_PATH", None)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([commsrun, "-n", "2", "--timeout", "60", "--", PYTHON, "-I", "-c",
                           "import sys, os; sys.path[:0] = [%r, %r]; import runpy; "
                           "runpy.run_path(%r, run_name='__main__')" % (site, HERE, os.path.join(HERE, "rank_installed.py")),
                           str(out), str(dest)],
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(2):
        with open(out / ("rank%d.json" % rank)) as f:
            result = json.load(f)
        assert result["ok"], result
