"""examples/trainer.py against the C++ examples/trainer: the same final_loss
(1e-5 relative) and the same step lines, on both COMMS_ROUTE values."""
import os
import re
import subprocess
import time

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


HEAL_STEPS = "4000"  # long enough for a replacement to start and be admitted before the end
GROWN = re.compile(r"grown: ranks \[3\] joined in [\d.]+ ms at step (\d+), world 4 \(state transfer [\d.]+ ms\)")


def environment_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        entries = [e.decode() for e in f.read().split(b"\0") if b"=" in e]
    return dict(e.split("=", 1) for e in entries)


def test_elastic_heal_a_replacement_joins_and_the_loss_equals_a_planned_shrink_and_grow():
    program = [PYTHON, PY_TRAINER, "--elastic", "--steps", HEAL_STEPS, "--print-every", "500"]
    env = job_env(COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    failed = subprocess.run([COMMSRUN, "-n", "4", "--keep-going", "--replace", "--timeout", "100", "--"] + program +
                            ["--fail-rank", "1", "--fail-step", "7"], env=env, capture_output=True, text=True,
                            timeout=115)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 0, out
    assert "recovered: lost ranks [1] in " in out, out
    assert re.search(r"--replace: 1 replacement: \+1 \(pid \d+, in place of rank 1\)", out), out
    grown = GROWN.findall(out)
    assert len(grown) == 1 and int(grown[0]) >= 7, out
    final = re.findall(r"final_loss=(\S+) world=4", out)
    assert len(final) == 1, out

    # The same shrink and grow by plan; the test starts the newcomer with a
    # rank's environment (the job's store), as commsrun --replace would.
    plan = ["--shrink-rank", "1", "--shrink-step", "7", "--grow-step", grown[0]]
    job = subprocess.Popen([COMMSRUN, "-n", "4", "--timeout", "100", "--"] + program + plan, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        children = []
        deadline = time.monotonic() + 20
        while len(children) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            with open("/proc/%d/task/%d/children" % (job.pid, job.pid)) as f:
                children = [int(c) for c in f.read().split()]
        assert children, "commsrun started no ranks"
        newcomer_env = environment_of(children[0])
        newcomer_env.pop("RANK", None)
        newcomer_env["COMMS_REPLACEMENT"] = "1"
        newcomer = subprocess.run(program + plan, env=newcomer_env, capture_output=True, text=True, timeout=100)
        planned, _ = job.communicate(timeout=100)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, planned
    assert newcomer.returncode == 0, newcomer.stdout + newcomer.stderr
    assert "joined as rank 3 of 4 before step %s:" % grown[0] in newcomer.stdout, newcomer.stdout
    assert GROWN.findall(planned) == grown, planned
    assert re.findall(r"final_loss=(\S+) world=4", planned) == final, (out, planned)
