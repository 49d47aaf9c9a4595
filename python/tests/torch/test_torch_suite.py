"""The driver of torch's own distributed suite (suite/torch_suite.py): a run
over torch's gloo records each test's outcome, a comms run without
comms.torch stops saying so, and compare lists every test that passes on the
baseline and not on the candidate, with its reason."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "suite", "torch_suite.py")


def driver(*args, timeout=300):
    return subprocess.run([sys.executable, DRIVER] + list(args), capture_output=True, text=True, timeout=timeout)


def test_a_gloo_run_records_each_test_with_its_outcome(tmp_path):
    out = tmp_path / "gloo.json"
    # One test that passes, one that skips at the parent (torch's nccl-only test) and
    # one that skips in the ranks (no accelerator).
    # Forked ranks: a spawned rank imports torch afresh, tens of seconds per test on two loaded cores.
    p = driver("run", "--backend", "gloo", "--start-method", "fork", "--json", str(out), "-k", "test_get_rank_size_group",
               "-k", "test_send_recv_nccl_autograd_profiler", "-k", "test_all_reduce_sum_cuda_async")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert (doc["backend"], doc["world_size"]) == ("gloo", 4)
    outcomes = {t["name"]: (t["outcome"], t["reason"]) for t in doc["tests"]}
    assert outcomes == {
        "test_get_rank_size_group": ("pass", ""),
        "test_send_recv_nccl_autograd_profiler": ("skip", "NCCL Send Recv Only"),
        "test_all_reduce_sum_cuda_async": ("skip", "accelerator is not available."),
    }, outcomes
    assert doc["summary"] == {"pass": 1, "fail": 0, "error": 0, "skip": 2, "total": 3}
    assert "1 passed, 0 failed, 2 skipped" in p.stdout
    assert "=== test_get_rank_size_group" in (tmp_path / "gloo.log").read_text()


def test_comms_without_comms_torch_stops_saying_so(tmp_path):
    empty_build = tmp_path / "build"
    (empty_build / "python").mkdir(parents=True)
    p = driver("run", "--backend", "comms", "--build", str(empty_build), "--json", str(tmp_path / "c.json"))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "comms.torch not built" in p.stderr
    p = driver("run", "--backend", "comms", "--build", str(empty_build), "--skip-unbuilt")
    assert p.returncode == 0 and p.stdout.endswith("0 passed, 0 failed, 1 skipped\n"), p.stdout + p.stderr
    assert "comms.torch not built" in p.stderr


def document(backend, outcomes, torch_version="2.15.0"):
    return {"backend": backend, "world_size": 4, "torch": torch_version, "tests": [
        {"name": n, "outcome": o, "reason": r, "seconds": 1.0} for n, (o, r) in outcomes.items()]}


def test_compare_lists_every_baseline_pass_that_does_not_pass_with_its_reason(tmp_path):
    base = tmp_path / "base.json"
    cand = tmp_path / "cand.json"
    base.write_text(json.dumps(document("gloo", {
        "test_a": ("pass", ""), "test_b": ("pass", ""), "test_c": ("pass", ""), "test_d": ("pass", ""),
        "test_e": ("skip", "CUDA"), "test_f": ("error", "boom")})))
    cand.write_text(json.dumps(document("comms", {
        "test_a": ("pass", ""), "test_b": ("skip", "Only gloo backend supports timeouts"),
        "test_c": ("error", "RuntimeError: comms: all_reduce timed out"), "test_e": ("skip", "CUDA"),
        "test_f": ("pass", "")})))
    p = driver("compare", str(base), str(cand))
    assert p.returncode == 1, p.stdout
    assert "1 of the 4 tests that pass on gloo pass on comms" in p.stdout
    assert "test_b" in p.stdout and "Only gloo backend supports timeouts" in p.stdout
    assert "RuntimeError: comms: all_reduce timed out" in p.stdout
    assert "not run on comms" in p.stdout  # test_d
    assert "pass on comms but not on gloo (1): test_f" in p.stdout
    # A skip is not a pass: it fails the comparison unless the allow-list
    # names it, with a reason.
    cand.write_text(json.dumps(document("comms", {
        "test_a": ("pass", ""), "test_b": ("skip", "Only gloo backend supports timeouts"),
        "test_c": ("pass", ""), "test_d": ("pass", "")})))
    p = driver("compare", str(base), str(cand))
    assert p.returncode == 1, p.stdout
    assert "not passing and not allowed on comms (1)" in p.stdout
    allow = tmp_path / "allow.txt"
    allow.write_text("test_b  # torch checks BACKEND == 'gloo'\n")
    p = driver("compare", "--allow", str(allow), str(base), str(cand))
    assert p.returncode == 0, p.stdout
    assert "3 of the 4 tests that pass on gloo pass on comms" in p.stdout
    assert "allowed not to pass on comms (1)" in p.stdout and "test_b" in p.stdout
    # A listed test that passes makes the list stale; a listed name without a reason is refused.
    allow.write_text("test_b  # gloo only\ntest_c  # was broken\n")
    p = driver("compare", "--allow", str(allow), str(base), str(cand))
    assert p.returncode == 1 and "pass on comms (remove them from" in p.stdout and "test_c" in p.stdout, p.stdout
    # So does a listed test that does not pass on the baseline (test_e skips there, test_z is not in it).
    allow.write_text("test_b  # gloo only\ntest_e  # CUDA\ntest_z  # gone\n")
    p = driver("compare", "--allow", str(allow), str(base), str(cand))
    assert p.returncode == 1, p.stdout
    assert "do not pass on gloo either (remove them from" in p.stdout, p.stdout
    assert "test_e (skip), test_z (missing)" in p.stdout, p.stdout
    allow.write_text("test_b\n")
    p = driver("compare", "--allow", str(allow), str(base), str(cand))
    assert p.returncode != 0 and "test_b has no reason" in p.stderr, p.stdout + p.stderr


def test_compare_refuses_runs_on_different_torch_releases(tmp_path):
    base = tmp_path / "base.json"
    cand = tmp_path / "cand.json"
    base.write_text(json.dumps(document("gloo", {"test_a": ("pass", "")}, torch_version="1.13.0a0")))
    cand.write_text(json.dumps(document("comms", {"test_a": ("pass", "")}, torch_version="2.15.0+cu132")))
    p = driver("compare", str(base), str(cand))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "recorded on torch 1.13" in p.stderr and "ran on torch 2.15" in p.stderr, p.stderr
    # A build of the same release (local version, patch) compares.
    base.write_text(json.dumps(document("gloo", {"test_a": ("pass", "")}, torch_version="2.15.0")))
    p = driver("compare", str(base), str(cand))
    assert p.returncode == 0 and "1 of the 1 tests that pass on gloo pass on comms" in p.stdout, p.stdout + p.stderr
