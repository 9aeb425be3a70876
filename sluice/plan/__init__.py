"""The in-Lambda planner: keys -> unique keys (dedup) -> a layout of shards and jobs -> plan.json.

dedup (128-bit digests in partitions: a duplicate bitmap), scan (pass 1: validate, digest,
spill; pass 2: write the shards), layout (shards per job, array or multinode, and the RunPlan).
The prepare stage (sluice.prepare) does the same at scale with the same shard format; every
run's plan, wherever its shards came from, is built and written by layout (build_plan, write_plan).
"""
