"""The data-parallel systems `make zero` compares: each trains like torch's DDP (same parameters after the same
steps), DataParallel on threads sums the replicas' gradients, memory categories and traffic are what the
model's size says, and what cannot run here is refused with its reason."""

import pytest
import torch
from torch import nn

from harness.config import TrainConfig, validate
from harness.launch.backends import check_backend
from harness.launch.spawn import RankContext, launch
from harness.sweep import run_point
from harness.workloads import memory
from harness.workloads.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.workloads.systems import ThreadReplicas, blocks, build, same_on_every_rank, state_tensors

CPU = RankContext(0, 1, 0, "gloo", torch.device("cpu"), 1, 60.0)
SYSTEMS = ("torch", "zero1", "fsdp", "fsdp_keep", "deepspeed1", "deepspeed2", "deepspeed3")


# The conv's bias feeds a BatchNorm, so its gradient is 0 up to rounding: Adam turns that rounding (which differs
# with the order of reduction) into full steps of either sign. Every other parameter must agree.
ROUNDING_ONLY = {"features.0.bias"}


def _full_parameters(trainer, skip=()) -> torch.Tensor:
    """The model's parameters, whole, on every rank (gathered where the system shards them), but ``skip``."""
    named = [(n.removeprefix("module."), p) for n, p in trainer.model.named_parameters()]
    params = [p for n, p in named if n not in skip]
    if hasattr(params[0], "ds_tensor"):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().reshape(-1).clone() for p in params])
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1) for p in params])


def _train_each_system(ctx):
    """Per optimizer, three steps of every system from the same weights on this rank's own inputs (different per
    rank): one launch for both, as DeepSpeed's first import in a rank takes seconds."""
    spec = input_spec("small", "cpu")
    inputs = make_inputs("small", spec, ctx.device, seed=ctx.rank)
    out = {}
    for optimizer, impl in ((o, i) for o in ("sgd", "adam") for i in SYSTEMS):
        trainer = build(seeded_model("small", 0), ctx, impl=impl, optimizer=optimizer, lr=0.2)
        for _ in range(3):
            trainer.backward(compute_loss("small", trainer.model, inputs))
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=False)
        out.setdefault(optimizer, {})[impl] = _full_parameters(trainer, ROUNDING_ONLY if optimizer == "adam" else ())
    return out


@pytest.fixture(scope="module")
def trained_ranks():
    return launch(_train_each_system, 2, timeout_s=180)


@pytest.fixture(scope="module", params=["sgd", "adam"])
def trained(request, trained_ranks):
    """Per rank, each system's parameters after 3 steps, and the parameters they all started from."""
    skip = ROUNDING_ONLY if request.param == "adam" else ()
    start = torch.cat([p.detach().reshape(-1) for n, p in seeded_model("small", 0).named_parameters() if n not in skip])
    return request.param, [r[request.param] for r in trained_ranks], start


def _assert_same_steps(trained, impls):
    """Each system's steps (parameters minus the start) equal torch's DDP's, on every rank."""
    _, ranks, start = trained
    reference = ranks[0]["torch"] - start
    assert reference.abs().max() > 0.01  # it trained
    for rank in ranks:
        for impl in impls:
            torch.testing.assert_close(rank[impl] - start, reference, rtol=1e-3, atol=1e-6, msg=f"{impl} differs")


def test_every_system_steps_like_torch_ddp(trained):
    """With Adam too: DeepSpeed clips the gradients' norm to 1.0 by default, which its configuration turns off
    (with it, DeepSpeed stepped like DDP once and then departed, as the first large gradients were clipped)."""
    _assert_same_steps(trained, SYSTEMS)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_data_parallel_threads_sum_the_replicas_gradients(checkpointing):
    """K replicas on threads give the gradient of the whole batch's mean loss, split K ways (the first
    replica's BatchNorm statistics from its own chunk, as nn.DataParallel keeps them)."""
    inputs = make_inputs("small", input_spec("small", "cpu", batch_size=12), torch.device("cpu"))
    dp = build(seeded_model("small", 0), CPU, impl="threads", replicas=3, checkpointing=checkpointing)
    dp.backward(compute_loss("small", dp.model, inputs))
    expected = seeded_model("small", 0)
    for x, y in zip(inputs["x"].tensor_split(3), inputs["y"].tensor_split(3)):
        (nn.functional.cross_entropy(expected(x), y) / 3).backward()
    assert all(p.grad is None for other in dp.model.others for p in other.parameters())  # summed, then cleared
    for got, want in zip(dp.model.module.parameters(), expected.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)
    assert isinstance(dp.model, ThreadReplicas) and len(list(dp.model.parameters())) == len(list(expected.parameters()))


