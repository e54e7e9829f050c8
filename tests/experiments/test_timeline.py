"""The per-bucket timeline: traced stamps are ordered as the algorithm orders them, and the figure and the Chrome
trace are written from the stored point."""

import json

from experiments.tools import timeline
from harness import load_results


def test_timeline_traces_ready_launch_and_true_completion(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    args = ["--model=small", "--bucket_cap_mb=0.05", "--profile=cpu", "--iters=3", "--warmup=2", "--net=loopback"]
    assert timeline.main(args) == 0
    df = load_results("timeline", tmp_path)
    assert len(df) == 2 * 3 and df["trace_buckets"].all()
    for row in df.itertuples():
        t = json.loads(row.bucket_times_json)
        assert len(t["ready_ms"]) > 1  # several buckets at a 50 KiB cap
        for ready, launch, done in zip(t["ready_ms"], t["launch_ms"], t["done_ms"]):
            assert t["backward_start_ms"] <= ready <= launch <= done  # done: stamped by a completion callback
        assert t["launch_ms"] == sorted(t["launch_ms"])  # buckets launch in order
    trace = json.loads((tmp_path / "figures" / "timeline.trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1} and {e["tid"] for e in spans} == {"compute", "comm"}
    assert all(e["dur"] >= 0 for e in spans) and any(e["name"].endswith("allreduce") for e in spans)
    assert (tmp_path / "figures" / "timeline.png").stat().st_size > 0
