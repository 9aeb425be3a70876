"""`sluice model export SPEC --out FILE`: a model library's model -> a Sluice model file and spec (docs/models.md)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from sluice.commands.common import EXIT_FAIL, EXIT_OK, Invocation, int_from

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice model export`: its arguments and handler."""
    model = sub.add_parser("model", help="model artifacts for the worker").add_subparsers(
        dest="model_cmd", required=True, metavar="export"
    )
    mexp = model.add_parser(
        "export", help="torchvision / timm / open_clip / hf model -> TorchScript or .pt2 file + spec (docs/models.md)"
    )
    mexp.add_argument(
        "spec",
        metavar="SPEC",
        help="torchvision:NAME, timm:NAME, open_clip:MODEL/TAG or hf:REPO (e.g. timm:vit_small_patch16_224)",
    )
    mexp.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="file path or s3:// URI (*.pt2 for torch.export); ending in /: a folder",
    )
    weights = mexp.add_mutually_exclusive_group()
    weights.add_argument(
        "--no-pretrained", action="store_true", help="random weights, same architecture (tests; needs no internet)"
    )
    weights.add_argument(
        "--weights",
        metavar="FILE",
        help="a local state dict (.pth, .pt, .safetensors) for the architecture SPEC names (not hf:)",
    )
    mexp.add_argument("--format", choices=["torchscript", "pt2"], help="default: pt2 if --out ends in .pt2")
    mexp.add_argument("--image-size", type=int_from(8), metavar="N", help="input side (default: the weights' own)")
    mexp.add_argument(
        "--orientation",
        choices=["stored", "exif"],
        help="stored (default): images as their pixels are stored, as every model library reads them; exif: "
        "photos turned upright by their EXIF orientation tag before the library's pipeline (rotated photos then "
        "no longer get the library's own vectors); for models whose export records their library's pipeline",
    )
    mexp.set_defaults(func=cmd_model_export)