def test_activation_checkpointing_recomputes_to_the_same_gradients():
    inputs = make_inputs("small", input_spec("small", "cpu"), torch.device("cpu"))
    grads, saved = [], []
    for checkpointing in (False, True):
        trainer = build(seeded_model("small", 0), CPU, impl="local", checkpointing=checkpointing)
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.numel()) or t, lambda t: t):
            loss = compute_loss("small", trainer.model, inputs)
        saved.append(sum(packed))
        trainer.backward(loss)
        grads.append([p.grad for p in trainer.model.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain)
    assert saved[1] < saved[0]  # forward kept each block's input, not what is inside it
    assert len(blocks(seeded_model("resnet50", 0))) == 16  # ResNet50's bottlenecks: 3 + 4 + 6 + 3


def test_memory_categories_name_the_model_state():
    """Adam on the small model: parameters, gradients and 2 moments per parameter, in bytes, before forward."""
    trainer = build(seeded_model("small", 0), CPU, impl="local", optimizer="adam")
    inputs = make_inputs("small", input_spec("small", "cpu"), torch.device("cpu"))

    def iteration():
        trainer.backward(compute_loss("small", trainer.model, inputs))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=False)

    iteration()
    _, prof = memory.profiled(iteration, state_tensors(trainer))
    nbytes = sum(p.numel() * 4 for p in trainer.model.parameters())
    assert prof.at_start["parameters"] == nbytes and prof.at_start["gradients"] == nbytes
    assert prof.at_start["optimizer_state"] >= 2 * nbytes  # exp_avg, exp_avg_sq (+ Adam's step counters)
    assert prof.peak > prof.at_start["parameters"] + prof.at_start["gradients"] + 2 * nbytes  # activations on top
    assert prof.timeline and prof.timeline[0][0] == 0


def test_memory_profile_counts_a_flat_buffer_seen_through_a_small_view_whole():
    """DeepSpeed and FSDP keep parameters as views of flat buffers; the profiler sizes a storage that predates it
    by the views ops took (here 40 bytes of a 4 MB buffer), the categories by the storage."""
    flat = torch.zeros(1_000_000)
    view = flat[:10]
    _, prof = memory.profiled(lambda: view.mul_(2))
    assert prof.at_start["other"] == pytest.approx(flat.untyped_storage().nbytes(), abs=64)


