"""The prepare stage's reduce side: each reduce worker deduplicates its partition and writes its shards."""
