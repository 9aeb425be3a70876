"""The prepare stage's map side: each map worker validates its tasks' keys and routes them to partitions."""