def test_file_backed_pages_are_not_counted_as_memory(tmp_path):
    """Code a system loads (DeepSpeed's compiled ops) is resident file pages, not training data."""
    import mmap

    path = tmp_path / "blob"
    path.write_bytes(b"x" * (32 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        before, rss = memory.current_bytes(CPU.device), memory._status_kib("VmRSS")
        assert sum(pages[i] for i in range(0, len(pages), 4096)) == 120 * (len(pages) // 4096)  # every page read
        assert memory._status_kib("VmRSS") - rss >= 30 << 10  # KiB: the file is resident...
        assert abs(memory.current_bytes(CPU.device) - before) < 4 << 20  # ...and not counted


def test_memory_point_measures_traffic_and_state_per_rank():
    """torch's DDP at 2 ranks in a private network namespace: each rank sends one ring all-reduce of the
    gradients (2 (N-1)/N x 4 bytes per parameter; its sockets' payload, so within the barriers' and the buffer
    broadcast's few hundred bytes); FSDP (ZeRO-3) holds about half the model state per rank."""
    base = dict(
        model="small", world_size=2, iters=1, warmup=1, net="10gbit", memory=True, optimizer="adam", timeout_s=60
    )
    ddp = run_point(TrainConfig(impl="torch", **base))
    params = ddp[0]["num_params"]
    for row in ddp:
        assert row["sent_bytes"] == pytest.approx(4 * params, rel=0.02)
        assert row["mem_model_state_bytes"] >= 16 * params  # 4 + 4 + 8 bytes per parameter
        assert row["mem_profiled_peak_bytes"] == sum(row[f"mem_{c}_bytes"] for c in memory.CATEGORIES)
        assert row["mem_communication_buffers_bytes"] >= 4 * params  # DDP's bucket holds every gradient
    fsdp = run_point(TrainConfig(impl="fsdp", **base))
    for row in fsdp:
        assert row["mem_model_state_bytes"] == pytest.approx(8 * params, rel=0.1)
    for row in run_point(TrainConfig(impl="deepspeed3", **base)):  # its parameters are partitioned away in place
        assert row["num_params"] == params


def _build_from(ctx, offsets):
    """Per DDP: whether this rank's model (seeded, plus ``offsets[rank]``) was found the same on every rank, and
    its parameters after build: equal across ranks whether build skipped DDP's broadcast or not."""
    out = {}
    for impl in ("ours", "torch"):
        model = seeded_model("small", 0)
        with torch.no_grad():
            next(model.parameters()).add_(offsets[ctx.rank])
        same = same_on_every_rank(model, ctx)
        trainer = build(model, ctx, impl=impl)
        out[impl] = same, torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]).tolist()
    return out


@pytest.mark.parametrize("offsets, same", [((0.0, 0.0), True), ((0.0, 1e-6), False)])
def test_build_broadcasts_the_model_only_where_ranks_differ(offsets, same):
    per_rank = launch(_build_from, 2, "gloo", args=(offsets,), timeout_s=60)
    for impl in ("ours", "torch"):
        assert [r[impl][0] for r in per_rank] == [same, same]
        assert per_rank[0][impl][1] == per_rank[1][impl][1]  # rank 0's weights everywhere, broadcast or not


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(impl="fsdp", sync_every=2), "no_sync"),
        (dict(impl="zero1", comm_hook="fp16"), "needs impl 'ours' or 'torch'"),
        (dict(impl="torch", replicas=2), "replicas=2 needs impl='threads'"),
        (dict(impl="threads", world_size=2, replicas=2), "world_size must be 1"),
        (dict(impl="deepspeed3", overlap=False), "overlap=False"),
    ],
)
def test_settings_a_system_cannot_honour_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        validate(TrainConfig(model="small", **fields))


@pytest.mark.skipif(torch.distributed.is_mpi_available(), reason="this torch has MPI")
def test_mpi_is_refused_with_the_reason_where_torch_has_no_mpi():
    with pytest.raises(ValueError, match="is_mpi_available"):
        check_backend("mpi", 2)


def _collective_traffic(ctx, cfg):
    """Bytes each rank sends per byte of the full tensor, for the collectives ZeRO uses."""
    import torch.distributed as dist

    n = 2**20 * ctx.world_size
    full, shard = torch.ones(n), torch.empty(n // ctx.world_size)
    out = {}
    for name, op in [
        ("all_reduce", lambda: dist.all_reduce(full)),
        ("all_gather", lambda: dist.all_gather_into_tensor(full, shard)),
        ("reduce_scatter", lambda: dist.reduce_scatter_tensor(shard, full)),
    ]:
        dist.barrier()
        before = memory.sent_bytes()
        op()
        dist.barrier()
        out[name] = (memory.sent_bytes() - before) / (4 * n)
    return [out]


def test_gloo_reduce_scatter_sends_as_much_as_an_all_reduce():
    """Why FSDP on Gloo sends 4 units where ZeRO-3's theory says 3: Gloo's reduce-scatter costs an all-reduce
    (2 (N-1)/N), not (N-1)/N. Measured on the wire of a private namespace, 2 ranks."""
    sent = run_point(TrainConfig(model="small", world_size=2, net="10gbit", timeout_s=60), fn=_collective_traffic)[0]
    # 15%: far from the factor 2 at stake; the emulated link's retransmissions once added 8% to one collective
    assert sent["all_gather"] == pytest.approx(0.5, rel=0.15)
    assert sent["all_reduce"] == pytest.approx(1.0, rel=0.15)
    assert sent["reduce_scatter"] == pytest.approx(sent["all_reduce"], rel=0.15)
