"""Pydantic models: the run manifest a user uploads and the plan every worker reads.

The other contracts between processes (result.json, failure lines, ledger items, event
details) are in sluice.contracts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from sluice import paths
from sluice.aws.s3uri import bad_char, bucket_problem, parse_s3_uri
from sluice.errors import PlanError
from sluice.paths import RunPaths

MANIFEST_VERSION = 1
# The worker's builtin networks (gpu_worker.models.builtins.BUILTINS; a unit test keeps the two equal),
# named here so the manifest Lambda, which never imports torch, can check model.uri.
# All are stand-ins with untrained weights, named so that none passes for a real model.
BUILTIN_MODELS = ("reference-cnn", "reference-cnn-large", "reference-text")
# The content kinds each builtin accepts (an image model embeds a video's sampled frames too).
BUILTIN_KINDS: dict[str, tuple[str, ...]] = {
    "reference-cnn": ("image", "video"),
    "reference-cnn-large": ("image", "video"),
    "reference-text": ("text",),
}
RENAMED_BUILTINS = {"resnet50": "reference-cnn-large"}  # old name -> new: the old is refused, naming the new
Kind = Literal["image", "text", "video"]
# What a run of each kind counts: its objects, and the parts each becomes (one row each; none: one row an object).
KIND_WORDS: dict[str, tuple[str, str | None]] = {
    "image": ("images", None),
    "text": ("documents", "chunks"),
    "video": ("videos", "frames"),
}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MAX_ARRAY_SIZE = 10_000  # AWS Batch array jobs take 2..10,000 children
MAX_MNP_NODES = 1_000  # AWS Batch multi-node parallel jobs take up to 1,000 nodes (numNodes)
MAX_MODELS = 4  # models embedded in one pass: each holds its own weights and batch on every GPU
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ManifestPart(_Strict):
    """What a user writes: strict types, so `true` is not 1 and "10" is not a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _s3_uri(value: str | None, *, allow_empty_key: bool = False) -> str | None:
    if value is None:
        return None
    try:
        parse_s3_uri(value, allow_empty_key=allow_empty_key)
    except ValueError as exc:
        bucket_why = bucket_problem(value[5:].partition("/")[0]) if value.startswith("s3://") else None
        why = f"{value[:80]!r}: {bucket_why}" if bucket_why else str(exc)
        raise ValueError(f"{why}: give s3://bucket/{'prefix/' if allow_empty_key else 'key'}") from None
    char = bad_char(value)
    if char:
        raise ValueError(f"{value[:80]!r} holds {char}")
    return value


class ContentSpec(_Strict):
    """What the objects are and how each becomes parts (docs/kinds.md): planned into plan.json as given."""

    kind: Kind = "image"
    chunk_tokens: int | None = None  # text: tokens a chunk holds (default: the model's window)
    overlap_tokens: int | None = None  # text: tokens a chunk shares with the one before (default: the model's)
    frames_per_second: float | None = None  # video: frames sampled a second
    frames_per_video: int | None = None  # video: frames sampled evenly over the whole video


