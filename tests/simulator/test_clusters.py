"""Named clusters: FLOP counts against hand-computed ones, calibrations from the stated numbers, predictions
that add up by hand, and the command line."""
import json
from pathlib import Path

import pytest

from tests.in_process import run_experiments
import torch

from simulator.clusters import CLUSTERS, STORED_FLOPS, cluster_calibration, count_flops, flop_profile
from simulator.predict import Scenario, predict

REPO = Path(__file__).resolve().parents[2]
BATCH = 32  # the paper profile's batch for the small model (harness.models.INPUTS), 32 x 32 images

# SmallNet per sample: conv 3->16, 3x3, on 32x32 (2 FLOPs per multiply-add), Linear 256->64, Linear 64->10
CONV = 2 * 16 * 3 * 9 * 32 * 32
FC1, FC2 = 2 * 256 * 64, 2 * 64 * 10


def test_flops_counted_per_parameter_match_a_hand_count():
    fp = flop_profile("small")
    assert fp.forward_flops == BATCH * (CONV + FC1 + FC2)
    # backward: each Linear computes its input's and its weight's gradient; the first conv only its weight's
    assert fp.backward_flops == BATCH * (CONV + 2 * FC1 + 2 * FC2)
    ready = dict(zip(("conv.w", "conv.b", "bn.w", "bn.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"), fp.ready_flops))
    assert ready["fc2.w"] == BATCH * 2 * FC2  # the last layer's gradients come first
    assert ready["fc1.w"] == BATCH * (2 * FC2 + 2 * FC1)
    assert ready["conv.w"] == fp.backward_flops  # the first layer's last
    assert sum(fp.param_bytes) == 4 * sum((16 * 27, 16, 16, 16, 256 * 64, 64, 64 * 10, 10))


def test_a_cluster_calibration_is_its_stated_numbers():
    c = CLUSTERS["paper-v100"]
    fp = flop_profile("small")
    cal = cluster_calibration("paper-v100", "small", "nccl", 8)
    flops_per_ms = c.device.sustained_tflops * 1e9
    assert cal.profile.forward_ms == pytest.approx(fp.forward_flops / flops_per_ms)
    assert cal.profile.backward_ms == pytest.approx(fp.backward_flops / flops_per_ms)
    assert cal.comm == c.links["nccl"].intra  # 8 GPUs: one server
    wide = cluster_calibration("paper-v100", "small", "nccl", 16).comm
    assert wide.beta_ms_per_byte == pytest.approx(8e-6 / 90.0)  # two servers: the NIC (90% of 100 Gbit/s)
    assert cluster_calibration("cloud-v100-25g", "small", "nccl", 16).comm.beta_ms_per_byte > wide.beta_ms_per_byte
    faster = c.with_bandwidth(2.0).links["gloo"]
    assert faster.inter.beta_ms_per_byte == pytest.approx(c.links["gloo"].inter.beta_ms_per_byte / 2)
    assert faster.intra.alpha_ms == c.links["gloo"].intra.alpha_ms  # latency is not bandwidth
    with pytest.raises(ValueError, match="must be > 0"):
        c.with_bandwidth(0)
    with pytest.raises(ValueError, match="unknown cluster"):
        cluster_calibration("nope", "small", "nccl", 8)
    with pytest.raises(ValueError, match="no numbers for backend 'mpi'"):
        cluster_calibration("paper-v100", "small", "mpi", 8)


def test_a_cluster_prediction_adds_up_by_hand():
    one = cluster_calibration("paper-v100", "small", "nccl", 1)
    p, copies = one.profile, 2 * sum(one.profile.param_bytes) * one.copy_ms_per_byte  # into buckets and back
    assert predict(one, Scenario())["predicted_ms"] == pytest.approx(
        p.forward_ms + p.backward_ms + p.optimizer_ms + copies)
    # one bucket, no overlap, 16 GPUs: the whole gradient's ring allreduce after backward, plus the BN broadcast
    cal = cluster_calibration("paper-v100", "small", "gloo", 16)
    nbytes = sum(p.param_bytes)
    ring = cal.comm.allreduce_ms(nbytes, 16)
    broadcast = cal.comm.allreduce_ms(one.buffer_bytes, 16) / 2
    got = predict(cal, Scenario(bucket_cap_mb=1000, overlap=False))["predicted_ms"]
    assert got == pytest.approx(p.forward_ms + broadcast + p.backward_ms + ring + p.optimizer_ms + copies)


def _predict(*args):
    return run_experiments("predict", *args, cwd=REPO)


def test_predict_command_speaks_for_a_named_cluster():
    done = _predict("--cluster=paper-v100", "--model=small", "--world_size=256", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    want = predict(cluster_calibration("paper-v100", "small", "nccl", 256), Scenario())["predicted_ms"]
    assert out["predicted_ms"] == pytest.approx(want) and out["point"]["backend"] == "nccl"
    assert out["calibration"] == "paper-v100"
    for args, message in ((["--cluster=nope"], "unknown cluster 'nope'; choose one of"),
                          (["--cluster=paper-v100", "--calibration=x.json"], "exclude each other")):
        bad = _predict(*args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
        assert message in bad.stderr and "Traceback" not in bad.stderr


def test_stored_flop_profiles_are_what_counting_gives_with_this_torch():
    assert f"resnet50 torch {torch.__version__}" in STORED_FLOPS.read_text()  # else: store_flop_profiles()
    assert flop_profile("resnet50") == count_flops("resnet50")


def test_the_v100_clusters_factors_are_what_fitting_the_papers_overlap_speedups_gives():
    from simulator.clusters import (GLOO_SCALE, PAPER_OVERLAP_SPEEDUP, V100_COMPUTE_SCALE, fit_to_paper,
                                    overlap_speedup)

    scale, gloo = fit_to_paper()
    assert scale == pytest.approx(V100_COMPUTE_SCALE, rel=0.01) and gloo == pytest.approx(GLOO_SCALE, rel=0.01)
    for (model, backend), paper in PAPER_OVERLAP_SPEEDUP.items():
        got = overlap_speedup("paper-v100", model, backend)
        # NCCL's are fitted (one compute factor per model); Gloo's two share one rate factor: close, not equal
        assert got == pytest.approx(paper, abs=0.2 if backend == "nccl" else 2.0)
    # the factor scales the FLOP-counted compute (ResNet50 faster than 9.1 TFLOP/s implies), not the optimizer
    fp, c = flop_profile("resnet50"), CLUSTERS["paper-v100"]
    cal = cluster_calibration(c, "resnet50", "nccl", 8)
    assert cal.profile.backward_ms == pytest.approx(fp.backward_flops * V100_COMPUTE_SCALE["resnet50"]
                                                    / (c.device.sustained_tflops * 1e9))
    assert cal.profile.optimizer_ms == pytest.approx(cluster_calibration(c, "small", "nccl", 8).profile.optimizer_ms
                                                     * sum(fp.param_bytes) / sum(flop_profile("small").param_bytes))
