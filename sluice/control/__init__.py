"""The control plane: from an uploaded manifest to one announced outcome, driven by events.

Each invocation builds one Context (context: settings, clients, ledger, records, publisher) and,
for a run being started, one RunRequest. The manifest Lambda (coordinator) claims the run, routes
it (route: planned in the Lambda, or by the prepare stage) and submits it (submit) or starts the
prepare stage (prepared, whose submit step also ends in submit). The completion Lambda
(completion) records every Batch job state change (records: SHARD / JOB / COUNT items; verdict:
pure decisions) and decides: the prepare stage's end (prepared), or the outcome once (conclude),
or a retry pass (retry); reconcile sweeps runs whose events were lost. The ledger holds RUN items
and their outbox (outbox publishes it, notify is the EventBridge adapter); batch, batch_events
and policy are the AWS Batch boundary; ddb the DynamoDB plumbing; lineage the incremental run's
earlier runs. Nothing here imports torch or pyarrow at module level.
"""