class InputSpec(_ManifestPart):
    """Where the keys come from: exactly one of keys, key_list, prefix, inventory."""

    keys: list[str] | None = Field(default=None, description="Inline keys: bare keys (in `bucket`) or s3:// URIs.")
    key_list: str | None = Field(default=None, description="s3:// URI of a .txt/.csv/.jsonl key list (one key a line).")
    prefix: str | None = Field(default=None, description="s3://bucket/prefix to list (paginated).")
    inventory: str | None = Field(
        default=None, description="s3:// URI of an S3 Inventory manifest.json (CSV or Parquet)."
    )
    bucket: str | None = Field(default=None, description="Bucket for bare keys.")
    suffixes: list[str] | None = Field(
        default=None, description="Keep only keys ending with one of these (case-insensitive)."
    )
    kind: Kind = Field(default="image", description="What the objects are: image, text or video (docs/kinds.md).")
    chunk_tokens: Annotated[int, Field(ge=8, le=65_536)] | None = Field(
        default=None, description="Text: tokens per chunk (one output row each); default: the model's window."
    )
    overlap_tokens: Annotated[int, Field(ge=0, le=65_535)] | None = Field(
        default=None, description="Text: tokens each chunk repeats from the one before; default: the model's."
    )
    frames_per_second: Annotated[float, Field(gt=0, le=60)] | None = Field(
        default=None, description="Video: frames sampled per second of video (one output row each)."
    )
    frames_per_video: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        default=None, description="Video: frames sampled evenly over each video, whatever its length."
    )
    since_run: Annotated[str, Field(pattern=RUN_ID)] | None = Field(
        default=None,
        description="Incremental run: skip keys that this earlier run (or the runs it was itself incremental "
        "on) already embedded from the same object version (ETag / version id) with the same model_id (artifact "
        "and preprocessing).",
    )

    @field_validator("key_list", "inventory")
    @classmethod
    def _object_uri(cls, v: str | None) -> str | None:
        return _s3_uri(v)

    @field_validator("prefix")
    @classmethod
    def _prefix_uri(cls, v: str | None) -> str | None:
        return _s3_uri(v, allow_empty_key=True)

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        why = None if v is None else bucket_problem(v)
        if why:
            raise ValueError(why)
        return v

    @field_validator("suffixes")
    @classmethod
    def _suffixes(cls, v: list[str] | None) -> list[str] | None:
        for i, s in enumerate(v or ()):
            if not s or bad_char(s):
                raise ValueError(f"suffix {i} ({s[:40]!r}) is empty or holds a control character")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> InputSpec:
        given = [n for n in ("keys", "key_list", "prefix", "inventory") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "input needs exactly one of keys, key_list, prefix, inventory"
                + (f" (got {', '.join(given)})" if given else " (got none)")
            )
        return self

    @model_validator(mode="after")
    def _kind_fields(self) -> InputSpec:
        own = {"text": ("chunk_tokens", "overlap_tokens"), "video": ("frames_per_second", "frames_per_video")}
        for kind, names in own.items():
            given = [n for n in names if getattr(self, n) is not None]
            if given and self.kind != kind:
                raise ValueError(f'{given[0]} is for "kind": "{kind}" (this input\'s kind is {self.kind!r})')
        if self.frames_per_second is not None and self.frames_per_video is not None:
            raise ValueError("give frames_per_second or frames_per_video, not both")
        if self.chunk_tokens and self.overlap_tokens is not None and self.overlap_tokens >= self.chunk_tokens:
            raise ValueError(
                f"overlap_tokens ({self.overlap_tokens}) must be less than chunk_tokens ({self.chunk_tokens})"
            )
        return self

    @property
    def content(self) -> ContentSpec:
        """The kind and its options, as plan.json carries them to the worker."""
        return ContentSpec(
            kind=self.kind,
            chunk_tokens=self.chunk_tokens,
            overlap_tokens=self.overlap_tokens,
            frames_per_second=self.frames_per_second,
            frames_per_video=self.frames_per_video,
        )


