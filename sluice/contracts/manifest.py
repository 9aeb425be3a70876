"""The run manifest a user uploads (docs/manifest.md): its job, output and index sections, and the whole."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    field_validator,
    model_validator,
)

from sluice import paths
from sluice.contracts.sections import (
    BUILTIN_KINDS,
    MANIFEST_VERSION,
    MAX_MNP_NODES,
    MAX_MODELS,
    InputSpec,
    ManifestPart,
    ModelSpec,
    Strict,
    builtin_kinds,
    json_type,
    s3_uri_field,
)

Decode = Literal["auto", "cpu", "gpu"]


class JobSpec(ManifestPart):
    """How the run is laid out on AWS Batch."""

    mode: Literal["array", "multinode"] = "array"
    nodes: Annotated[int, Field(ge=1, le=MAX_MNP_NODES)] = 2
    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = 1
    keys_per_shard: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=10_000,
        description="Keys an array child embeds at most. Left out: chosen by the planner so each child's start-up "
        "stays under 10% of its time (sluice.plan.layout.shard_size); the default below is then unused.",
    )
    attempts: Annotated[int, Field(ge=1, le=10)] = 3
    timeout_s: Annotated[int, Field(ge=60, le=14 * 24 * 3600)] | None = Field(
        default=None,
        description="Batch attempt timeout (a timed-out attempt is not retried). Default: derived from "
        "keys_per_shard and the images/s estimate, at least 6 h (sluice.preflight.checks.derived_timeout_s).",
    )
    queue: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None, description="Job queue (one of Sluice's); default from settings."
    )
    stall_after_s: Annotated[int, Field(ge=10, le=14 * 24 * 3600)] | None = Field(
        default=None,
        description="A rank whose processed count has not moved this long is stalled: its attempt is ended and "
        "retried. Default: model load plus a few batch times (sluice.preflight.checks.derived_stall_after_s); "
        "SLUICE_STALL_AFTER_S on the worker wins.",
    )
    load_grace_s: Annotated[int, Field(ge=10, le=14 * 24 * 3600)] | None = Field(
        default=None,
        description="How long an attempt may run before its first progress beat (container start, plan read, "
        "model download), and the extra stillness the watchdog allows while models load. Default: "
        "30 s plus 300 s a model, at most a quarter of the timeout (sluice.preflight.checks.derived_load_grace_s).",
    )
    decode: Decode = Field(
        default="auto",
        description="Where workers decode JPEGs: cpu (Pillow), gpu (nvJPEG; CPU when the worker has no CUDA), "
        "auto (gpu when CUDA is there and the preflight says CPU decode would bind). docs/decode.md.",
    )


INDEX_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


VECTOR_BUCKET = r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"  # an S3 vector bucket's name (3-63, lowercase)


class VectorsTarget(Strict):
    """Amazon S3 Vectors, a second target of the index stage: indexes <name>-<model>-<shard> in one vector bucket."""

    bucket: str
    shards: int


class IndexTarget(Strict):
    """Where a run's search index goes (docs/index.md): a folder of one Lance table per model."""

    uri: str  # s3://bucket/prefix/ ending in "/"
    name: str
    s3_vectors: VectorsTarget | None = None  # also upserted into S3 Vectors (output.index.s3_vectors)


class S3VectorsSpec(ManifestPart):
    """`output.index.s3_vectors`: upsert the run's embeddings into Amazon S3 Vectors too (float32, cosine)."""

    bucket: Annotated[str, Field(pattern=VECTOR_BUCKET)] = Field(
        description="The vector bucket (the stack's VectorBucketName: the index stage may write there only)."
    )
    shards: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Vector indexes per model, keys spread by hash: each takes about 2,500 vectors/s of writes.",
    )


class IndexSpec(ManifestPart):
    """`output.index`: the run's search index; on by default (`false` or `"enabled": false` turns it off)."""

    uri: str | None = Field(
        default=None, description="s3:// folder of the index; default s3://<control bucket>/indexes/<name>/."
    )
    name: Annotated[str, Field(pattern=INDEX_NAME)] | None = Field(
        default=None,
        description="The index's name; default: the manifest's name, else its file name without the extension. "
        "An incremental run (input.since_run) without its own index updates the earlier run's.",
    )
    enabled: bool = True
    s3_vectors: S3VectorsSpec | None = Field(default=None, description="Amazon S3 Vectors as a second target.")

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.startswith("s3://"):
            raise ValueError(f"{v[:80]!r} is not an s3:// URI: the index job writes to S3 only (s3://bucket/prefix/)")
        s3_uri_field(v, allow_empty_key=True)
        return v if v.endswith("/") else v + "/"

    def target(self, control_bucket: str, default_name: str) -> IndexTarget | None:
        """Where the index goes, or None when it is off; `default_name` is index_name(...)'s."""
        if not self.enabled:
            return None
        name = self.name or default_name
        vectors = (
            VectorsTarget(bucket=self.s3_vectors.bucket, shards=self.s3_vectors.shards) if self.s3_vectors else None
        )
        return IndexTarget(uri=self.uri or paths.index_uri(control_bucket, name), name=name, s3_vectors=vectors)


