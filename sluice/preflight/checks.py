"""The preflight's checks: each planned figure against the limit it meets, with advice."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from sluice.preflight import limits as L
from sluice.preflight.estimate import cost
from sluice.preflight.facts import Capacity, RunFacts, audio_decode
from sluice.preflight.instances import more_cpu_per_gpu

Status = Literal["ok", "warn", "error"]
SERIES_PER_RANK = 13  # a GPU rank's default push list (bench/metrics_cost.py, "typical" row)
TIMEOUT_MARGIN = 2.0  # derived job timeout: twice the estimated shard time ...
TIMEOUT_SLACK_S = 900  # ... plus start-up (image pull, model load)
TIMEOUT_FLOOR_S = 6 * 3600  # and never below Batch's usual 6 h
STALL_LOAD_S = 600  # a rank's progress may not move while its models download and load ...
STALL_BATCHES = 10  # ... nor for a few batch times after (a slow batch is not a stall)
LOAD_GRACE_BASE_S = 30  # before a rank's first beat: container start, imports, plan read ...
LOAD_GRACE_PER_MODEL_S = 300  # ... and each model's download and load
# What a child pays before its first image: placement, container start, model load. An assumption
# for a warm compute environment (not measured here: no GPU); a cold image pull adds minutes.
CHILD_STARTUP_S = 60
STARTUP_TARGET = 0.10  # the planner sizes shards so start-up stays under this share of a child's time
STARTUP_SHARE = 0.25  # start-up over this share of a child's time is a warning ...
STARTUP_WARN_GPU_S = 3600  # ... when the run's children spend at least a GPU-hour starting
WARN_AT = 0.8  # a figure past 80% of its limit is a warning


@dataclass(frozen=True)
class Check:
    """One planned figure against its limit."""

    name: str
    value: float
    limit: float
    status: Status
    advice: str = ""
    unit: str = ""


@dataclass(frozen=True)
class Limit:
    """A limit a planned figure meets, and what to do past it."""

    name: str
    limit: float
    unit: str
    over: Status  # the status past the limit: error (the run would fail) or warn
    advice: str
    near: bool = True  # warn from WARN_AT of the limit on (False: only past it matters)

    def judge(self, value: float) -> Check:
        """ok under WARN_AT of the limit, a warning up to it (unless not `near`), `over` past it."""
        if value > self.limit:
            return Check(self.name, value, self.limit, self.over, self.advice, self.unit)
        if self.near and value > WARN_AT * self.limit:
            return Check(self.name, value, self.limit, "warn", f"close to the limit: {self.advice}", self.unit)
        return Check(self.name, value, self.limit, "ok", "", self.unit)


def shard_seconds(keys_per_shard: int, gpus: int, rate: float) -> float:
    """Estimated GPU time of one shard on a worker with `gpus` GPUs."""
    return keys_per_shard / (rate * max(1, gpus))


def startup_share(shard_s: float) -> float:
    """Start-up's share of a child's time: CHILD_STARTUP_S over start-up plus its GPU work."""
    return CHILD_STARTUP_S / (CHILD_STARTUP_S + shard_s)


def work_for_share(share: float) -> float:
    """Seconds of GPU work a child needs so that start-up is `share` of its time."""
    return CHILD_STARTUP_S * (1 - share) / share


def startup_gpu_hours(workers: int, gpus_per_worker: int) -> float:
    """GPU-hours the run's workers (array children or MNP nodes) hold their GPUs while starting."""
    return workers * max(1, gpus_per_worker) * CHILD_STARTUP_S / 3600


def derived_timeout_s(keys_per_shard: int, gpus: int, rate: float) -> int:
    """A job timeout for shards of this size: TIMEOUT_MARGIN x the estimate + TIMEOUT_SLACK_S.

    At least TIMEOUT_FLOOR_S (a timeout guards against a hung job; one too short kills good
    work) and at most Batch's 14 days.
    """
    est = shard_seconds(keys_per_shard, gpus, rate) * TIMEOUT_MARGIN + TIMEOUT_SLACK_S
    return int(min(L.BATCH_MAX_TIMEOUT_S, max(TIMEOUT_FLOOR_S, math.ceil(est / 60) * 60)))


