"""The machine: its accelerators, portable numerics, what a config needs on it, and the doctor that says so."""
