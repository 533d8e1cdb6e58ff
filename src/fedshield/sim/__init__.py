"""The in-process simulator: the SPEC §1 round loop, checkpoints and run outputs."""
