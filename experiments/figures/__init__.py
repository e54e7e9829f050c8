"""The paper's figure drivers, one ``figNN_<what>.py`` each, and ``zero`` (DDP beside ZeRO/FSDP/DeepSpeed, beyond
the paper), all filling the contract in ``experiments/common.py``. Run as ``python -m experiments fig7`` or
``make fig7``; ``experiments/registry.py`` finds them by listing this folder."""
