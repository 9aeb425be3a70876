"""Published limits a run meets, each with its source. Defaults only: an account may have raised some."""

from __future__ import annotations

# AWS Batch service quotas (docs.aws.amazon.com/batch/latest/userguide/service_limits.html;
# these cannot be changed).
BATCH_ARRAY_SIZE = 10_000  # "Maximum array size for array jobs"
BATCH_SUBMITTED_JOBS = 1_000_000  # "Maximum number of jobs in SUBMITTED state" (array children count)
BATCH_SUBMITJOB_TPS = 50  # "Maximum number of transactions per second (TPS) for each account for SubmitJob"
BATCH_MNP_NODES = 1_000  # numNodes of a multi-node parallel job (Batch API reference, NodeProperties)
BATCH_MAX_TIMEOUT_S = 14 * 86_400  # attemptDurationSeconds tops out at 14 days (JobTimeout)

# Amazon S3 (docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html):
# "at least 5,500 GET/HEAD requests per second per partitioned Amazon S3 prefix"; S3 adds
# partitions as a prefix's load grows, answering 503 SlowDown meanwhile.
S3_GET_PER_PREFIX_S = 5_500

# Amazon Managed Service for Prometheus (docs.aws.amazon.com/prometheus/latest/userguide/AMP_quotas.html),
# per workspace, adjustable: "Active series per workspace: 10,000,000". The ingestion rate is the
# figure docs/metrics.md compares against; check the account's Service Quotas for both.
AMP_ACTIVE_SERIES = 10_000_000
AMP_INGEST_SAMPLES_S = 70_000

# AWS Lambda (docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html): 900 s at most.
# The manifest function's memory and /tmp are template.yaml's (HandleManifestUploadFunction).
LAMBDA_TIMEOUT_S = 900
MANIFEST_FN_MEMORY_MB = 3_072
MANIFEST_FN_TMP_MB = 1_024
# Measured in-Lambda planning cost (docs/deploy.md, "Sizing the manifest function"):
# ~160 MB + 27 MB per million keys, ~2.4 CPU-s and ~7.3 MB of /tmp per million keys.
PLAN_BASE_MB, PLAN_MB_PER_M, PLAN_S_PER_M, PLAN_TMP_MB_PER_M = 160, 27, 2.4, 7.3

# Amazon EventBridge PutEvents (docs.aws.amazon.com/eventbridge/latest/userguide/eb-quota.html):
# 10,000 requests/s in the largest Regions, as low as 400/s in others.
EVENTBRIDGE_PUTEVENTS_S = 400
# Amazon DynamoDB (docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html):
# 1,000 write units per second per partition; the run's items share one partition key.
DDB_PARTITION_WCU_S = 1_000
