"""The paper's figures and the tools around them, one way in: ``python -m experiments <name>`` (``list`` names
them all). ``figures/`` holds one driver per figure (and ``zero``), each filling the contract of ``common.py``;
``tools/`` the commands that measure or answer beyond a figure (bench, bucket-cost, gpu-check, predict, tune, ...);
this level the code they share: the driver contract, plotting and its legibility checks, verdicts, the registry of
what is stored, the paper-scale panels, statistics and the parity check. May import ddp_impl, harness, simulator."""
