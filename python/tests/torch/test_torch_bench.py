"""scripts/torch_bench.py runs (tiny sizes and counts: nothing here is timed)
under commsrun on 2 ranks, checks each row by value and writes its JSON: the
torch gloo row, comms' own binding, and torch over comms when comms.torch is
built."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
BUILD = os.path.abspath(os.environ["COMMS_BUILD_DIR"])
BENCH = os.path.join(SOURCE_ROOT, "scripts", "torch_bench.py")


def test_the_bench_runs_every_row_it_can_and_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "COMMS_STORE")}
    env["PYTHONPATH"] = os.path.join(BUILD, "python")
    p = subprocess.run([os.path.join(BUILD, "tools", "commsrun"), "-n", "2", "--timeout", "120", "--",
                        sys.executable, BENCH, "--small-iters", "20", "--large-iters", "2", "--rounds", "2",
                        "--large-bytes", str(1 << 20), "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    built = subprocess.run([sys.executable, "-c", "import comms.torch"], env=env, capture_output=True).returncode == 0
    assert built or os.environ.get("COMMS_TORCH_BUILT") != "1", "comms.torch is built but does not import"
    want = ["torch gloo", "torch comms", "comms direct"] if built else ["torch gloo", "comms direct"]
    assert list(doc["rows"]) == want, doc
    for name, row in doc["rows"].items():
        assert row["small_samples"] == 40 and row["large_samples"] == 4, (name, row)
        assert 0 < row["p10_us"] <= row["p50_us"] <= row["p90_us"], (name, row)
        assert row["busbw_GBps"] > 0, (name, row)
    assert (doc["world_size"], doc["small_bytes"], doc["large_bytes"]) == (2, 4096, 1 << 20)
    assert set(doc["ratios"]) == ({"p50_comms_over_gloo", "busbw_comms_over_gloo", "torch_layer_us"} if built
                                  else set())
    assert "[0] torch gloo" in p.stdout, p.stdout
