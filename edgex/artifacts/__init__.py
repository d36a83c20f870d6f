"""Output layout, manifest and atomic writes."""
