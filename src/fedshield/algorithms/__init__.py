"""Client (local update rules) and server algorithms, registered by config name."""
