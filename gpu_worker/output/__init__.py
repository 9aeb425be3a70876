"""What a rank writes: Parquet chunks and their commit markers, the shard's result and verdict."""
