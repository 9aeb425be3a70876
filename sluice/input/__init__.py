"""What a run reads: the uploaded manifest and every key it names, validated at the boundary.

manifest (the upload -> a Manifest), strictjson and lines (JSON and key-list lines as Sluice
reads them), sources (key lists, prefixes, inline keys), inventory (S3 Inventory reports),
keys (the source a manifest names, filtered), checks (checks that need settings or S3, and the
one classification of input-reading errors), incremental (an incremental run's input as tasks).
Nothing here writes: every problem becomes a ManifestRejected reason naming the line, key or field.
"""
