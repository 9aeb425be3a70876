"""The control plane: from an uploaded manifest to one announced outcome, driven by events.

The manifest Lambda (coordinator) claims the run, routes it (in-Lambda plan, or the prepare
stage: staging), and submits. The completion Lambda (completion) records every Batch job state
change (records: SHARD / JOB / COUNT items; verdict: pure decisions), concludes the run once, or
starts a retry pass; reconcile sweeps runs whose events were lost. The ledger holds RUN items
and their outbox (outbox publishes it, notify is the EventBridge adapter); batch, batch_events
and policy are the AWS Batch boundary; ddb the DynamoDB plumbing; lineage the incremental
run's earlier runs. Nothing here imports torch or pyarrow at module level.
"""
