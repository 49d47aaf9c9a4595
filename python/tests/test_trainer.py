"""examples/trainer.py against the C++ examples/trainer: the same final_loss
(1e-5 relative) and the same step lines, on both COMMS_ROUTE values."""
import os
import re
import subprocess

import pytest

from conftest import BUILD, COMMSRUN, PYTHON, SOURCE_ROOT, job_env, run_job

CXX_TRAINER = os.path.join(BUILD, "examples", "trainer")
PY_TRAINER = os.path.join(SOURCE_ROOT, "examples", "trainer.py")


def losses(output):
    """{step: loss} and final_loss from rank 0's lines ("[0] step 20 loss 0.5")."""
    steps = {int(s): float(v) for s, v in re.findall(r"step (\d+) loss (\S+)", output)}
    final = re.findall(r"final_loss=(\S+)", output)
    assert len(final) == 1, output
    return steps, float(final[0])


def run_both(n, route, *args):
    env = job_env(COMMS_ROUTE=route)
    cxx = run_job(n, [CXX_TRAINER] + list(args), env=env)
    py = run_job(n, [PYTHON, PY_TRAINER] + list(args), env=env)
    assert cxx.returncode == 0, cxx.stdout + cxx.stderr
    assert py.returncode == 0, py.stdout + py.stderr
    return cxx.stdout, py.stdout


@pytest.mark.parametrize("route", ["direct", "split"])
def test_final_loss_matches_cxx_at_4_ranks(route):
    cxx, py = run_both(4, route, "--steps", "100")
    cxx_steps, cxx_final = losses(cxx)
    py_steps, py_final = losses(py)
    assert abs(py_final - cxx_final) <= 1e-5 * abs(cxx_final), (py_final, cxx_final)
    assert sorted(py_steps) == sorted(cxx_steps) == [1, 20, 40, 60, 80, 100]
    for step, loss in cxx_steps.items():
        assert abs(py_steps[step] - loss) <= 1e-5 * abs(loss), (step, py_steps[step], loss)
    assert "route %s" % route in py and "trainer: 4 ranks (data parallel), backend cpu:gloo" in py, py
    assert py_final < 0.5 * cxx_steps[1], "the loss did not fall"


def test_mlp_with_offload_and_parallel_layout_matches_cxx():
    args = ["--steps", "30", "--print-every", "10", "--model", "mlp", "--offload-every", "15",
            "--parallel", "tp=2,order=tp-dp"]
    cxx, py = run_both(4, "direct", *args)
    assert abs(losses(py)[1] - losses(cxx)[1]) <= 1e-5 * abs(losses(cxx)[1])
    cxx_other = [l for l in cxx.splitlines() if " loss " not in l and "final_loss" not in l]
    py_other = [l for l in py.splitlines() if " loss " not in l and "final_loss" not in l]
    assert py_other == cxx_other, (py_other, cxx_other)  # header and offload/reload reports
    assert any("offload: groups=" in l for l in py_other), py


def run_elastic(program, *args):
    """trainer --elastic under commsrun --keep-going at 4 ranks; returns its output."""
    cmd = [COMMSRUN, "-n", "4", "--keep-going", "--timeout", "60", "--"] + program + [
        "--elastic", "--steps", "30", "--print-every", "10"] + list(args)
    proc = subprocess.run(cmd, env=job_env(COMMS_OP_TIMEOUT="20s"), capture_output=True, text=True, timeout=75)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_elastic_loss_of_a_killed_rank_equals_a_planned_shrink_and_the_cxx_trainer():
    failed = run_elastic([PYTHON, PY_TRAINER], "--fail-rank", "2", "--fail-step", "9")
    planned = run_elastic([PYTHON, PY_TRAINER], "--shrink-rank", "2", "--shrink-step", "9")
    cxx = run_elastic([CXX_TRAINER], "--shrink-rank", "2", "--shrink-step", "9")
    assert "recovered: lost ranks [2] in " in failed and "lost ranks [2]" in failed, failed
    final = re.findall(r"final_loss=(\S+) world=3", failed)
    assert final and final == re.findall(r"final_loss=(\S+) world=3", planned), (failed, planned)
    cxx_final = float(re.findall(r"final_loss=(\S+) world=3", cxx)[0])
    assert abs(float(final[0]) - cxx_final) <= 1e-5 * abs(cxx_final), (final, cxx_final)
