"""Settings read from SLUICE_* environment variables, with documented defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, Self, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluice.errors import SettingsError

MAX_INFLATED_BYTES = 4 * 2**30  # one decompressed inventory data file: what a key-list object may be
MAX_INFLATE_RATIO = 100  # S3 Inventory CSV gzips 5-30x; a bomb (zeros, one repeated row) gzips ~1000x


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


class EnvSettings(BaseModel):
    """Frozen settings read from <env_prefix><FIELD> variables; an empty variable keeps the default.

    The one way Sluice reads its environment: the Lambdas' Settings and the worker's
    WorkerConfig both derive from it, so both parse, validate and report a bad value alike.
    """

    model_config = ConfigDict(frozen=True)
    env_prefix: ClassVar[str] = "SLUICE_"

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable that sets field `name`."""
        return f"{cls.env_prefix}{name.upper()}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Build from the environment; a bad value raises SettingsError naming the variable."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            raw = env.get(cls.variable(name), "").strip()
            if raw:
                values[name] = _split(raw) if get_origin(info.annotation) is tuple else raw
        return cls.from_values(values)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """Validate field values (raw strings or typed); a bad one raises SettingsError naming its variable."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else ""
                var = cls.variable(field) if field in cls.model_fields else field or "settings"
                shown = f"={values[field]!r}" if field in values else ""
                problems.append(f"{var}{shown}: {err['msg'].removeprefix('Value error, ')}")
            raise SettingsError("; ".join(problems)) from None

    def to_env(self) -> dict[str, str]:
        """The variables that recreate these settings in a child process."""
        out = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if v is None:
                continue
            text = ("1" if v else "0") if isinstance(v, bool) else ",".join(v) if isinstance(v, tuple) else str(v)
            out[self.variable(name)] = text
        return out


class Settings(EnvSettings):
    """Coordinator settings; the template sets each one as a function environment variable."""

    control_bucket: str | None = Field(None, description="SLUICE_CONTROL_BUCKET; default: the event's bucket.")
    runs_table: str = Field("sluice-runs", description="SLUICE_RUNS_TABLE: the run ledger table.")
    beats_table: str = Field("sluice-beats", description="SLUICE_BEATS_TABLE: the workers' progress beats.")
    runnable_after_s: int = Field(
        1800, ge=0, description="SLUICE_RUNNABLE_AFTER_S: jobs RUNNABLE this long are reported (Run Waiting)."
    )
    event_bus: str = Field("sluice", description="SLUICE_EVENT_BUS: where run events are published.")
    job_queue: str = Field("sluice-gpu", description="SLUICE_JOB_QUEUE: queue for array jobs.")
    mnp_job_queue: str = Field("sluice-gpu-mnp", description="SLUICE_MNP_JOB_QUEUE: On-Demand queue for MNP.")
    array_job_definition: str = Field("sluice-worker", description="SLUICE_ARRAY_JOB_DEFINITION.")
    mnp_job_definition: str = Field("sluice-worker-mnp", description="SLUICE_MNP_JOB_DEFINITION.")
    allowed_buckets: tuple[str, ...] = Field(
        (), description="SLUICE_ALLOWED_BUCKETS (comma list); empty allows any bucket."
    )
    default_input_bucket: str | None = Field(
        None, description="SLUICE_DEFAULT_INPUT_BUCKET: bucket for bare keys in plain key lists."
    )
    default_model_uri: str | None = Field(
        None,
        description="SLUICE_DEFAULT_MODEL_URI: the model (s3:// export or builtin:NAME) of a key list or manifest "
        "that names none; unset, the deployed stack refuses them, naming model.uri.",
    )
    max_manifest_bytes: int = Field(16 * 2**20, description="SLUICE_MAX_MANIFEST_BYTES: JSON manifest limit.")
    max_keylist_bytes: int = Field(
        4 * 2**30, description="SLUICE_MAX_KEYLIST_BYTES: key-list object limit (and each inventory data file's)."
    )
    max_inflated_bytes: int = Field(
        MAX_INFLATED_BYTES, ge=1, description="SLUICE_MAX_INFLATED_BYTES: one inventory data file, decompressed."
    )
    max_inflate_ratio: int = Field(
        MAX_INFLATE_RATIO,
        ge=1,
        description="SLUICE_MAX_INFLATE_RATIO: decompressed bytes per compressed byte an inventory data file may reach "
        "(plus 1 MiB); more is a compression bomb.",
    )
    allowed_output_buckets: tuple[str, ...] = Field(
        (),
        description="SLUICE_ALLOWED_OUTPUT_BUCKETS (comma list): buckets besides the control bucket that output.prefix "
        "may name (the worker role must be allowed to write there: docs/deploy.md).",
    )
    local_mode: bool = Field(
        False,
        description="SLUICE_LOCAL_MODE: the workers run on this machine (sluice local run), so model.uri may be a "
        "local path.",
    )
    # One default with template.yaml's (a test checks): the prepare stage's design goal.
    max_keys: int = Field(1_000_000_000, description="SLUICE_MAX_KEYS: unique keys per run.")
    max_array_size: int = Field(10_000, ge=2, le=10_000, description="SLUICE_MAX_ARRAY_SIZE: children per array job.")
    spill_dir: str | None = Field(None, description="SLUICE_SPILL_DIR: temp files (Lambda: /tmp).")
    # Measured (bench/lambda_sizing.py): the in-Lambda path costs 2.75 CPU-s, 27 MiB of RSS and
    # 7.3 MB of /tmp per million keys, so 5M keys stay near 14 s, 135 MiB and 37 MB: well inside
    # the function's 900 s, memory and /tmp. Bigger inputs go to the prepare job.
    prepare_over_keys: int = Field(
        5_000_000, ge=0, description="SLUICE_PREPARE_OVER_KEYS: inputs estimated above this go to the prepare job."
    )
    prefix_sample_pages: int = Field(
        50,
        ge=1,
        description="SLUICE_PREFIX_SAMPLE_PAGES: ListObjectsV2 pages the Lambda lists itself; longer prefixes are "
        "prepared.",
    )
    prepare_workers: int | None = Field(
        None, ge=1, description="SLUICE_PREPARE_WORKERS: force the prepare path with this many workers (local runs)."
    )
    prepare_job_queue: str = Field("sluice-prepare", description="SLUICE_PREPARE_JOB_QUEUE: the CPU queue.")
    prepare_job_definition: str = Field("sluice-prepare", description="SLUICE_PREPARE_JOB_DEFINITION.")
    manifest_function: str = Field(
        "",
        description="SLUICE_MANIFEST_FUNCTION: the function the sweep re-invokes for an upload stranded in planning.",
    )
    index_job_definition: str = Field(
        "sluice-index", description="SLUICE_INDEX_JOB_DEFINITION: the index stage's CPU job (on the prepare queue)."
    )
    index_train_job_definition: str = Field(
        "sluice-index-train", description="SLUICE_INDEX_TRAIN_JOB_DEFINITION: the fleet index build's train stage."
    )
    index_segment_job_definition: str = Field(
        "sluice-index-segment",
        description="SLUICE_INDEX_SEGMENT_JOB_DEFINITION: the fleet index build's segment children (an array job).",
    )
    index_commit_job_definition: str = Field(
        "sluice-index-commit", description="SLUICE_INDEX_COMMIT_JOB_DEFINITION: the fleet index build's commit stage."
    )
    # One job indexes below this; at or above it train, segment children and commit run on the
    # fleet (docs/architecture.md "Index stage"). The default is near where the plan's estimates
    # cross (1.73M rows by sluice.control.policy's measured rates; tests/unit/test_policy.py).
    index_fleet_rows: int = Field(
        2_000_000,
        ge=1,
        description="SLUICE_INDEX_FLEET_ROWS: rows (keys x models x rows a key) at or above which the index is "
        "built by the fleet's stages instead of one job.",
    )
    index_rows_per_child: int = Field(
        10_000_000,
        ge=1,
        description="SLUICE_INDEX_ROWS_PER_CHILD: rows a segment child indexes (its memory and time are bounded by "
        "this, not by the run); children = ceil(rows / this), 2 to 10,000.",
    )
    # Tests and operators: one fixed timeout for every index job instead of the one derived from the
    # rows, applied once at the claim (sluice.control.indexing.stage.claim), as SLUICE_STALL_AFTER_S is the worker's.
    index_timeout_s: int | None = Field(
        None,
        ge=1,
        description="SLUICE_INDEX_TIMEOUT_S: every index job's timeout (each fleet stage's) in place of the one "
        "derived from the rows, fixed when the stage is claimed; AWS Batch refuses less than 60 s (its minimum "
        "attemptDurationSeconds), local runs take any.",
    )
    # The tail (sluice.control.sweep.tail): defaults from bench/tail.py (docs/performance.md "The tail").
    split_after: float = Field(
        2.0,
        ge=0,
        description="SLUICE_SPLIT_AFTER: a moving rank whose expected shard time passes this multiple of the run's "
        "median has its remaining keys split off to a new shard; 0 turns splitting off.",
    )
    split_min_keys: int = Field(
        32, ge=1, description="SLUICE_SPLIT_MIN_KEYS: the fewest keys a split hands to its child (and leaves)."
    )
    # A cap, not a target: the children's own seconds, start-up included, against every rank's
    # expected seconds. With a few shards a child's start-up alone is a large share (bench/tail.py's
    # 4 shards: a child of ~8 s against ~80 s); at thousands of shards the cap is never near.
    split_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="SLUICE_SPLIT_SHARE: at most this share of the run's expected GPU time goes to split children.",
    )
    split_from: float = Field(
        0.5,
        ge=0,
        le=1,
        description="SLUICE_SPLIT_FROM: splitting starts once every shard has started or this fraction is done.",
    )
    split_startup_s: float = Field(
        120.0,
        ge=0,
        description="SLUICE_SPLIT_STARTUP_S: a split child's wait for its instance, added to the run's measured "
        "container start and model load when the split point is chosen.",
    )
    split_per_sweep: int = Field(
        100,
        ge=1,
        description="SLUICE_SPLIT_PER_SWEEP: the most splits one sweep makes (Spark's speculation, with no such "
        "bound, jammed its scheduler at 100,000 tasks: SPARK-26755).",
    )
    # The deployed capacity the preflight checks runs against (sluice.preflight; template.yaml
    # parameters of the same names), and the GPU family GPU-hours are priced on.
    max_vcpus: int = Field(256, ge=1, description="SLUICE_MAX_VCPUS: MaxVcpus of each GPU compute environment.")
    mnp_max_vcpus: int = Field(64, ge=1, description="SLUICE_MNP_MAX_VCPUS: MaxVcpus of the MNP environment.")
    worker_vcpus: int = Field(4, ge=1, description="SLUICE_WORKER_VCPUS: vCPUs of a worker container.")
    worker_gpus: int = Field(1, ge=1, description="SLUICE_WORKER_GPUS: GPUs of a worker container (one rank each).")
    gpu_instance_types: str = Field(
        "g6e,g6,g5", description="SLUICE_GPU_INSTANCE_TYPES: the GPU families (first priced)."
    )
    images_per_gpu_s: float | None = Field(
        None,
        gt=0,
        description="SLUICE_IMAGES_PER_GPU_S: measured images/s per GPU (gpu_worker.autotune) for estimates.",
    )
