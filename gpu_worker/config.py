"""Worker settings: a frozen dataclass read from SLUICE_WORKER_* variables (defaults documented here).

Every field `name` is set by the variable SLUICE_WORKER_<NAME>; an empty variable keeps the
default. Plan values (batch size, output dtype, failed-fraction threshold) apply unless the
matching setting overrides them. docs/worker.md lists the same table.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints

from gpu_worker.errors import ConfigError

PREFIX = "SLUICE_WORKER_"
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["", "float16", "float32"]


@dataclass(frozen=True)
class WorkerConfig:
    """Tunables of one worker node. Sizes are per rank unless they say otherwise."""

    device: Device = field(default="auto", metadata={"doc": "auto: one rank per visible GPU, else CPU ranks"})
    cpu_ranks: int = field(default=1, metadata={"doc": "ranks on a machine without a GPU (or device=cpu)"})
    gpu_ranks: int = field(default=0, metadata={"doc": "0: one rank per visible GPU; N: use the first N"})
    loaders: int = field(
        default=-1,
        metadata={
            "doc": "loader processes per rank (fetch+decode); 0: threads in the rank; "
            "-1: auto (GPU: CPUs/rank - 1, max 8; CPU: 0)"
        },
    )
    fetch_concurrency: int = field(default=16, metadata={"doc": "concurrent GETs per loader"})
    decode_threads: int = field(
        default=0, metadata={"doc": "concurrent decodes per loader; 0: (CPUs / ranks) / loader processes (threads: 1)"}
    )
    max_inflight_bytes: int = field(
        default=128 * 2**20, metadata={"doc": "fetched-but-undecoded bytes per loader before fetching pauses"}
    )
    max_object_bytes: int = field(default=64 * 2**20, metadata={"doc": "larger objects fail as too_large"})
    max_image_pixels: int = field(
        default=89_478_485, metadata={"doc": "more pixels fail as bomb (Pillow's own default limit)"}
    )
    batch_size: int = field(default=0, metadata={"doc": "0: the plan's model.batch_size"})
    buffers_per_loader: int = field(default=2, metadata={"doc": "batch buffers each loader may fill ahead"})
    chunk_keys: int = field(default=2048, metadata={"doc": "keys per committed Parquet chunk"})
    output_dtype: Dtype = field(default="", metadata={"doc": "float16 or float32; empty: the plan's"})
    max_failed_fraction: float = field(default=-1.0, metadata={"doc": "exit 1 above this; <0: the plan's"})
    s3_max_attempts: int = field(default=4, metadata={"doc": "botocore attempts per GET, first one included"})
    s3_retry_mode: Literal["adaptive", "standard", "legacy"] = field(
        default="adaptive", metadata={"doc": "botocore retry mode for image GETs"}
    )
    retries: int = field(default=3, metadata={"doc": "our immediate retries after botocore gives up"})
    backoff_base_s: float = field(default=0.2, metadata={"doc": "first immediate-retry backoff (full jitter)"})
    backoff_max_s: float = field(default=5.0, metadata={"doc": "cap of one backoff"})
    final_retries: int = field(default=3, metadata={"doc": "tries per key in the final retry pass"})
    final_backoff_base_s: float = field(default=1.0, metadata={"doc": "first backoff in the final pass"})
    data_endpoint_url: str = field(
        default="", metadata={"doc": "S3 endpoint for image GETs only (a cache, a test server); empty: AWS's"}
    )
    connect_timeout_s: float = field(default=5.0, metadata={"doc": "S3 connect timeout"})
    read_timeout_s: float = field(default=30.0, metadata={"doc": "S3 read timeout"})
    torch_threads: int = field(
        default=0, metadata={"doc": "intra-op threads per rank; 0: CPUs / ranks (at most 4 on GPU)"}
    )
    autocast: bool = field(default=True, metadata={"doc": "bf16 autocast on GPU"})
    jit: bool = field(default=True, metadata={"doc": "trace+freeze eager (builtin) models on CPU"})
    loader_nice: int = field(default=0, metadata={"doc": "niceness added to loader processes"})
    work_dir: str = field(default="", metadata={"doc": "scratch dir (model downloads, rank state); empty: tmp"})
    log_level: str = field(default="INFO", metadata={"doc": "logging level"})
    metrics_port: int = field(
        default=9400, metadata={"doc": "/metrics port of local rank 0 (rank r serves port + r); 0: off"}
    )
    push_interval_s: float = field(
        default=30.0, metadata={"doc": "remote-write push interval (SLUICE_REMOTE_WRITE_URL)"}
    )
    push_metrics: str = field(
        default="", metadata={"doc": "metric families pushed to AMP, comma list; empty: the critical ones; all"}
    )

    def __post_init__(self) -> None:
        positive = (
            "cpu_ranks",
            "fetch_concurrency",
            "max_inflight_bytes",
            "max_object_bytes",
            "max_image_pixels",
            "buffers_per_loader",
            "chunk_keys",
            "s3_max_attempts",
            "final_retries",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{PREFIX}{name.upper()} must be >= 1, not {getattr(self, name)}")
        for name in ("gpu_ranks", "decode_threads", "batch_size", "retries", "torch_threads", "loader_nice"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be >= 0, not {getattr(self, name)}")
        if self.loaders < -1:
            raise ConfigError(f"{PREFIX}LOADERS must be -1 (auto), 0 (threads) or a count, not {self.loaders}")
        if self.max_failed_fraction > 1:
            raise ConfigError(f"{PREFIX}MAX_FAILED_FRACTION must be <= 1, not {self.max_failed_fraction}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        """Read SLUICE_WORKER_<FIELD> variables; a bad value raises ConfigError naming the variable."""
        env = os.environ if env is None else env
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = PREFIX + f.name.upper()
            raw = env.get(var, "").strip()
            if raw:
                values[f.name] = _parse(var, raw, hints[f.name])
        return cls(**values)

    def replace(self, **changes: Any) -> WorkerConfig:
        return dataclasses.replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The SLUICE_WORKER_* variables that recreate this config in a child process."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[PREFIX + f.name.upper()] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out


def _parse(var: str, raw: str, typ: Any) -> Any:
    choices = get_args(typ)
    if choices:
        if raw not in choices:
            raise ConfigError(f"{var}={raw!r}: expected one of {', '.join(c for c in choices if c)}")
        return raw
    try:
        if typ is bool:
            if raw.lower() not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return raw.lower() in {"1", "true", "yes", "on"}
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {typ.__name__}") from None
    return raw


def settings_table() -> str:
    """Markdown table of every setting, its default and meaning (docs/worker.md embeds it)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(WorkerConfig):
        rows.append(f"| `{PREFIX}{f.name.upper()}` | `{f.default!r}` | {f.metadata.get('doc', '')} |")
    return "\n".join(rows)
