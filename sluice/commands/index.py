"""`sluice index build` and `sluice search` (docs/index.md).

    sluice index build SOURCE... --out INDEX [--model NAME] [--json]
    sluice index show INDEX [--json]
    sluice search INDEX (--image FILE... | --audio FILE | --key S3URI | --vector-file FILE.npy | --text "...")
                  [-k 10] [--json]

--image, --audio and --text embed the query with the index's own model: the artifact the table records
(or --artifact URI), whose identity (sluice.modelid) must be the artifact part of the table's
model_id; torch and the worker's code are imported for them only. A missing or foreign index, or a query it cannot
answer, is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from sluice.commands.common import EXIT_OK, EXIT_USAGE, Invocation, int_from
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice index build|show` and `sluice search`: their arguments and handlers."""
    from sluice.index.__main__ import add_build_arguments

    index = sub.add_parser("index", help="the search index of a run's embeddings").add_subparsers(
        dest="index_cmd", required=True
    )
    b = index.add_parser("build", help="build or update an index (Lance, one table per model) from runs' output")
    add_build_arguments(b)
    b.set_defaults(func=cmd_index_build)
    show = index.add_parser("show", help="an index's tables: model, model_id, dim, dtype, rows, ANN kind")
    show.add_argument("index", metavar="INDEX")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_index_show)
    rerun = index.add_parser("rerun", help="submit a run's failed index stage again (a job of its own name)")
    rerun.add_argument("run_id", metavar="RUN_ID", help="the run whose index stage failed (`sluice runs` lists them)")
    rerun.add_argument(
        "--timeout-s",
        type=int_from(60),
        metavar="N",
        help="the job's timeout (AWS Batch: at least 60 s; default: the one the stage had, from its rows)",
    )
    rerun.set_defaults(func=cmd_index_rerun)

    s = sub.add_parser("search", help="the nearest keys in an index to an image, a key, vectors or a text")
    s.add_argument("index", metavar="INDEX", help="the index folder (local or s3://) or one of its <model>.lance")
    q = s.add_mutually_exclusive_group(required=True)
    q.add_argument(
        "--image",
        metavar="FILE",
        action="append",
        help="embed this image with the index's own model (repeat it for several queries: a list each)",
    )
    q.add_argument(
        "--audio",
        metavar="FILE",
        help="embed this audio file as an audio run does (its windows averaged) with the index's own model",
    )
    q.add_argument("--key", metavar="S3URI", help="the embedding the index holds for this key")
    q.add_argument("--vector-file", metavar="FILE.npy", help="a (dim,) or (Q, dim) array: Q queries")
    q.add_argument(
        "--text",
        metavar="TEXT",
        help="embed this text with the index's own text model (a text run's), or a CLIP-style model's text tower",
    )
    s.add_argument("-k", type=int, default=10, help="results per query (default 10)")
    s.add_argument("--model", metavar="NAME", help="the model's table, when the index holds several")
    s.add_argument(
        "--artifact", metavar="URI", help="the model file for --image/--audio/--text (default: the one recorded)"
    )
    s.add_argument("--json", action="store_true", help='print {"results": [[{"key", "score"}, ...], ...]}')
    s.set_defaults(func=cmd_search)


def cmd_index_build(args: argparse.Namespace, inv: Invocation) -> int:
    """Build or update an index from runs' output (sluice.index's `build`)."""
    from sluice.index.__main__ import run_build

    return run_build(args)


def cmd_index_rerun(args: argparse.Namespace, inv: Invocation) -> int:
    """A failed index stage claimed and submitted again; its end comes as "Run Indexed" or "Index Failed"."""
    from sluice.control.context import Context
    from sluice.control.indexing.stage import rerun

    job_id = rerun(Context.build(inv.settings), args.run_id, args.timeout_s)
    print(f"sluice: index stage of {args.run_id} submitted again: job {job_id} (sluice status {args.run_id})")
    return EXIT_OK