def derived_stall_after_s(batch_size: int, rate: float, timeout_s: int) -> int:
    """No progress this long ends an attempt: model load plus STALL_BATCHES batch times, well under the timeout.

    `rate` is images/s of one GPU (one rank); at most a quarter of the job timeout.
    """
    est = STALL_LOAD_S + STALL_BATCHES * batch_size / max(rate, 1e-9)
    return int(max(60, min(timeout_s // 4, math.ceil(est / 60) * 60)))


def derived_load_grace_s(models: int, timeout_s: int) -> int:
    """How long an attempt may go without its first beat (and load its models): bounded, at most timeout/4."""
    return int(max(60, min(timeout_s // 4, LOAD_GRACE_BASE_S + LOAD_GRACE_PER_MODEL_S * max(1, models))))


@dataclass
class Preflight:
    """Every check, and the run's estimated cost."""

    checks: list[Check] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.status == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    def lines(self, status: Status) -> list[str]:
        """One line per check of this status: name, value and limit, advice."""
        return [
            f"{c.name}: {c.value:,.6g} {c.unit} (limit {c.limit:,.6g}): {c.advice}"
            for c in self.checks
            if c.status == status
        ]

    def as_dict(self) -> dict[str, Any]:
        return {"checks": [asdict(c) for c in self.checks], "cost": self.cost}


def preflight(run: RunFacts, cap: Capacity) -> Preflight:
    """Check `run` against Batch, S3, AMP, Lambda, DynamoDB and EventBridge limits on `cap`."""
    # several models in one pass: each image costs all of them; every figure from the run's GPUs a worker
    cap = replace(cap, models=run.models, worker_gpus=run.gpus_per_worker)
    out = Preflight()
    add = out.checks.append
    _batch(run, add)
    if run.gpus_asked is not None:
        add(gpus_check(run))
    workers = _workers(run, cap, add)
    shard_s = _fleet(run, cap, workers, add)
    _lambda(run, add)
    _completion(run, workers, shard_s, add)
    add(Check("decode", *audio_decode(cap)) if cap.audio_windows else decode_check(cap))  # audio: always the CPU
    starting = startup_gpu_hours(run.n_shards, run.gpus_per_worker)
    out.cost = cost(cap.gpu_family, run.unique_keys / cap.rate / 3600, starting, run.n_shards).as_dict()
    return out


def _batch(run: RunFacts, add: Any) -> None:
    """AWS Batch's fixed quotas: array size, jobs in SUBMITTED, SubmitJob rate."""
    biggest = max((n for kind, n in run.jobs if kind == "array"), default=0)
    add(
        Limit(
            "array size",
            L.BATCH_ARRAY_SIZE,
            "children",
            "error",
            "Batch takes at most 10,000 children per array job: Sluice splits bigger runs into several jobs",
            near=False,  # at the limit is fine: Sluice's own layout never goes past it
        ).judge(biggest)
    )
    add(
        Limit(
            "jobs in SUBMITTED",
            L.BATCH_SUBMITTED_JOBS,
            "jobs",
            "error",
            f"raise job.keys_per_shard above {run.keys_per_shard:,} so the run has fewer children",
        ).judge(run.n_shards + len(run.jobs))
    )
    add(
        Limit(
            "SubmitJob calls",
            L.BATCH_SUBMITJOB_TPS * 60,
            "calls (50/s for a minute)",
            "warn",
            "each Batch job is one SubmitJob call (50/s per account): raise job.keys_per_shard",
        ).judge(len(run.jobs))
    )


def _startup(run: RunFacts, shard_s: float, add: Any) -> None:
    """Each array child's start-up against its GPU work: worth a warning when it adds up."""
    if not shard_s or run.mode != "array":
        return
    share = round(startup_share(shard_s), 2)
    # Worth a warning when it adds up: at least a GPU-hour of start-up over the run.
    costly = share > STARTUP_SHARE and run.n_shards * CHILD_STARTUP_S >= STARTUP_WARN_GPU_S
    more = math.ceil(run.keys_per_shard * work_for_share(STARTUP_TARGET) / shard_s)
    advice = (
        f"each of {run.n_shards:,} children spends about {CHILD_STARTUP_S} s starting (placement, container, "
        f"model load; assumed) for {shard_s:,.0f} s of GPU work: raise job.keys_per_shard to about {more:,} "
        f"(start-up {STARTUP_TARGET:.0%}), or leave it out for the planner to size shards"
    )
    add(
        Check(
            "child start-up share",
            share,
            STARTUP_SHARE,
            "warn" if costly else "ok",
            advice if costly else "",
            "of a child's time",
        )
    )


def _fleet(run: RunFacts, cap: Capacity, workers: int, add: Any) -> float:
    """Shard time against the timeout, S3 and AMP at the fleet's pace; returns the shard's seconds."""
    gpus = workers * run.gpus_per_worker
    shard_s = shard_seconds(run.keys_per_shard, run.gpus_per_worker, cap.rate)
    keys_hint = int(run.keys_per_shard * run.timeout_s / (shard_s * TIMEOUT_MARGIN)) if shard_s else 0
    add(
        Limit(
            "shard time",
            run.timeout_s,
            "s",
            "error",
            f"a timed-out attempt is not retried: lower job.keys_per_shard to about {max(1, keys_hint):,}"
            f" or set job.timeout_s to at least {derived_timeout_s(run.keys_per_shard, run.gpus_per_worker, cap.rate)}",
        ).judge(round(shard_s))
    )
    _startup(run, shard_s, add)
    add(
        Limit(
            "S3 GET/s",
            L.S3_GET_PER_PREFIX_S,
            "GET/s (one prefix assumed)",
            "warn",
            "S3 serves 5,500 GET/s per partitioned prefix and answers 503 SlowDown while it adds "
            "partitions (the workers retry): spread keys over several prefixes or ask AWS to pre-partition",
        ).judge(round(gpus * cap.rate))
    )
    series = gpus * SERIES_PER_RANK
    add(
        Limit(
            "AMP active series",
            L.AMP_ACTIVE_SERIES,
            "series",
            "warn",
            "raise the workspace's active-series quota or push fewer metrics (SLUICE_WORKER_PUSH_METRICS)",
        ).judge(series)
    )
    add(
        Limit(
            "AMP samples/s",
            L.AMP_INGEST_SAMPLES_S,
            "samples/s",
            "warn",
            "raise SLUICE_WORKER_PUSH_INTERVAL_S or the workspace's ingestion-rate quota",
        ).judge(round(series / cap.push_interval_s))
    )
    return shard_s


def _workers(run: RunFacts, cap: Capacity, add: Any) -> int:
    """Workers that run at once; adds the vCPU (and node) checks."""
    if run.mode == "multinode":
        nodes = run.n_shards
        add(
            Limit(
                "MNP nodes",
                L.BATCH_MNP_NODES,
                "nodes",
                "error",
                "a multi-node parallel job has at most 1,000 nodes: use mode array",
            ).judge(nodes)
        )
        add(
            Limit(
                "MNP vCPUs",
                cap.mnp_max_vcpus,
                "vCPUs (MnpMaxVcpus)",
                "error",
                "every node of an MNP job must run at once: raise MnpMaxVcpus or lower job.nodes",
            ).judge(round(nodes * cap.node_vcpus))
        )
        return nodes
    fit = max(1, int(cap.max_vcpus // cap.node_vcpus))
    waves = math.ceil(run.n_shards / fit)
    add(
        Limit(
            "vCPUs for all children at once",
            cap.max_vcpus,
            "vCPUs (MaxVcpus)",
            "warn",
            f"at most {fit:,} children run at once, so the run takes about {waves:,} waves: raise "
            "MaxVcpus (and the account's EC2 vCPU quotas) for more parallelism",
            near=False,  # every child fitting at once is the goal, not a risk
        ).judge(round(run.n_shards * cap.node_vcpus))
    )
    return min(run.n_shards, fit)


def gpus_check(run: RunFacts) -> Check:
    """The manifest's job.gpus_per_node against the stack's WorkerGpus: each worker gets the stack's."""
    asked, given = run.gpus_asked or 0, run.gpus_per_worker
    advice = (
        f"job.gpus_per_node is {asked} but each worker container gets the stack's {given} "
        f"(WorkerGpus; one rank a GPU): set job.gpus_per_node to {given}, or deploy with WorkerGpus={asked}"
    )
    ok = asked == given
    return Check("GPUs per node", asked, given, "ok" if ok else "error", "" if ok else advice, "GPUs (WorkerGpus)")


def _lambda(run: RunFacts, add: Any) -> None:
    """The manifest function plans in-process only what fits it; bigger inputs go to the prepare stage."""
    add(
        Limit(
            "unique keys",
            run.max_keys,
            "keys (SLUICE_MAX_KEYS)",
            "error",
            "split the input into several manifests, or raise SLUICE_MAX_KEYS (the prepare stage's design goal is 1B)",
        ).judge(run.unique_keys)
    )
    if not run.in_lambda:
        return  # the prepare stage's Fargate map/reduce plans it: no Lambda limit applies
    m = run.unique_keys / 1e6
    add(
        Limit(
            "Lambda memory",
            L.MANIFEST_FN_MEMORY_MB,
            "MB",
            "error",
            "lower SLUICE_PREPARE_OVER_KEYS so the prepare stage plans this input",
        ).judge(round(L.PLAN_BASE_MB + L.PLAN_MB_PER_M * m))
    )
    add(
        Limit(
            "Lambda time",
            L.LAMBDA_TIMEOUT_S,
            "s",
            "error",
            "lower SLUICE_PREPARE_OVER_KEYS so the prepare stage plans this input",
        ).judge(round(L.PLAN_S_PER_M * m))
    )
    add(
        Limit(
            "Lambda /tmp",
            L.MANIFEST_FN_TMP_MB,
            "MB",
            "error",
            "lower SLUICE_PREPARE_OVER_KEYS so the prepare stage plans this input",
        ).judge(round(L.PLAN_TMP_MB_PER_M * m))
    )


def _completion(run: RunFacts, workers: int, shard_s: float, add: Any) -> None:
    """Terminal events at the fleet's pace: DynamoDB writes on the run's partition, PutEvents."""
    per_s = workers / max(shard_s, 1.0)  # shards finishing each second at full speed
    # A terminal shard event writes its item and one counter in a transaction (2 WCU an item).
    add(
        Limit(
            "DynamoDB WCU/s (one run)",
            L.DDB_PARTITION_WCU_S,
            "WCU/s",
            "warn",
            "raise job.keys_per_shard: shards finishing faster than this share one partition",
        ).judge(round(per_s * 4, 1))
    )
    # "Run Progress" about every 1% of shards, plus the outcome: a handful a second at most.
    add(
        Limit(
            "PutEvents/s",
            L.EVENTBRIDGE_PUTEVENTS_S,
            "events/s",
            "warn",
            "the Region's PutEvents quota is lower: ask for an increase",
        ).judge(round(per_s / max(1, run.n_shards // 100) + 0.01, 2))
    )


def decode_check(cap: Capacity) -> Check:
    """CPU decode capacity per GPU against the models' images/s per GPU (job.decode decides who decodes)."""
    model, cpu = cap.model_rate, cap.cpu_decode_rate
    unit = "images/s per GPU the models take (limit: what its CPUs decode)"
    feeds = (
        f"{cap.cpu_per_gpu:g} vCPUs a GPU x {cap.decode_per_core_s:g} images/s a core = {cpu:,.0f} images/s "
        f"decoded, for models that take {model:,.0f}"
    )
    if not cap.decode_binds:
        return Check("decode", round(model), round(cpu), "ok", "", unit)
    if cap.decode == "gpu":
        return Check("decode", round(model), round(cpu), "ok", f"job.decode gpu: nvJPEG decodes ({feeds} on CPU)", unit)
    if cap.decode == "auto":
        advice = f"job.decode auto: workers with CUDA decode on the GPU (nvJPEG), as CPU decode would bind: {feeds}"
        return Check("decode", round(model), round(cpu), "ok", advice, unit)
    size = more_cpu_per_gpu(cap.gpu_family, model / cap.decode_per_core_s, cap.table)
    bigger = f", or a size with more vCPUs per GPU ({size})" if size else ""
    advice = (
        f"CPU decode binds: {feeds}, so the GPU idles {1 - cpu / model:.0%} of the time and the estimates "
        f"use {cpu:,.0f} images/s: set job.decode gpu (sluice plan --decode gpu){bigger}"
    )
    return Check("decode", round(model), round(cpu), "warn", advice, unit)