def cmd_model_export(args: argparse.Namespace, inv: Invocation) -> int:
    """A torchvision / timm / open_clip / Hugging Face model -> a Sluice model file + spec (local or s3://)."""
    from gpu_worker.door import ExportError, exporter

    try:  # torch and the model libraries: the `export` extra, imported only for this command
        export = exporter()
    except ImportError as exc:
        print(f"sluice: error: {exc}; install the export extra: pip install 'sluice[export]'", file=sys.stderr)
        return EXIT_FAIL
    try:
        result = export(
            args.spec,
            args.out,
            pretrained=not args.no_pretrained,
            fmt=args.format,
            image_size=args.image_size,
            weights=args.weights,
            orientation=args.orientation,
        )
    except ExportError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:
        if args.no_pretrained or args.weights or not _download_failed(exc):
            raise
        print(
            f"sluice: error: {args.spec}: its pretrained weights could not be downloaded ({type(exc).__name__}: "
            f"{str(exc)[:200]}): export on a machine that reaches the internet (workers never download), or pass "
            "--no-pretrained for random weights of the same architecture (a test, not real embeddings)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    _print_export(result)
    if args.weights:
        print(f"weights: {args.weights}, loaded into the {args.spec} architecture (the spec's version names it)")
    return EXIT_OK


def _print_audio(result: Any, use: str) -> None:
    """An audio artifact: its input, its features and how close it came to the library's own pipeline."""
    spec, ref = result.spec, result.spec["reference"]
    print(
        f"{result.uri} (audio, {spec['format']}): {spec['name']} {spec['version']}, {spec['window_s']:g} s windows "
        f"at {spec['sample_rate']} Hz -> {spec['output_dim']}-d; features inside: {spec['features']}"
        f"\nchecked against {ref['library']}'s feature extractor and model on the same windows: features max "
        f"|difference| {ref['features_max_abs_diff']:.2e}, lowest cosine {ref['min_cosine']:.6f}"
        f'\nspec: {result.uri}.json; {use}, with "input": {{..., "kind": "audio"}}'
    )
    if spec["pad"] == "repeatpad":  # CLAP: its text tower beside
        print(f"text tower: {result.uri}.text.pt (sluice search INDEX --text 'WORDS' on an audio index)")


def _print_export(result: Any) -> None:
    """What was exported (file, format, model, sizes, weights, precision, text tower) and how to use it."""
    spec = result.spec
    use = (
        f"set the manifest's model.uri to {result.uri}"
        if result.uri.startswith("s3://")
        else "copy both files to S3 and set the manifest's model.uri to the file's s3:// URI (docs/models.md)"
    )
    if "audio" in spec.get("kinds", ()):  # an audio artifact: for input.kind audio (docs/audio.md)
        _print_audio(result, use)
        return
    if "text" in spec.get("kinds", ()):  # a text artifact: for input.kind text (docs/kinds.md)
        print(
            f"{result.uri} (text, {spec['format']}): {spec['name']} {spec['version']}, {spec['context_length']} "
            f"tokens -> {spec['output_dim']}-d, tokenizer inside, max |exported - eager| {result.max_abs_diff:.2e}"
            f'\nspec: {result.uri}.json; {use}, with "input": {{..., "kind": "text"}}'
        )
        room = spec["context_length"] - len(spec.get("prefix_ids", ())) - len(spec.get("suffix_ids", ()))
        lengths = spec.get("lengths") or [spec["context_length"]]
        print(
            f"window: {spec['context_length']} tokens ({room} of text a chunk, the model's own; input.chunk_tokens "
            f"sets another), padded to its batch's longest of {_lengths_text(lengths)}; pooling "
            f"{spec.get('pooling', 'mean')}{', lower case' if spec.get('lower_case') else ''}"
        )
        ref = spec.get("reference")
        if ref:
            print(f"checked against {ref['library']} encode: max difference {ref['max_abs_diff']:.2e}")
        return
    print(
        f"{result.uri} ({spec['format']}): {spec['name']} {spec['version']}, {spec['image_size']} px -> "
        f"{spec['output_dim']}-d, weights sha256 {spec['weights_sha256'][:16]}..., max |exported - eager| "
        f"{result.max_abs_diff:.2e}\nspec: {result.uri}.json; {use}"
    )
    if "precision" in spec:  # bf16 autocast on GPU, or fp32 when it changed the embeddings
        low = f"bf16 vs fp32: lowest cosine {spec['bf16_min_cosine']:.5f} on sample inputs"
        kept = "bf16 autocast on GPU" if spec["precision"] == "bf16" else "fp32 kept (bf16 is below 0.999)"
        print(f"precision: {kept}; {low}")
    prep = spec.get("preprocess")
    if prep:  # the library's eval pipeline, which the worker applies exactly (docs/models.md, "Preprocessing")
        how = "shorter side to" if prep.get("resize_mode", "shortest") == "shortest" else "squashed to"
        print(
            f"preprocessing, as {prep['library']}: {how} {prep['resize']} ({prep['interpolation']}), centre crop "
            f"{spec['image_size']}, alpha {prep['alpha']}, orientation {prep['orientation']}"
        )
    else:
        print("preprocessing: legacy (no pipeline recorded: the worker's own, not the library's; docs/models.md)")
    if result.text is not None:  # a CLIP-style model: `sluice search --text` (docs/models.md, "Text tower")
        print(f"text tower: {result.uri}.text.pt, .text.json, .tokenizer.json ({result.text.output_dim}-d)")


def _download_failed(exc: BaseException) -> bool:
    """Whether an export failed downloading weights: urllib (torchvision) or huggingface_hub (timm, open_clip, hf)."""
    import socket
    import urllib.error

    names = {t.__name__ for t in type(exc).__mro__}
    offline = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout"}
    return isinstance(exc, urllib.error.URLError | ConnectionError | socket.gaierror | TimeoutError) or bool(
        names & offline
    )


def _lengths_text(lengths: list[int]) -> str:
    """16/32/64, or 16, 32, ... 256 (16 lengths) when there are many."""
    if len(lengths) <= 6:
        return "/".join(map(str, lengths))
    return f"{lengths[0]}, {lengths[1]}, ... {lengths[-1]} ({len(lengths)} lengths)"
