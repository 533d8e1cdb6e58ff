"""The in-process simulator: the FL round loop (DRAG paper, Sec. II-A), checkpoints and run
outputs."""
