"""The manifest's input and model sections, the content kinds and the builtin models they are checked against."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from sluice.aws.s3uri import bad_char, bucket_problem, parse_s3_uri

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
Kind = Literal["image", "text", "video", "audio"]
# What a run of each kind counts: its objects, and the parts each becomes (one row each; none: one row an object).
KIND_WORDS: dict[str, tuple[str, str | None]] = {
    "image": ("images", None),
    "text": ("documents", "chunks"),
    "video": ("videos", "frames"),
    "audio": ("audio files", "windows"),
}
TIMED_KINDS = frozenset({"audio"})  # parts are spans of seconds: runs count the seconds of media they embed
URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MAX_ARRAY_SIZE = 10_000  # AWS Batch array jobs take 2..10,000 children
MAX_MNP_NODES = 1_000  # AWS Batch multi-node parallel jobs take up to 1,000 nodes (numNodes)
MAX_MODELS = 4  # models embedded in one pass: each holds its own weights and batch on every GPU
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManifestPart(Strict):
    """What a user writes: strict types, so `true` is not 1 and "10" is not a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def s3_uri_field(value: str | None, *, allow_empty_key: bool = False) -> str | None:
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


class ContentSpec(Strict):
    """What the objects are and how each becomes parts (docs/kinds.md): planned into plan.json as given."""

    kind: Kind = "image"
    chunk_tokens: int | None = None  # text: tokens a chunk holds (default: the model's window)
    overlap_tokens: int | None = None  # text: tokens a chunk shares with the one before (default: the model's)
    frames_per_second: float | None = None  # video: frames sampled a second
    frames_per_video: int | None = None  # video: frames sampled evenly over the whole video
    window_s: float | None = None  # audio: seconds a window holds (default: the model's)
    hop_s: float | None = None  # audio: seconds from one window's start to the next's (default: the window)


class InputSpec(ManifestPart):
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
    kind: Kind = Field(
        default="image", description="What the objects are: image, text, video or audio (docs/kinds.md)."
    )
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
    window_s: Annotated[float, Field(gt=0, le=600)] | None = Field(
        default=None, description="Audio: seconds of audio a window holds (one output row each); default: the model's."
    )
    hop_s: Annotated[float, Field(gt=0, le=600)] | None = Field(
        default=None, description="Audio: seconds from one window's start to the next's; default: the window."
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
        return s3_uri_field(v)

    @field_validator("prefix")
    @classmethod
    def _prefix_uri(cls, v: str | None) -> str | None:
        return s3_uri_field(v, allow_empty_key=True)

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
        own = {
            "text": ("chunk_tokens", "overlap_tokens"),
            "video": ("frames_per_second", "frames_per_video"),
            "audio": ("window_s", "hop_s"),
        }
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
            window_s=self.window_s,
            hop_s=self.hop_s,
        )


class ModelSpec(ManifestPart):
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
            return str(s3_uri_field(v))
        if URI_SCHEME.match(v) and not re.match(r"^[A-Za-z]:[\\/]", v):  # C:\ is a Windows path
            raise ValueError(
                f"{v[:80]!r}: workers read models from s3:// or builtin:NAME only: copy the file to S3 "
                "and give its s3:// URI"
            )
        if not v or bad_char(v):
            raise ValueError(f"{v[:80]!r} is not a model path")
        return v


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


def text_room(spec: dict[str, Any]) -> int | None:
    """Tokens of text one chunk of a text model file holds: its context less the special tokens around it."""
    try:
        length = int(spec["context_length"])
        return length - len(spec.get("prefix_ids") or ()) - len(spec.get("suffix_ids") or ())
    except (KeyError, TypeError, ValueError):
        return None


def json_type(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return {type(None): "null", str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)