def index_name(manifest_name: str | None, manifest_key: str) -> str:
    """The default index name: the manifest's `name`, else its object's name less the extension."""
    if manifest_name:
        return manifest_name
    stem = manifest_key.rsplit("/", 1)[-1]
    stem = stem.rsplit(".", 1)[0] if "." in stem[1:] else stem
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem).lstrip("._-")[:64] or "index"


class OutputSpec(ManifestPart):
    """Where embeddings go; default s3://<control bucket>/runs/<run>/output/."""

    prefix: str | None = None
    dtype: Literal["float16", "float32"] = "float16"
    index: IndexSpec = Field(default=IndexSpec(), description="The search index the run's output goes into.")

    @field_validator("index", mode="before")
    @classmethod
    def _index_flag(cls, v: object) -> object:
        """`"index": false` is `{"enabled": false}`; `true` is the default index."""
        return {"enabled": v} if isinstance(v, bool) else v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.startswith("s3://"):
            raise ValueError(f"{v[:80]!r} is not an s3:// URI: workers write output to S3 only (s3://bucket/prefix/)")
        s3_uri_field(v, allow_empty_key=True)
        if len(v.encode("utf-8")) > 800:  # room under S3's 1,024-byte keys for shard=<i>/part-*.parquet
            raise ValueError("longer than 800 bytes: output keys would exceed S3's 1,024-byte limit")
        return v if v.endswith("/") else v + "/"  # a prefix is a folder: "out" must not become "outshard=0/"


class Manifest(ManifestPart):
    """A run manifest as uploaded to manifests/ (JSON)."""

    version: Literal[1] = Field(description="Manifest schema version; this Sluice reads 1.")
    name: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] | None = None
    input: InputSpec
    model: Annotated[
        Annotated[ModelSpec, Tag("object")]
        | Annotated[list[ModelSpec], Field(min_length=1, max_length=MAX_MODELS), Tag("list")],
        Discriminator(lambda v: "list" if isinstance(v, list) else "object"),  # errors from the branch written
    ] = Field(
        default=ModelSpec(),
        description=f"One model, or a list of up to {MAX_MODELS} embedded in one pass (each image fetched and "
        "decoded once); with several, output goes to output/model_name=<name>/.",
    )
    job: JobSpec = JobSpec()
    output: OutputSpec = OutputSpec()
    retry_failed: Annotated[int, Field(ge=0, le=3)] = 1
    max_failed_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        # Literal[1] alone takes true and 1.0 too (they equal 1 in Python).
        if type(v) is int and v == MANIFEST_VERSION:
            return v
        if isinstance(v, str) and v.strip() == str(MANIFEST_VERSION):
            raise ValueError(f'the string {v!r} is not a version: write the number, "version": 1')
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f'{json_type(v)} is not a version: write "version": 1')
        raise ValueError(f'unsupported manifest version {v!r}: this Sluice reads version 1 (write "version": 1)')

    @model_validator(mode="wrap")
    @classmethod
    def _default_model(cls, data: Any, handler: ModelWrapValidatorHandler[Manifest]) -> Manifest:
        """No model given: the builtin stand-in of the input's kind (a text run needs a text model), noted.

        A deployed run refuses the stand-in it was not asked for (sluice.input.checks: `unnamed_models`).
        """
        absent = isinstance(data, dict) and "model" not in data
        inp = data.get("input") if absent else None
        if isinstance(inp, dict) and inp.get("kind") == "text":
            data = {**data, "model": {"uri": "builtin:reference-text"}}
        out = handler(data)
        if absent:  # the stand-in was filled in, not written: model_fields_set says so (equality ignores it)
            out.__pydantic_fields_set__.discard("model")
        return out

    @property
    def unnamed_models(self) -> list[str]:
        """The model.uri fields the manifest left out (the builtin stand-in fills them): model.uri, model[1].uri."""
        if "model" not in self.model_fields_set:
            return ["model.uri"]
        if isinstance(self.model, ModelSpec):
            return [] if "uri" in self.model.model_fields_set else ["model.uri"]
        return [f"model[{i}].uri" for i, m in enumerate(self.model) if "uri" not in m.model_fields_set]

    @model_validator(mode="after")
    def _model_names(self) -> Manifest:
        names = [m.output_name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f'model: two models are named {twice[0]!r}: give each a distinct "name" (it is its output folder)'
            )
        return self

    @model_validator(mode="after")
    def _model_kinds(self) -> Manifest:
        kind = self.input.kind
        for i, m in enumerate(self.models):
            kinds = builtin_kinds(m.uri)
            if kinds is not None and kind not in kinds:
                where = "model" if len(self.models) == 1 else f"model[{i}]"
                fits = ", ".join(k for k, v in BUILTIN_KINDS.items() if kind in v)
                raise ValueError(
                    f"{where}: {m.uri} embeds {' or '.join(kinds)}, but input.kind is {kind!r}: "
                    f"pick a model for {kind} ("
                    + (f"builtins: {fits})" if fits else "no builtin embeds it: export one with sluice model export)")
                )
        return self

    @property
    def models(self) -> list[ModelSpec]:
        """The run's models, in the manifest's order (one for `"model": {...}`)."""
        return list(self.model) if isinstance(self.model, list) else [self.model]
