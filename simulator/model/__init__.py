"""The simulator's model, harness-free: ``comm`` (allreduce cost models and their fit), ``iteration`` (the compute
profile, ddp_impl's buckets, the event simulation), ``calibration`` (the numbers a prediction needs, stored as
versioned JSON), ``host_cost`` (DDP's host work from timed backwards), ``scenario`` (a point's prediction, with what
DDP itself adds), ``recommend`` (the bucket cap to recommend), ``clusters`` (named GPU clusters' calibrations from
stated numbers) with ``cluster_data`` and ``cluster_types`` (those numbers and their sources), ``h100_measured``
(one H100's own measurements), ``flop_profiles`` and ``shapes`` (an iteration's proportions from stored FLOP counts).
Imports torch, numpy and ``ddp_impl`` only: nothing of the harness, not even inside functions.
"""
