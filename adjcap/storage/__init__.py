"""Storage: files written atomically, the one file lock, Parquet parts, content ids, and what a run directory holds (its layout, provenance.json, samples.parquet)."""
