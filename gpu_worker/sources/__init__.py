"""Where a rank's bytes come from: S3 GETs of the objects, the run's own files, ranged reads of a shard."""
