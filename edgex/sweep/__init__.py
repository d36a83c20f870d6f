"""`edgex sweep`: many exports of one model for one target, one table, one plot, one recommendation.

A sweep is a build: its points are `edgex build` jobs (one `export_model` call per artifact, gated
exactly as `edgex export` gates it) run through the build cache, so an artifact already exported
with identical inputs is reused after its files are re-hashed (`edgex.build.cache`). `run.py` makes
the jobs and the rows, `report.py` writes the table, JSON, CSV and the placement file, `plot.py`
the picture.
"""
