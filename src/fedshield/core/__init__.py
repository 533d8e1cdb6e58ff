"""Values and helpers shared by every package (no imports from sim/, algorithms/, flower/)."""
