"""The paper's figure drivers, one ``figNN_<what>.py`` each, all filling the contract in ``experiments/common.py``.
Run as ``python -m experiments fig7`` or ``make fig7``; ``experiments/registry.py`` finds them by listing this
folder. The tools (bench, predict, tune, ...) stay in ``experiments/``."""