class ModelSpec(_ManifestPart):
    """The model a worker runs."""

    uri: str = Field(default="builtin:reference-cnn", description="builtin:NAME, a path or s3:// URI.")
    batch_size: Annotated[int, Field(ge=1, le=65_536)] = 64
    image_size: Annotated[int, Field(ge=8, le=8_192)] = 224
    name: Annotated[str, Field(pattern=MODEL_NAME)] | None = Field(
        default=None,
        description="The model's name in output records and, with several models, its folder "
        "output/model_name=<name>/; default: the builtin's name or the file name without its extension.",
    )

    @property
    def output_name(self) -> str:
        """`name`, else derived from the uri: builtin:reference-cnn -> reference-cnn, s3://b/m/vit-b.pt2 -> vit-b."""
        if self.name:
            return self.name
        base = self.uri.split(":", 1)[1] if self.uri.startswith("builtin:") else re.split(r"[\\/]", self.uri)[-1]
        stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
        clean = re.sub(r"[^A-Za-z0-9_.-]", "-", stem).lstrip("._-")[:64]
        return clean or "model"

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        """What can be told without S3 or settings (sluice.input.checks checks the rest at plan time)."""
        if v.startswith("builtin:"):
            if v[8:] in RENAMED_BUILTINS:
                raise ValueError(
                    f"{v} is now builtin:{RENAMED_BUILTINS[v[8:]]}: an untrained network of that shape, not the "
                    "trained model; for the real one, export it (sluice model export torchvision:resnet50, "
                    "docs/models.md) and give its s3:// URI"
                )
            if v[8:] not in BUILTIN_MODELS:
                raise ValueError(f"unknown builtin model {v[8:80]!r}; builtins: {', '.join(BUILTIN_MODELS)}")
            return v
        if v.startswith("s3://"):
            return str(_s3_uri(v))
        if _SCHEME.match(v) and not re.match(r"^[A-Za-z]:[\\/]", v):  # C:\ is a Windows path
            raise ValueError(
                f"{v[:80]!r}: workers read models from s3:// or builtin:NAME only: copy the file to S3 "
                "and give its s3:// URI"
            )
        if not v or bad_char(v):
            raise ValueError(f"{v[:80]!r} is not a model path")
        return v


Decode = Literal["auto", "cpu", "gpu"]


class JobSpec(_ManifestPart):
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


class VectorsTarget(_Strict):
    """Amazon S3 Vectors, a second target of the index stage: indexes <name>-<model>-<shard> in one vector bucket."""

    bucket: str
    shards: int


class IndexTarget(_Strict):
    """Where a run's search index goes (docs/index.md): a folder of one Lance table per model."""

    uri: str  # s3://bucket/prefix/ ending in "/"
    name: str
    s3_vectors: VectorsTarget | None = None  # also upserted into S3 Vectors (output.index.s3_vectors)


class S3VectorsSpec(_ManifestPart):
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


class IndexSpec(_ManifestPart):
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
        _s3_uri(v, allow_empty_key=True)
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


class OutputSpec(_ManifestPart):
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
        _s3_uri(v, allow_empty_key=True)
        if len(v.encode("utf-8")) > 800:  # room under S3's 1,024-byte keys for shard=<i>/part-*.parquet
            raise ValueError("longer than 800 bytes: output keys would exceed S3's 1,024-byte limit")
        return v if v.endswith("/") else v + "/"  # a prefix is a folder: "out" must not become "outshard=0/"


class Manifest(_ManifestPart):
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
            raise ValueError(f'{_json_type(v)} is not a version: write "version": 1')
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
                raise ValueError(
                    f"{where}: {m.uri} embeds {' or '.join(kinds)}, but input.kind is {kind!r}: "
                    f"pick a model for {kind} (builtins: {', '.join(k for k, v in BUILTIN_KINDS.items() if kind in v)})"
                )
        return self

    @property
    def models(self) -> list[ModelSpec]:
        """The run's models, in the manifest's order (one for `"model": {...}`)."""
        return list(self.model) if isinstance(self.model, list) else [self.model]


def stand_in_warnings(uris: Sequence[str]) -> list[str]:
    """A warning for each builtin model of a run: untrained weights, so its vectors only test the pipeline."""
    return [
        f"{'model' if len(uris) == 1 else f'model[{i}]'}.uri {uri}: a builtin stand-in with untrained weights: "
        "its vectors test the pipeline and mean nothing for search; export a real model (sluice model export, "
        "docs/models.md)"
        for i, uri in enumerate(uris)
        if uri.startswith("builtin:")
    ]


def builtin_kinds(uri: str) -> tuple[str, ...] | None:
    """The kinds a builtin model accepts; None for a file (its spec's `kinds` says, checked at plan time)."""
    return BUILTIN_KINDS.get(uri[8:]) if uri.startswith("builtin:") else None


def file_kinds(spec: dict[str, Any]) -> tuple[str, ...]:
    """The kinds a model file's spec names; a spec without `kinds` is an image model's (image and video)."""
    kinds = spec.get("kinds")
    if isinstance(kinds, list) and kinds:
        return tuple(str(k) for k in kinds)
    return ("image", "video")


