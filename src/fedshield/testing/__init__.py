"""Test harnesses shipped with the package (round-loop fuzzing)."""
