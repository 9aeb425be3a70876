"""Worker settings: frozen pydantic settings read from SLUICE_WORKER_* variables (defaults documented here).

Every field `name` is set by the variable SLUICE_WORKER_<NAME>; an empty variable keeps the
default. Plan values (batch size, output dtype, failed-fraction threshold) apply unless the
matching setting overrides them. docs/worker.md lists the same table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from pydantic import ConfigDict, Field, field_validator

from gpu_worker.errors import ConfigError
from gpu_worker.telemetry.families import keep_list
from sluice.errors import SettingsError
from sluice.settings import EnvSettings

PREFIX = "SLUICE_WORKER_"
# The decompression-bomb limit: Pillow's own default (PIL.Image.MAX_IMAGE_PIXELS), defined here for every decode.
MAX_IMAGE_PIXELS = 89_478_485
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["", "float16", "float32"]


class WorkerSettings(EnvSettings):
    """EnvSettings whose bad values raise the worker's ConfigError (exit code 2), still naming the variable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        try:
            return super().from_values(values)
        except SettingsError as exc:
            raise ConfigError(str(exc)) from None


class WorkerConfig(WorkerSettings):
    """Tunables of one worker node. Sizes are per rank unless they say otherwise."""

    env_prefix: ClassVar[str] = PREFIX

    device: Device = Field("auto", description="auto: one rank per visible GPU, else CPU ranks")
    cpu_ranks: int = Field(1, ge=1, description="ranks on a machine without a GPU (or device=cpu)")
    gpu_ranks: int = Field(0, ge=0, description="0: one rank per visible GPU; N: use the first N")
    loaders: int = Field(
        -1,
        ge=-1,
        description="loader processes per rank (fetch+decode); 0: threads in the rank; "
        "-1: auto (GPU: CPUs/rank - 1, max 8; CPU: 0)",
    )
    fetch_concurrency: int = Field(16, ge=1, description="concurrent GETs per loader")
    decode_threads: int = Field(
        0, ge=0, description="concurrent decodes per loader; 0: (CPUs / ranks) / loader processes (threads: 1)"
    )
    decode: Literal["", "auto", "cpu", "gpu"] = Field(
        "", description="where JPEGs are decoded: auto, cpu or gpu (nvJPEG); empty: the plan's job.decode"
    )
    decode_device: str = Field(
        "", description="set by the rank, not by hand: the device its loaders decode JPEGs on (empty: CPU)"
    )
    max_inflight_bytes: int = Field(
        128 * 2**20, ge=1, description="fetched-but-undecoded bytes per loader before fetching pauses"
    )
    max_object_bytes: int = Field(64 * 2**20, ge=1, description="larger objects fail as too_large")
    max_image_pixels: int = Field(
        MAX_IMAGE_PIXELS, ge=1, description="more pixels fail as bomb (Pillow's own default limit)"
    )
    batch_size: int = Field(0, ge=0, description="0: the plan's model.batch_size")
    buffers_per_loader: int = Field(2, ge=1, description="batch buffers each loader may fill ahead")
    prefetch_mib: int = Field(
        256,
        ge=0,
        description="decoded-batch memory per rank its loaders may fill ahead (more buffers than "
        "buffers_per_loader when they fit): batches wait there while the models load",
    )
    chunk_keys: int = Field(2048, ge=1, description="keys per committed Parquet chunk")
    output_dtype: Dtype = Field("", description="float16 or float32; empty: the plan's")
    max_failed_fraction: float = Field(-1.0, le=1, description="exit 1 above this; <0: the plan's")
    s3_max_attempts: int = Field(4, ge=1, description="botocore attempts per GET, first one included")
    s3_retry_mode: Literal["adaptive", "standard", "legacy"] = Field(
        "adaptive", description="botocore retry mode for image GETs"
    )
    retries: int = Field(3, ge=0, description="our immediate retries after botocore gives up")
    backoff_base_s: float = Field(0.2, description="first immediate-retry backoff (full jitter)")
    backoff_max_s: float = Field(5.0, description="cap of one backoff")
    final_retries: int = Field(3, ge=1, description="tries per key in the final retry pass")
    final_backoff_base_s: float = Field(1.0, description="first backoff in the final pass")
    data_endpoint_url: str = Field(
        "", description="S3 endpoint for image GETs only (a cache, a test server); empty: AWS's"
    )
    connect_timeout_s: float = Field(5.0, description="S3 connect timeout")
    read_timeout_s: float = Field(30.0, description="S3 read timeout")
    torch_threads: int = Field(0, ge=0, description="intra-op threads per rank; 0: CPUs / ranks (at most 4 on GPU)")
    autocast: bool = Field(True, description="bf16 autocast on GPU")
    jit: bool = Field(True, description="trace+freeze eager (builtin) models on CPU")
    loader_nice: int = Field(0, ge=0, description="niceness added to loader processes")
    work_dir: str = Field("", description="scratch dir (model downloads, rank state); empty: tmp")
    log_level: str = Field("INFO", description="logging level")
    metrics_port: int = Field(9400, description="/metrics port of local rank 0 (rank r serves port + r); 0: off")
    push_interval_s: float = Field(30.0, description="remote-write push interval (SLUICE_REMOTE_WRITE_URL)")
    beat_interval_s: float = Field(
        30.0, gt=0, description="progress beats: checked this often, written only when the count moved"
    )
    push_metrics: str = Field(
        "", description="metric families pushed to AMP, comma list; empty: the critical ones; all"
    )

    @field_validator("push_metrics")
    @classmethod
    def _known_metrics(cls, v: str) -> str:
        keep_list(v)  # raises ValueError naming an unknown metric and the valid ones
        return v

    def replace(self, **changes: Any) -> WorkerConfig:
        """A copy with `changes`, validated like the environment (ConfigError names the variable)."""
        return type(self).from_values(self.model_copy(update=changes).model_dump())


def settings_table() -> str:
    """Markdown table of every setting, its default and meaning (docs/worker.md embeds it)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in WorkerConfig.model_fields.items():
        rows.append(f"| `{WorkerConfig.variable(name)}` | `{info.default!r}` | {info.description or ''} |")
    return "\n".join(rows)
