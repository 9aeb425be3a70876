"""The output records: one Parquet row per embedded part of a key, with what a search index needs to upsert.

Columns (docs/worker.md, "Output and the commit protocol"; docs/kinds.md for the parts):
    key            string    s3://bucket/key of the object
    part           int32     which part of the object: 0 for an image, the chunk's index for a
                             text, the sampled frame's index for a video
    part_start     float64   where the part starts: character offset for text, seconds for video, 0 for an image
    part_end       float64   where it ends (exclusive): character offset, seconds, 0
    embedding      fixed_size_list<float16|float32>[dim], L2-normalised
    model          string    the model's name (PlannedModel.name)
    model_version  string    its spec's version ("" when the file has none)
    model_id       string    its model's identity: artifact + preprocessing (sluice.modelid)
    etag           string    the object's ETag when it was read, without quotes
    version_id     string    its version id (null in an unversioned bucket)
    size           int64     its size in bytes
    run            string    the run that wrote the row

The file's key-value metadata repeats the run, shard, chunk, model and dim. Defined once here:
the worker writes these rows, incremental planning and `sluice output` read them. Every part
of a key is written in the same chunk as the others, so a key's rows are whole or absent, and
a key is redone whole: readers that keep one version of a key keep all its parts of that version.
"""

from __future__ import annotations

from typing import Any

KEY = "key"
PART = "part"
PART_START = "part_start"
PART_END = "part_end"
EMBEDDING = "embedding"
MODEL = "model"
MODEL_VERSION = "model_version"
MODEL_ID = "model_id"
ETAG = "etag"
VERSION_ID = "version_id"
SIZE = "size"
RUN = "run"
COLUMNS = (KEY, PART, PART_START, PART_END, EMBEDDING, MODEL, MODEL_VERSION, MODEL_ID, ETAG, VERSION_ID, SIZE, RUN)
# What an incremental run reads of earlier output: which key, which object version, which model.
VERSION_COLUMNS = (KEY, ETAG, VERSION_ID, MODEL_ID)


def arrow_schema(dim: int, dtype: str) -> Any:
    """The pyarrow schema of an output file (pyarrow is imported here, never by the Lambdas)."""
    import pyarrow as pa

    value = pa.float16() if dtype == "float16" else pa.float32()
    return pa.schema(
        [
            pa.field(KEY, pa.string(), nullable=False),
            pa.field(PART, pa.int32(), nullable=False),
            pa.field(PART_START, pa.float64(), nullable=False),
            pa.field(PART_END, pa.float64(), nullable=False),
            pa.field(EMBEDDING, pa.list_(value, dim), nullable=False),
            pa.field(MODEL, pa.dictionary(pa.int8(), pa.string()), nullable=False),
            pa.field(MODEL_VERSION, pa.dictionary(pa.int8(), pa.string()), nullable=False),
            pa.field(MODEL_ID, pa.dictionary(pa.int8(), pa.string()), nullable=False),
            pa.field(ETAG, pa.string()),
            pa.field(VERSION_ID, pa.string()),
            pa.field(SIZE, pa.int64()),
            pa.field(RUN, pa.dictionary(pa.int8(), pa.string()), nullable=False),
        ]
    )


def object_version(etag: str | None, version_id: str | None) -> str:
    """What identifies one version of an object: its version id when versioned, else its ETag."""
    return f"v:{version_id}" if version_id and version_id != "null" else f"e:{(etag or '').strip(chr(34))}"


# Content kinds a run can embed (input.kind); an image is one part, text and video several.
KINDS = ("image", "text", "video", "audio")
