"""ZeRO's theory, which ``experiments/figures/zero.py`` checks its measurements against: the model-state bytes per rank
of each system (ZeRO paper, Section 5) and the bytes a rank sends per iteration."""

from __future__ import annotations

ADAM_STATE_BYTES = 8  # K: two fp32 moments per parameter (plain SGD keeps none)


def model_state_formula(impl: str, params: int, world_size: int, k: int) -> float:
    """ZeRO's model-state bytes per rank in fp32: parameters, gradients, K bytes of optimizer state per parameter,
    each term divided by N where the system shards it (ZeRO paper, Section 5 with 4-byte weights and gradients).
    FSDP2 at rest is sharded like ZeRO-3 whether or not it reshards after forward. ``world_size`` is N (for
    ``threads``, its replicas)."""
    n, p = world_size, params
    if impl in ("zero1", "deepspeed1"):
        return 4 * p + 4 * p + k * p / n
    if impl == "deepspeed2":
        return 4 * p + (4 + k) * p / n
    if impl in ("fsdp", "fsdp_keep", "deepspeed3"):
        return (4 + 4 + k) * p / n
    if impl == "threads":  # N replicas' parameters in the one process, gradients summed into the first's
        return 4 * p * n + 4 * p + k * p
    return (4 + 4 + k) * p


# ring all-reduce sends 2 (N-1)/N of the gradient bytes per rank; all-gather, reduce-scatter, broadcast one each
TRAFFIC_UNITS = {
    "ours": 2,
    "torch": 2,
    "zero1": 3,
    "fsdp": 3,
    "fsdp_keep": 2,
    "deepspeed1": 2,
    "deepspeed2": 2,
    "deepspeed3": 3,
}


def traffic_formula(impl: str, params: int, world_size: int) -> float:
    """Bytes a rank sends per iteration in theory: DDP one all-reduce (2 units of (N-1)/N x 4 bytes x params);
    ZeRO-1 adds the updated parameters' broadcast; ZeRO-3 all-gathers in forward and in backward and
    reduce-scatters (3 units, 1.5x DDP); FSDP without resharding gathers once; DeepSpeed 1/2 reduce-scatter and
    all-gather."""
    n = world_size
    return TRAFFIC_UNITS.get(impl, 0) * (n - 1) / n * 4 * params


def state_bytes_per_param(optimizer: str) -> int:
    """K, the optimizer state per parameter: Adam's two moments, none for plain SGD."""
    return ADAM_STATE_BYTES if optimizer == "adam" else 0
