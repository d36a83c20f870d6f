"""`edgex build`: a declarative build matrix exported artifact by artifact through `export_model`,
with a content-addressed cache, deterministic shards, and JUnit / JSON / Markdown reports for CI."""
