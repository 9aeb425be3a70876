"""The base of every document Sluice writes between processes: unknown fields are an error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Written(BaseModel):
    """A document Sluice writes: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")