def _json_type(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return {type(None): "null", str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def pass_batch(models: Sequence[ModelSpec] | Sequence[PlannedModel]) -> int:
    """The batch a rank's pass runs every model at: the smallest any of them asks for, so each one fits."""
    return min(m.batch_size for m in models)


class JobLayout(_Strict):
    """One AWS Batch job of a run: its kind and the shards it covers."""

    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int


class PlannedModel(_Strict):
    """One model of a planned run: the manifest's spec, its output name and its artifact's identity."""

    uri: str
    batch_size: int
    image_size: int
    name: str  # ModelSpec.output_name: the output records' `model` and, with several models, the folder
    # What "the same model" means to incremental runs and indexes (sluice.modelid): the artifact
    # (builtin:<name>@<weights version>, s3etag:<ETag>[@<version id>], sha256:<hex>) and its
    # preprocessing (;image_size=128, a text window, a video's frame sampling).
    model_id: str

    @classmethod
    def of(cls, spec: ModelSpec, model_id: str | None = None) -> PlannedModel:
        """`spec` planned with `model_id` (default: the identity that needs no I/O, sluice.modelid.static_id)."""
        from sluice.modelid import static_id

        return cls(
            uri=spec.uri,
            batch_size=spec.batch_size,
            image_size=spec.image_size,
            name=spec.output_name,
            model_id=model_id or static_id(spec.uri),
        )


class RunPlan(_Strict):
    """Everything a worker needs: written to runs/<run>/plan.json."""

    plan_version: Literal[1] = 1
    run_id: str
    manifest_uri: str
    control_bucket: str
    shards_prefix: str  # s3://bucket/runs/<run>/shards/ ; shard i is <prefix><i>.shard
    output_prefix: str
    failures_prefix: str
    total_keys: int
    duplicates: int
    n_shards: int
    keys_per_shard: int
    mode: Literal["array", "multinode"]
    nodes: int
    gpus_per_node: int
    spot_allowed: bool  # multi-node parallel jobs cannot run on Spot
    models: Annotated[list[PlannedModel], Field(min_length=1, max_length=MAX_MODELS)]
    output_dtype: Literal["float16", "float32"]
    attempts: int
    timeout_s: int
    stall_after_s: int | None = None  # no progress this long: stalled (None: a plan from before; the worker's default)
    load_grace_s: int | None = None  # no first beat this long after RUNNING: stalled (job.load_grace_s; None: before)
    input_buckets: list[str] = []  # the buckets the prepare stage's keys name; empty: the manifest's input says
    max_failed_fraction: float
    retry_failed: int
    jobs: list[JobLayout]
    created_at: str
    remote_write_url: str | None = None  # AMP remote-write URL; SLUICE_REMOTE_WRITE_URL on the worker wins
    # Incremental runs: the earlier runs whose output this one completes, newest first (input.since_run
    # and the runs it was itself incremental on), and the keys left out because they already have output.
    lineage: list[str] = []
    skipped: dict[str, int] = {}  # reason -> keys (unchanged: same object version, same model_id)
    index: IndexTarget | None = None  # the search index the index stage updates (output.index); None: off
    decode: Decode = "auto"  # job.decode
    decode_binds: bool = False  # the preflight's estimate: CPU decode would hold the GPUs back (auto decodes on GPU)
    content: ContentSpec = ContentSpec()  # what the objects are (input.kind) and how each becomes parts

    @model_validator(mode="before")
    @classmethod
    def _legacy_model(cls, data: Any) -> Any:
        # Plans written before several models per run held one `model` (a ModelSpec).
        if isinstance(data, dict) and "model" in data and "models" not in data:
            data = dict(data)
            data["models"] = [PlannedModel.of(ModelSpec(**data.pop("model"))).model_dump()]
        return data

    @property
    def model(self) -> PlannedModel:
        """The first model: the pass's batch size and input size start from it."""
        return self.models[0]

    @property
    def effective_batch(self) -> int:
        """The batch every model of a rank's pass runs at (pass_batch); the planner's stall limit uses the same."""
        return pass_batch(self.models)

    @property
    def multi_model(self) -> bool:
        """Several models: output goes to output/model_name=<name>/shard=<i>/."""
        return len(self.models) > 1

    @classmethod
    def standalone(
        cls,
        run_id: str,
        base: str,
        *,
        n_shards: int,
        total_keys: int,
        model: ModelSpec | list[ModelSpec] | None = None,
        **overrides: Any,
    ) -> RunPlan:
        """A plan for running workers without the coordinator (benchmarks, tests, by hand).

        `base` is the run's root (`s3://bucket/runs/<run>/` or a local directory ending in
        "/"); shards, output and failures live under it as the coordinator lays them out.
        Any other field can be given in `overrides`; `mode` (default "array") also decides
        `nodes` (one per shard for "multinode") and `spot_allowed`, unless those are given too.
        """
        from sluice.modelid import static_identity

        mode = overrides.get("mode", "array")
        bucket = base[5:].split("/", 1)[0] if base.startswith("s3://") else "local"
        root = RunPaths(base)
        values: dict[str, Any] = {
            "run_id": run_id,
            "manifest_uri": base + "manifest.json",
            "control_bucket": bucket,
            "shards_prefix": root.shards_prefix,
            "output_prefix": root.output_prefix,
            "failures_prefix": root.failures_prefix,
            "total_keys": total_keys,
            "duplicates": 0,
            "n_shards": n_shards,
            "keys_per_shard": max(1, -(-total_keys // max(1, n_shards))),
            "mode": mode,
            "nodes": n_shards if mode == "multinode" else 1,
            "gpus_per_node": 0,
            "spot_allowed": mode == "array",
            "models": [
                PlannedModel.of(m, static_identity(m, ContentSpec.model_validate(overrides.get("content") or {})))
                for m in (model if isinstance(model, list) else [model or ModelSpec()])
            ],
            "output_dtype": "float16",
            "attempts": 3,
            "timeout_s": 3600,
            "max_failed_fraction": 0.05,
            "retry_failed": 1,
            "jobs": [],
            "created_at": "standalone",
        }
        return cls(**{**values, **overrides})

    def shard_uri(self, index: int) -> str:
        """URI of shard `index`."""
        return paths.shard_uri(self.shards_prefix, index)

    def result_uri(self, index: int) -> str:
        """URI of shard `index`'s result.json."""
        return paths.result_uri(self.shards_prefix, index)

    def failures_uri(self, index: int) -> str:
        """URI of shard `index`'s failures/<i>.jsonl."""
        return paths.failures_uri(self.failures_prefix, index)

    def model_output_prefix(self, model: int = 0) -> str:
        """Where model `model`'s output goes: the output prefix, or <prefix>model_name=<name>/ with several models."""
        if not self.multi_model:
            return self.output_prefix
        return paths.model_output_prefix(self.output_prefix, self.models[model].name)

    def output_dir(self, index: int, model: int = 0) -> str:
        """Where shard `index`'s Parquet chunks and commit markers go (for model `model`)."""
        return paths.shard_output_dir(self.model_output_prefix(model), index)


def load_plan(read: Callable[[str], bytes], uri: str) -> RunPlan:
    """Read and validate a plan.json; `read` fetches a URI (S3 or a local path). PlanError says what is wrong."""
    try:
        raw = read(uri)
    except Exception as exc:
        raise PlanError(f"cannot read the plan {uri}: {type(exc).__name__}: {exc}") from exc
    try:
        return RunPlan.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "plan"
        raise PlanError(
            f"{uri} is not a valid plan.json: {where}: {first.get('msg')} ({exc.error_count()} problem(s))"
        ) from None


SKIPPED_UNCHANGED = "unchanged"  # RunPlan.skipped's reasons: the key's row is of its current version
SKIPPED_FAILED = "failed_before"  # ... its current bytes failed for their data before (docs/incremental.md)
