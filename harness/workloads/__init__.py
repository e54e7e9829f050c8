"""What a rank runs: the models and inputs, the systems compared (ours, torch's DDP, ZeRO/FSDP, DeepSpeed,
DataParallel's design in ``thread_replicas``; activation checkpointing in ``blocks``), a timed training iteration per
phase (``runner``, with torch's DDP logger read by ``breakdown``), the allreduce microbenchmark, convergence on real
data, memory by category. Imports ddp_impl, harness.launch and the point configs (harness.config, harness.cli)."""