def cmd_index_show(args: argparse.Namespace, inv: Invocation) -> int:
    """Print the index metadata of every table in the index."""
    from sluice.index.search import Searcher, open_tables

    try:
        tables = [Searcher(t).describe() for t in open_tables(args.index).values()]
    except SluiceError as exc:
        print(f"sluice: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({"index": args.index, "tables": tables}, indent=2))
        return EXIT_OK
    for t in tables:
        shape = f"{t['dim']}-d {t['dtype']}, {t['model_id']}"
        print(f"{t['table']}: {t['rows']:,} rows of {t['model']} ({shape}), ANN {t['ann']}")
    return EXIT_OK


def _vector_file(path: str) -> Any:
    """The query vectors in a .npy file."""
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SearchInputError(f"--vector-file {path}: not a .npy array ({exc})") from None
    rows = np.atleast_2d(np.asarray(arr, dtype=np.float64))
    bad = [i for i, r in enumerate(rows) if not np.isfinite(r).all() or not np.any(r)]
    if arr.ndim in (1, 2) and bad:  # a zero vector has no direction; NaN or inf none either: no score means anything
        which = (
            "the vector" if arr.ndim == 1 else f"row {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )
        raise SearchInputError(
            f"--vector-file {path}: {which} is all zeros or holds NaN/inf: give a real embedding "
            "(cosine needs a direction)"
        )
    return arr


class SearchInputError(SluiceError):
    """A query file or artifact that cannot be used; the message says which and why."""


def _artifact(meta: Any, override: str | None, work: str) -> str:
    """A local path (or builtin:NAME) of the index's model artifact, its identity checked."""
    from sluice.contracts.identity import artifact
    from sluice.modelid import resolve

    uri = override or meta.model_uri
    if not uri:
        raise SearchInputError(f"the index does not record where model {meta.model!r} is: pass --artifact URI")
    s3 = None
    if uri.startswith("s3://"):
        from sluice.aws.clients import client

        s3 = client("s3")
    got = resolve(uri, s3)
    if got != artifact(meta.model_id):  # the table's id also names its preprocessing (meta.image_size applies it)
        raise SearchInputError(
            f"{uri} is artifact {got}; the index holds {meta.model!r} embedded with model_id {meta.model_id}: "
            "embed queries with the artifact the index was built with (--artifact URI)"
        )
    if s3 is None:
        return uri
    from gpu_worker.door import fetch_model

    return fetch_model(uri, work)


def _queries(args: argparse.Namespace, searcher: Any, work: str) -> Any:
    """The query vectors (Q, dim) the arguments name."""
    import numpy as np

    if args.vector_file:
        return _vector_file(args.vector_file)
    if args.key:
        v = searcher.vector_of(args.key)
        if v is None:
            raise SearchInputError(f"--key {args.key}: the index holds no such key")
        return v[None, :]
    artifact = _artifact(searcher.meta, args.artifact, work)
    from gpu_worker.door import embed_audio, embed_images, embed_text

    if args.text is not None:
        return embed_text(artifact, args.text)
    if args.audio is not None:
        try:
            with open(args.audio, "rb") as fh:
                return embed_audio(artifact, args.audio, fh.read())
        except OSError as exc:
            raise SearchInputError(f"--audio {args.audio}: {exc.strerror}") from None

    images = []
    for path in args.image:
        try:
            with open(path, "rb") as fh:
                images.append((path, fh.read()))
        except OSError as exc:
            raise SearchInputError(f"--image {path}: {exc.strerror}") from None
    return np.asarray(embed_images(artifact, searcher.meta.image_size or 224, images))


def cmd_search(args: argparse.Namespace, inv: Invocation) -> int:
    """Print the k nearest keys of each query."""
    from gpu_worker.door import ConfigError  # the worker's code says what is wrong with an artifact or image
    from sluice.index.search import Searcher

    if args.k < 1:
        print("sluice: error: -k must be 1 or more", file=sys.stderr)
        return EXIT_USAGE
    try:
        searcher = Searcher.open(args.index, model=args.model)
        with tempfile.TemporaryDirectory(prefix="sluice-search-") as work:
            queries = _queries(args, searcher, work)
        results = searcher.search(queries, args.k)
    except (SluiceError, ConfigError) as exc:
        print(f"sluice: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({"results": [[_hit_json(h) for h in hits] for hits in results]}))
        return EXIT_OK
    for i, hits in enumerate(results):
        if len(results) > 1:
            print(f"query {i}")
        for rank, h in enumerate(hits, 1):
            where = f"  part {h.part} [{h.part_start:g}, {h.part_end:g})" if h.part or h.part_end else ""
            print(f"{rank:>4}  {h.score:.4f}  {h.key}{where}")
    return EXIT_OK


def _hit_json(h: Any) -> dict[str, Any]:
    """One hit as JSON: key and score, and where in the object for a text's chunk, a video's frame, an audio window."""
    out: dict[str, Any] = {"key": h.key, "score": h.score}
    if h.part or h.part_end:
        out |= {"part": h.part, "part_start": h.part_start, "part_end": h.part_end}
    return out
