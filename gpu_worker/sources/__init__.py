"""Where a rank's bytes come from: S3 GETs of the objects (fetch), the S3 clients and the run's own files (clients)."""
