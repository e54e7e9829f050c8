"""Calibrating the simulator on this machine: ``calibrate`` runs the probe on a point's own ranks and network through
the harness and fits a :class:`~simulator.model.calibration.Calibration` to it (``call_fit``: the link's fit to the
calls timed inside backward); ``rank`` is one rank's probe; ``stand_in`` times DDP's host work on a host-bound
stand-in model; ``flops`` counts the FLOPs of the harness's models for named clusters. Imports ``harness``,
``ddp_impl`` and ``simulator.model``.
"""
