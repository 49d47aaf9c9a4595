"""A recv from a peer that never sends: Ctrl-C interrupts it within 1 s, and
a per-op timeout ends it with comms.Error(code="timeout")."""
from conftest import run_rank_script


def test_sigint_interrupts_blocked_recv(tmp_path):
    proc, results = run_rank_script(2, "rank_blocked.py", tmp_path, "sigint", timeout=30)
    assert results[0]["ok"], results[0]
    assert results[0]["comm_failed"], "the interrupted comm must be aborted (its op was still in flight)"


def test_sigint_interrupts_work_wait_and_leaves_the_op_in_flight(tmp_path):
    proc, results = run_rank_script(2, "rank_blocked.py", tmp_path, "sigint_wait", timeout=30)
    assert results[0]["ok"], results[0]
    assert not results[0]["comm_failed"], results[0]
    assert results[0]["pending_after_interrupt"], results[0]
    assert results[0]["status_after_abort"] == "aborted", results[0]


def test_recv_timeout_is_a_timeout_error_and_releases_the_gil(tmp_path):
    proc, results = run_rank_script(2, "rank_blocked.py", tmp_path, "timeout", timeout=30)
    assert results[0]["ok"], results[0]
