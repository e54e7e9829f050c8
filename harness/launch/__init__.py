"""Starting ranks and ending them: the one launcher (spawned processes, or torchrun/SLURM in place), process
groups and their end, backend and environment checks, the allocator setting, injected faults and the errors a
failed launch names. Imports torch and ddp_impl only; nothing else of the harness."""
