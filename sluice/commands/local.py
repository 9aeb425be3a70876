"""`sluice local run`: a whole run on this machine against moto (sluice.local)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from sluice.commands.common import EXIT_USAGE, Invocation, fraction, int_from

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice local run`: its arguments and handler."""
    local = sub.add_parser("local", help="run Sluice on this machine against moto").add_subparsers(
        dest="local_cmd", required=True, metavar="run"
    )
    run = local.add_parser("run", help="a whole run on this machine: a local moto server, the real handlers, workers")
    _add_input(run)
    _add_layout(run)
    _add_models_and_output(run)
    _add_content(run)
    run.set_defaults(func=cmd_local_run)


def _add_content(run: argparse.ArgumentParser) -> None:
    """How a text is chunked, a video sampled and audio windowed (the manifest's input fields; docs/kinds.md)."""
    run.add_argument(
        "--chunk-tokens",
        type=int_from(8),
        metavar="N",
        help="text: tokens a chunk holds (input.chunk_tokens; default: the model's own window)",
    )
    run.add_argument(
        "--overlap-tokens",
        type=int_from(0),
        metavar="N",
        help="text: tokens a chunk repeats from the one before (input.overlap_tokens; default: the model's)",
    )
    run.add_argument(
        "--frames-per-second",
        type=float,
        metavar="F",
        help="video: frames sampled a second (input.frames_per_second; default 1)",
    )
    run.add_argument(
        "--frames-per-video",
        type=int_from(1),
        metavar="N",
        help="video: frames sampled evenly over each whole video (input.frames_per_video)",
    )
    run.add_argument(
        "--window-s",
        type=float,
        metavar="S",
        help="audio: seconds a window holds (input.window_s; default: the model's, CLAP 10)",
    )
    run.add_argument(
        "--hop-s", type=float, metavar="S", help="audio: seconds between windows' starts (input.hop_s; default: window)"
    )


def _add_input(run: argparse.ArgumentParser) -> None:
    """What the run reads: one of the demo or folder uploads, a manifest, an earlier run to build on."""
    src = run.add_mutually_exclusive_group()
    src.add_argument("--demo", type=int_from(1), metavar="N", help="generate N varied demo JPEGs (default 200)")
    from sluice.local.manifest import KIND_SUFFIXES

    named = {kind: " ".join(suffixes) for kind, suffixes in KIND_SUFFIXES.items()}
    src.add_argument(
        "--images", metavar="DIR", help=f"upload the files in DIR (subfolders kept as key prefixes): {named['image']}"
    )
    src.add_argument("--texts", metavar="DIR", help=f"like --images, for a text run: {named['text']} (docs/kinds.md)")
    src.add_argument("--demo-texts", type=int_from(1), metavar="N", help="generate N demo texts, some long")
    src.add_argument("--videos", metavar="DIR", help=f"like --images, for a video run: {named['video']}")
    src.add_argument("--demo-videos", type=int_from(1), metavar="N", help="generate N short demo MP4s")
    src.add_argument(
        "--audio", metavar="DIR", help=f"like --images, for an audio run (needs --model): {named['audio']}"
    )
    run.add_argument(
        "--suffixes",
        metavar=".EXT,...",
        help="with a folder flag (--images, --texts, ...): upload files with these suffixes too (.py,.ipynb)",
    )
    run.add_argument(
        "--follow-links",
        action="store_true",
        help="with a folder flag: read symlinks that lead out of the folder too (by default they are named and "
        "skipped; a link to a folder that holds it never is read)",
    )
    run.add_argument(
        "--manifest",
        metavar="FILE",
        help="run this manifest; the other flags are applied on top of it (or refused). Without input it reads "
        "the --images/--demo upload",
    )
    run.add_argument(
        "--since-run",
        metavar="RUN_ID",
        help="an incremental run on an earlier run of the emulator (--endpoint-url): embed only what is new or "
        "changed in its input (--images DIR: uploaded over it), with its models (docs/incremental.md)",
    )


def _add_layout(run: argparse.ArgumentParser) -> None:
    """How the run is laid out: mode, shards, nodes, ranks, slots, the failure threshold, the prepare stage."""
    run.add_argument("--mode", choices=["array", "multinode"], default=None, help="default: array")
    run.add_argument("--shards", type=int_from(1), metavar="N", help="array children (default: min(4, cores))")
    run.add_argument("--nodes", type=int_from(1), metavar="N", help="multi-node parallel nodes (default 2)")
    run.add_argument("--ranks", type=int_from(1), default=1, metavar="N", help="CPU ranks per worker (default 1)")
    run.add_argument(
        "--slots", type=int_from(0), default=0, metavar="N", help="workers running at once (default 0: cores)"
    )
    run.add_argument(
        "--max-failed-fraction",
        type=fraction,
        metavar="F",
        help="a shard fails when more than this fraction of its keys fail for their data (default 0.05)",
    )
    run.add_argument(
        "--prepare-workers",
        type=int_from(1),
        metavar="N",
        help="shard the input with the prepare job's N workers, whatever its size (default: SLUICE_PREPARE_OVER_KEYS "
        "decides)",
    )


def _add_models_and_output(run: argparse.ArgumentParser) -> None:
    """The models, where the output goes, and the emulator, Prometheus and decode options."""
    run.add_argument(
        "--image-size",
        type=int_from(8),
        metavar="N",
        help="model input side (default 128; an exported model's spec gives its own)",
    )
    run.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]URI",
        help="embed with this model (a `sluice model export` file, a local path or s3:// URI, or builtin:NAME); "
        "repeat for several models in one pass, NAME= naming each one's output (default builtin:reference-cnn)",
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        default="sluice-output",
        help="write the run's Parquet output, failures and worker logs to DIR/<run id>/ (default ./sluice-output); "
        "nothing already in DIR is touched",
    )
    run.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object on stdout (progress stays on stderr)"
    )
    run.add_argument("--keep", action="store_true", help="leave the moto server running and print its endpoint")
    run.add_argument("--endpoint-url", metavar="URL", help="use this running AWS emulator (moto server, LocalStack)")
    run.add_argument("--no-prometheus", action="store_true", help="do not start a local Prometheus for metrics")
    run.add_argument(
        "--decode",
        choices=("auto", "cpu", "gpu"),
        help="job.decode: who decodes JPEGs (gpu: nvJPEG, refused without CUDA; docs/decode.md)",
    )
    run.add_argument("--pid-file", help=argparse.SUPPRESS)


def cmd_local_run(args: argparse.Namespace, inv: Invocation) -> int:
    """Run Sluice locally on moto (the embedded default)."""
    from sluice.local.run import run_local

    if args.decode == "gpu":
        from gpu_worker.door import cuda_problem  # torch stays in gpu_worker

        if why := cuda_problem():  # refused before anything starts
            print(
                f"sluice: --decode gpu needs a CUDA GPU with nvJPEG and {why}: use --decode cpu or auto",
                file=sys.stderr,
            )
            return EXIT_USAGE
    return run_local(args)
