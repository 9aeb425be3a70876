"""Settings read from SLUICE_* environment variables, with documented defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


class Settings(BaseModel):
    """Coordinator settings; the template sets each one as a function environment variable."""

    model_config = ConfigDict(frozen=True)

    control_bucket: str | None = Field(None, description="SLUICE_CONTROL_BUCKET; default: the event's bucket.")
    runs_table: str = Field("sluice-runs", description="SLUICE_RUNS_TABLE: the run ledger table.")
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
    max_manifest_bytes: int = Field(16 * 2**20, description="SLUICE_MAX_MANIFEST_BYTES: JSON manifest limit.")
    max_keylist_bytes: int = Field(4 * 2**30, description="SLUICE_MAX_KEYLIST_BYTES: key-list object limit.")
    max_keys: int = Field(100_000_000, description="SLUICE_MAX_KEYS: unique keys per run.")
    max_array_size: int = Field(10_000, ge=2, le=10_000, description="SLUICE_MAX_ARRAY_SIZE: children per array job.")
    spill_dir: str | None = Field(None, description="SLUICE_SPILL_DIR: temp files (Lambda: /tmp).")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from SLUICE_<FIELD> variables."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(f"SLUICE_{name.upper()}")
            if raw is None or raw == "":
                continue
            values[name] = _split(raw) if name == "allowed_buckets" else raw
        return cls.model_validate(values)
