"""The modules of `benchmarks/replay.py`, one per mode (suffix, policy, translate) over
the shared virtual clock and stand-in target (common). Not scripts: run the command."""
