"""`sluice shard pack` and `sluice shard cat`: shard files (docs/shard-format.md) from a key list, and back."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sluice.commands.common import EXIT_OK, Invocation, silence_stdout

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice shard pack|cat`: their arguments and handlers."""
    shard = sub.add_parser("shard", help="pack or print shard files").add_subparsers(
        dest="shard_cmd", required=True, metavar="pack|cat"
    )
    pack = shard.add_parser("pack", help="key-list file -> shard file")
    pack.add_argument("keylist", metavar="KEYLIST", help="a key list: one key or s3:// URI a line")
    pack.add_argument("out", metavar="FILE", help="the shard file to write")
    pack.add_argument("--bucket", metavar="BUCKET", help="bucket for bare keys")
    pack.add_argument("--sort", action="store_true", help="sort keys within each bucket (smaller file)")
    pack.set_defaults(func=cmd_shard_pack)
    cat = shard.add_parser("cat", help="print a shard's keys")
    cat.add_argument("shard", metavar="SHARD", help="path or s3:// URI")
    cat.add_argument("--start", type=int, default=0, metavar="N", help="first key position to print (default 0)")
    cat.add_argument(
        "--stop", type=int, default=None, metavar="N", help="print keys before this position (default: to the end)"
    )
    cat.add_argument("--keys-only", action="store_true", help="print bare keys, not s3:// URIs")
    cat.set_defaults(func=cmd_shard_cat)


def read_chunks(path: str, chunk: int = 8 * 2**20) -> Iterator[bytes]:
    """A local file's bytes, `chunk` at a time."""
    with open(path, "rb") as fh:
        while data := fh.read(chunk):
            yield data


def cmd_shard_pack(args: argparse.Namespace, inv: Invocation) -> int:
    """Key-list file (one key or s3:// URI a line) -> one shard file, keys exactly as given."""
    from sluice.input.sources import Problems, iter_keylist
    from sluice.shards import ShardWriter

    problems = Problems()
    with open(args.out, "wb") as fh:
        writer = ShardWriter(fh, sort=args.sort)
        for bucket, keys in iter_keylist(read_chunks(args.keylist), args.keylist, ".txt", args.bucket, problems):
            writer.add(bucket, keys)
        problems.raise_if_any()
        stats = writer.close()
    print(f"{args.out}: {stats.n_keys} keys, {stats.n_blocks} blocks, {stats.n_bytes} bytes", file=sys.stderr)
    return EXIT_OK


def cmd_shard_cat(args: argparse.Namespace, inv: Invocation) -> int:
    """Print a shard's keys (s3:// URIs), one a line; SHARD is a path or an s3:// URI."""
    from sluice.shards import FileSource, ShardReader

    if args.shard.startswith("s3://"):
        from sluice.aws.s3uri import parse_s3_uri

        b, k = parse_s3_uri(args.shard)
        reader = ShardReader(inv.s3().get_object(Bucket=b, Key=k)["Body"].read())
    else:
        reader = ShardReader(FileSource(args.shard))
    out = sys.stdout
    try:
        for bucket, keys in reader.groups(args.start, args.stop):
            if args.keys_only:
                out.write("".join(k + "\n" for k in keys))
            else:
                prefix = f"s3://{bucket}/"
                out.write("".join(prefix + k + "\n" for k in keys))
        out.flush()
    except BrokenPipeError:  # `sluice shard cat ... | head`: the reader has what it wanted
        silence_stdout()
    return EXIT_OK
