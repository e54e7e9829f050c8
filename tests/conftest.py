# torch's own DDP suite (tests/torch_suite) takes ~12 minutes: it runs by `make torch-ddp-tests`, not `make test`
collect_ignore = ["torch_suite"]
