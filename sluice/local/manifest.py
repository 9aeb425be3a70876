"""The manifest a `sluice local run` submits: generated from its flags, or --manifest FILE with the flags on top.

Every flag that shapes a run is applied or refused with a message, never dropped:

* generated (--images DIR / --demo N / --since-run RUN): input, model(s), job and threshold from the flags;
* --manifest FILE (a JSON manifest): --model, --image-size, --max-failed-fraction, --mode, --nodes,
  --since-run, --chunk-tokens, --overlap-tokens, --frames-per-second, --frames-per-video replace
  the manifest's values; --shards sets job.keys_per_shard when the input is the files this run
  uploaded (their count is known), and is refused otherwise; a manifest without `input`, or whose
  `input` gives settings but no source (keys, key_list, prefix, inventory), reads the upload;
* --manifest FILE (a key list): no flag applies, each given one is refused.

Before any server starts, the manifest the flags make is checked by the manifest function's own
code (`rejections`: parse_manifest, check_manifest), the folder's or the demo's count standing in
for the upload: a flag the kind does not take, a value out of range, a model of another kind, a
chunk over the model's window are refused in the function's words.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.aws.s3uri import s3_uri
from sluice.contracts.sections import MODEL_NAME

INPUT_BUCKET = "sluice-local-images"
IMAGE_SIZE = 128  # --image-size of generated manifests (an exported model's spec gives its own)
BATCH_SIZE = 32
# The input fields a flag of the same name sets (text chunks, video frames: InputSpec).
CONTENT_FLAGS = ("chunk_tokens", "overlap_tokens", "frames_per_second", "frames_per_video", "window_s", "hop_s")
SOURCE_FIELDS = ("keys", "key_list", "prefix", "inventory")  # what an input reads (InputSpec: exactly one)
# The flags a manifest can take, as (argparse dest, flag).
RUN_FLAGS = (
    ("model", "--model"),
    ("image_size", "--image-size"),
    ("max_failed_fraction", "--max-failed-fraction"),
    ("mode", "--mode"),
    ("nodes", "--nodes"),
    ("shards", "--shards"),
    ("since_run", "--since-run"),
    ("decode", "--decode"),
    *((dest, "--" + dest.replace("_", "-")) for dest in CONTENT_FLAGS),
)


@dataclass
class Uploaded:
    """What --images DIR or --demo N put in the input bucket (count 0: nothing uploaded)."""

    prefix: str
    count: int
    skipped: list[str] = field(default_factory=list)  # files of DIR that are not images by name
    unreadable: list[str] = field(default_factory=list)  # ... and what could not be read (a dangling symlink)

    @property
    def uri(self) -> str:
        return s3_uri(INPUT_BUCKET, self.prefix)


@dataclass(frozen=True)
class Earlier:
    """The run --since-run names, as its manifest and plan say: what an incremental run repeats."""

    run_id: str
    input: dict[str, Any]  # its manifest's input (a prefix of the input bucket, for runs of --images)
    models: list[dict[str, Any]]  # its plan's models: uri, name, batch_size, image_size

    @property
    def local_prefix(self) -> str | None:
        """Its input prefix in the emulator's input bucket, if that is what it read."""
        prefix = str(self.input.get("prefix") or "")
        head = f"s3://{INPUT_BUCKET}/"
        return prefix[len(head) :] if prefix.startswith(head) and prefix != head else None


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
# Files each kind's folder flag uploads, by name (--texts, --videos); other files are skipped and counted.
KIND_SUFFIXES = {
    "image": IMAGE_SUFFIXES,
    "text": (".txt", ".md", ".markdown", ".rst", ".text"),
    "video": (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"),
    # an audio run reads a video file's first audio track too
    "audio": (
        ".wav",
        ".flac",
        ".mp3",
        ".ogg",
        ".opus",
        ".m4a",
        ".aac",
        ".aif",
        ".aiff",
        ".mp4",
        ".mkv",
        ".webm",
        ".mov",
    ),
}
# --images/--demo, --texts/--demo-texts, --videos/--demo-videos: (kind, folder flag, demo flag).
SOURCES = (
    ("image", "images", "demo"),
    ("text", "texts", "demo_texts"),
    ("video", "videos", "demo_videos"),
    ("audio", "audio", "demo_audio"),  # no demo: an audio run needs an exported model (docs/audio.md)
)
DEFAULT_MODEL = {"image": "builtin:reference-cnn", "text": "builtin:reference-text", "video": "builtin:reference-cnn"}


def content_source(args: argparse.Namespace) -> tuple[str, str | None, int | None]:
    """(kind, folder, demo count) of the run's upload flags; ("image", None, None) when none is given."""
    for kind, folder, demo in SOURCES:
        if getattr(args, folder, None) or getattr(args, demo, None) is not None:
            return kind, getattr(args, folder, None), getattr(args, demo, None)
    return "image", None, None


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether a flag was given (argparse leaves an absent one None)."""
    return getattr(args, dest, None) is not None


def parse_model(value: str) -> tuple[str | None, str]:
    """--model [NAME=]URI: (name or None, uri). A value that is an existing file is a path, '=' and all."""
    name, sep, uri = value.partition("=")
    if sep and re.match(MODEL_NAME, name) and uri and not Path(value).expanduser().is_file():
        return name, uri
    return None, value


def model_specs(args: argparse.Namespace, earlier: Earlier | None = None) -> list[dict[str, Any]]:
    """The run's model(s): --model (a local path made absolute), else --since-run's, else the builtin."""
    if not args.model and earlier is not None:
        return [
            dict(m, **({"image_size": args.image_size} if given(args, "image_size") else {})) for m in earlier.models
        ]
    specs = []
    kind = content_source(args)[0]
    if kind not in DEFAULT_MODEL and not args.model:
        raise SystemExit(
            f"sluice: an {kind} run needs --model FILE: no builtin embeds {kind}; export one with "
            "sluice model export hf:FOLDER-or-REPO (CLAP, wav2vec2, HuBERT, Whisper: docs/audio.md)"
        )
    for value in args.model or [DEFAULT_MODEL[kind]]:
        name, uri = parse_model(value)
        if not uri.startswith(("builtin:", "s3://")):
            if not Path(uri).expanduser().is_file():
                raise SystemExit(
                    f"sluice: --model {value}: no such file (give a model file, an s3:// URI or builtin:NAME)"
                )
            uri = str(Path(uri).expanduser().resolve())
        spec = {"uri": uri, "batch_size": BATCH_SIZE, "image_size": args.image_size or IMAGE_SIZE}
        specs.append(spec | ({"name": name} if name else {}))
    return specs


def check_flags(args: argparse.Namespace) -> None:
    """Flags that contradict each other, refused before anything starts."""
    mode = args.mode
    if mode != "multinode" and given(args, "nodes") and not args.manifest:
        raise SystemExit("sluice: --nodes is for multi-node parallel jobs: add --mode multinode, or use --shards")
    if mode == "multinode" and given(args, "shards"):
        raise SystemExit("sluice: --shards is for array jobs; a multinode run has one shard per node: use --nodes")
    if args.since_run and not args.endpoint_url:
        raise SystemExit(
            f"sluice: --since-run {args.since_run}: give --endpoint-url URL, the emulator that holds that run "
            "(the one `sluice local run --keep` printed)"
        )
    names = [parse_model(v)[0] or v for v in args.model or []]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(
            f"sluice: --model {twice[0]} is given twice: give each model once, or name copies: --model a={twice[0]} "
            f"--model b={twice[0]}"
        )


def check_file(args: argparse.Namespace) -> None:
    """--manifest FILE is there and, if .json, is JSON: else refused naming the local path, before anything starts."""
    if not args.manifest:
        return
    path = Path(args.manifest).expanduser()
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        raise SystemExit(f"sluice: --manifest {path}: {what} (give a .json manifest or a .txt/.csv/.jsonl key list)")
    if path.name.lower().endswith(".json"):
        try:
            json.loads(path.read_bytes())
        except ValueError as exc:
            raise SystemExit(f"sluice: --manifest {path}: not valid JSON ({exc}): fix it, then run again") from None


def run_token() -> str:
    """A local run's own stamp (UTC time and a random part): runs started in the same second still differ."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def build(
    args: argparse.Namespace, uploaded: Uploaded, earlier: Earlier | None, token: str = ""
) -> tuple[str, bytes, list[str]]:
    """(object name under manifests/, body, the flags applied on top of --manifest).

    A generated manifest's name (the default index name) carries `token`: each run its own index,
    not one shared by every demo run of the emulator; an incremental run updates its lineage's.
    """
    if args.manifest:
        return _from_file(args, uploaded, earlier)
    job: dict[str, Any] = {"mode": args.mode or "array"}
    if job["mode"] == "multinode":
        job["nodes"] = args.nodes or 2
    elif uploaded.count:
        shards = args.shards or max(1, min(4, os.cpu_count() or 1))
        job["keys_per_shard"] = max(1, -(-uploaded.count // shards))
    elif given(args, "shards"):
        raise SystemExit("sluice: --shards with --since-run and no --images: the number of keys is not known here")
    if getattr(args, "decode", None):
        job["decode"] = args.decode
    specs = model_specs(args, earlier)
    kind, folder, _ = content_source(args)
    name = f"local-{kind}s" if folder else ("local-incremental" if earlier and not uploaded.count else "local-demo")
    manifest: dict[str, Any] = {
        "version": 1,
        "name": f"{name}-{token}" if token and earlier is None else name,
        "input": _input(uploaded, kind) if uploaded.count else dict(earlier.input if earlier else {}),
        "model": specs[0] if len(specs) == 1 else specs,
        "job": job,
    }
    if earlier is not None:
        manifest["input"]["since_run"] = earlier.run_id
    manifest["input"].update(_content(args))
    if given(args, "max_failed_fraction"):
        manifest["max_failed_fraction"] = args.max_failed_fraction
    return "local-run.json", json.dumps(manifest, indent=2).encode(), []


def _content(args: argparse.Namespace) -> dict[str, Any]:
    """The input fields the text, video and audio flags set (the manifest function checks them against the kind)."""
    return {dest: getattr(args, dest) for dest in CONTENT_FLAGS if given(args, dest)}


def _input(uploaded: Uploaded, kind: str) -> dict[str, Any]:
    """The manifest's input for what this run uploaded: its prefix, and its kind unless images."""
    return {"prefix": uploaded.uri} | ({"kind": kind} if kind != "image" else {})


def _from_file(args: argparse.Namespace, uploaded: Uploaded, earlier: Earlier | None) -> tuple[str, bytes, list[str]]:
    path = Path(args.manifest)
    body = path.read_bytes()
    flags = [flag for dest, flag in RUN_FLAGS if given(args, dest)]
    if not path.name.lower().endswith(".json"):
        if flags:
            raise SystemExit(
                f"sluice: --manifest {path} is a key list: {', '.join(flags)} need a JSON manifest "
                "(docs/manifest.md), or drop --manifest and use --images DIR"
            )
        return path.name, body, []
    try:
        manifest = json.loads(body)
    except ValueError:
        return path.name, body, []  # check_file refused it before the run; the manifest function would too
    if not isinstance(manifest, dict):
        return path.name, body, []
    return path.name, json.dumps(apply(manifest, args, uploaded, earlier), indent=2).encode(), flags


def apply(manifest: dict[str, Any], args: argparse.Namespace, uploaded: Uploaded, earlier: Earlier | None) -> dict:
    """The JSON manifest with the given flags on top (a flag that cannot apply is refused: SystemExit)."""
    m = dict(manifest)
    if uploaded.count and "input" not in m:
        m["input"] = _input(uploaded, content_source(args)[0])  # a manifest without input reads the upload
    elif uploaded.count and isinstance(m["input"], dict) and not any(f in m["input"] for f in SOURCE_FIELDS):
        m["input"] = {**_input(uploaded, content_source(args)[0]), **m["input"]}  # settings, the upload's source
    if isinstance(m.get("input"), dict) and _content(args):
        m["input"] = {**m["input"], **_content(args)}
    inp = m.get("input") if isinstance(m.get("input"), dict) else None
    if earlier is not None:
        if inp is None:
            raise SystemExit("sluice: --since-run needs the manifest's input (or --images DIR)")
        m["input"] = inp = {**inp, "since_run": earlier.run_id}
    if args.model or (given(args, "image_size") and not isinstance(m.get("model"), dict | list)):
        specs = model_specs(args)
        m["model"] = specs[0] if len(specs) == 1 else specs
    elif given(args, "image_size"):
        m["model"] = _sized(m["model"], args.image_size)
    if given(args, "max_failed_fraction"):
        m["max_failed_fraction"] = args.max_failed_fraction
    job = dict(m["job"]) if isinstance(m.get("job"), dict) else {}
    if args.mode:
        job["mode"] = args.mode
    if given(args, "nodes"):
        if job.get("mode", "array") != "multinode":
            raise SystemExit("sluice: --nodes: the manifest's job is an array job: add --mode multinode")
        job["nodes"] = args.nodes
    if given(args, "shards"):
        if job.get("mode", "array") == "multinode":
            raise SystemExit("sluice: --shards is for array jobs; the manifest's job is multinode: use --nodes")
        if not uploaded.count or not inp or inp.get("prefix") != uploaded.uri:
            raise SystemExit(
                "sluice: --shards needs the number of keys, known only for the images this run uploads: "
                "give job.keys_per_shard in the manifest, or leave input out of it and use --images DIR"
            )
        job["keys_per_shard"] = max(1, -(-uploaded.count // args.shards))
    if getattr(args, "decode", None):
        job["decode"] = args.decode
    if job:
        m["job"] = job
    return m


def _sized(model: Any, size: int) -> Any:
    """The manifest's model (one, or a list) with image_size set."""
    if isinstance(model, list):
        return [_sized(x, size) for x in model]
    return {**model, "image_size": size} if isinstance(model, dict) else model


def read_earlier(s3: Any, control: str, run_id: str) -> Earlier:
    """The run --since-run names, from its plan and manifest in the control bucket; SystemExit when it has none."""
    from sluice.aws.store import ObjectStore
    from sluice.contracts.plan import RunPlan
    from sluice.paths import RunPaths

    try:
        plan = RunPlan.model_validate_json(ObjectStore(s3).get(RunPaths.in_bucket(control, run_id).plan))
        is_json = plan.manifest_uri.lower().endswith(".json")
        manifest = (
            json.loads(ObjectStore(s3).get(plan.manifest_uri))
            if is_json
            else {"input": {"key_list": plan.manifest_uri}}
        )
    except Exception as exc:
        raise SystemExit(
            f"sluice: --since-run {run_id}: no plan of that run on this emulator ({type(exc).__name__}): "
            "`sluice runs` lists the runs it holds"
        ) from None
    models = [
        {"uri": m.uri, "name": m.name, "batch_size": m.batch_size, "image_size": m.image_size} for m in plan.models
    ]
    inp = manifest.get("input") if isinstance(manifest, dict) else None
    return Earlier(run_id, {k: v for k, v in (inp or {}).items() if k != "since_run"}, models)


DEMO_DEFAULT = 200  # --demo without N (sluice.local.upload)


def rejections(args: argparse.Namespace, files: int | None) -> list[str]:
    """The reasons the manifest function would give to reject this run ([]: none found here).

    `files`: the folder's files of the kind (None: no folder given).
    """
    from sluice.errors import Rejection
    from sluice.input.checks import check_manifest
    from sluice.input.manifest import ManifestSource, parse_manifest
    from sluice.paths import MANIFESTS_PREFIX
    from sluice.settings import Settings

    if args.since_run:
        return []  # its manifest builds on the earlier run, read from the emulator
    demo = content_source(args)[2]
    upload = demo if demo is not None else (0 if args.manifest else DEMO_DEFAULT)
    count = files if files is not None else upload
    name, body, _ = build(args, Uploaded("precheck/", count), None, "precheck")
    settings = Settings.from_env().model_copy(update={"local_mode": True})  # as the router runs the function
    try:
        manifest = parse_manifest(ManifestSource(INPUT_BUCKET, f"{MANIFESTS_PREFIX}{name}", body), settings)
        check_manifest(manifest, settings, control=None, s3=None)  # s3 None: no S3 object is read
    except Rejection as exc:
        return list(exc.reasons)
    return []


def refuse_rejected(args: argparse.Namespace, files: int | None) -> None:
    """SystemExit with the manifest function's reasons when it would reject the run (nothing started)."""
    reasons = rejections(args, files)
    if reasons:
        lines = "".join(f"\n  - {r}" for r in reasons)
        raise SystemExit(f"sluice: rejected before anything started (the manifest function's own checks):{lines}")
