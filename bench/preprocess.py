"""Exact image preprocessing: what it costs against the legacy path, and whether a reduced decode would stay exact.

    .venv/bin/python bench/preprocess.py                         # all three parts, 5 rounds
    .venv/bin/python bench/preprocess.py --parts speed,reduced   # no worker runs
    .venv/bin/python bench/preprocess.py --parts worker --worker-images 240 --rounds 3

The exact path is a timm-like spec (shorter side to 256, bicubic, centre crop 224, pixels as
stored: what `sluice model export timm:...` records); the legacy path is legacy(224) (JPEG draft
mode, one boxed bilinear resize of the centre square). Image sets, by size class and detail:

    photos        tests/photos.py's 12 files as they are (JPEG and PNG, 200-3000 px)
    large         6 JPEGs of 3000-4000 px: the same photographs enlarged (Lanczos; quality 90)
    large-mosaic  3 JPEGs of 3600-4000 px tiled with the photographs at about their own scale
    huge          3 JPEGs of 5000-8000 px, enlarged
    huge-mosaic   2 JPEGs of 6000-8000 px, tiled

An enlarged photograph is smooth (little detail per pixel: the easy case for a reduced decode,
and a little faster to decode); a mosaic is as detailed per pixel as a downscaled photograph
(the hard case). A camera's photograph lies between.

speed    decode + preprocess images/s on one thread, per set: exact (gpu_worker.decode.image),
         legacy, the exact path's full decode alone (no resize: where its time goes), and the
         alternatives below. Each round times every variant on every set (the order rotates
         per round) so a drifting VM hits all alike; medians of per-round rates and of
         per-round ratios to exact.
reduced  each alternative's output against the exact path's, per set: max and mean abs
         difference in levels of 255 over the images the alternative changed (the others come
         out as the exact path's), and how many of those stay within 1 level:
           gap K      Image.resize(..., reducing_gap=K)
           draft K    JPEG draft mode: the DCT-scaled image at least K times the resize target
           reduce K   Image.reduce by the largest whole factor that keeps K times the resize target
           crop box   resize only the crop's region (Image.resize's box) straight to the crop
         (draft and reduce resize from the box the stored image maps to, as reducing_gap does)
worker   one CPU worker run (`python -m gpu_worker`, bench/worker.py's moto S3) over the photos set
         repeated, with a timm efficientnet_lite0 export (random weights) whose spec has
         `preprocess` (exact), against the same file with `preprocess` removed from its sidecar
         spec (legacy); runs alternate, images/s of the worker's pipeline and of the whole node.

Prints markdown tables; no assertions (figures go in docs/performance.md and docs/decode.md).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image, ImageOps  # noqa: E402
from PIL.JpegImagePlugin import JpegImageFile  # noqa: E402

from gpu_worker.config import MAX_IMAGE_PIXELS  # noqa: E402
from gpu_worker.decode.image import decode_image  # noqa: E402
from gpu_worker.decode.preprocess import INTERPOLATIONS, Preprocess, crop_box, legacy, resized  # noqa: E402
from tests.photos import SKIMAGE, SKLEARN, photos, source, variant  # noqa: E402

EXACT = Preprocess(size=224, resize=256, interpolation="bicubic", orientation="stored")
# (photograph, long side, portrait): enlarged JPEGs, landscape and portrait.
LARGE = (
    ("china.jpg", 4000, False),
    ("flower.jpg", 3000, True),
    ("motorcycle_left.png", 3600, False),
    ("retina.jpg", 3200, True),
    ("chelsea.png", 3500, False),
    ("rocket.jpg", 3000, True),
)
HUGE = (("china.jpg", 8000, False), ("astronaut.png", 6000, False), ("flower.jpg", 5000, True))
# (width, height, first tile): mosaics of 400 x 300 tiles.
LARGE_MOSAICS = ((4000, 3000, 0), (3000, 4000, 3), (3600, 2400, 5))
HUGE_MOSAICS = ((8000, 6000, 1), (6000, 4000, 4))
TILE = (400, 300)
# (name, how, k): the cheaper alternatives to the exact path (see the docstring).
ALTERNATIVES = (
    ("gap 2", "gap", 2.0),
    ("gap 3", "gap", 3.0),
    ("draft 2", "draft", 2.0),
    ("draft 4", "draft", 4.0),
    ("draft 6", "draft", 6.0),
    ("draft 8", "draft", 8.0),
    ("reduce 2", "reduce", 2.0),
    ("reduce 4", "reduce", 4.0),
    ("crop box", "box", 0.0),
)


@functools.cache
def tiles() -> list[Image.Image]:
    """Every photograph cropped and scaled to one TILE (mostly down: each keeps its own detail)."""
    return [ImageOps.fit(source(n).convert("RGB"), TILE, Image.Resampling.LANCZOS) for n in (*SKIMAGE, *SKLEARN)]


def mosaic(width: int, height: int, first: int) -> bytes:
    """A quality-90 JPEG of width x height tiled with the photographs, row after row, from tile `first`."""
    canvas, pics = Image.new("RGB", (width, height)), tiles()
    for i, y in enumerate(range(0, height, TILE[1])):
        for j, x in enumerate(range(0, width, TILE[0])):
            canvas.paste(pics[(first + 3 * i + j) % len(pics)], (x, y))
    buf = io.BytesIO()
    canvas.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def image_sets() -> dict[str, list[bytes]]:
    """{set name: files}: the photographs as they are, and enlarged or tiled to 3000-4000 px and 5000-8000 px."""
    return {
        "photos": list(photos().values()),
        "large": [variant(name, side, portrait, "JPEG") for name, side, portrait in LARGE],
        "large-mosaic": [mosaic(*m) for m in LARGE_MOSAICS],
        "huge": [variant(name, side, portrait, "JPEG") for name, side, portrait in HUGE],
        "huge-mosaic": [mosaic(*m) for m in HUGE_MOSAICS],
    }


def alternative(data: bytes, prep: Preprocess, how: str, k: float) -> tuple[np.ndarray, bool]:
    """(the exact pipeline's output with one shortcut `how` at `k`, whether the shortcut changed anything).

    The output geometry is the exact path's (resize target and crop from the stored size; a
    reduced image is resized from the box the stored image maps to), so the arrays compare
    pixel for pixel; an image the shortcut leaves alone comes out as the exact path's.
    """
    im: Image.Image = Image.open(io.BytesIO(data))
    w, h = im.size
    nw, nh = resized(w, h, prep)
    if how == "draft" and isinstance(im, JpegImageFile):
        im.draft("RGB", (int(k * nw), int(k * nh)))  # Pillow picks the smallest 1/2, 1/4, 1/8 scale that covers it
    im = im.convert("RGB")
    if how == "reduce" and int(min(w / nw, h / nh) / k) >= 2:
        im = im.reduce(int(min(w / nw, h / nh) / k))
    scale = round(w / im.width)  # 1, or the draft's or reduce's whole factor (the reduced side is rounded up)
    applied = scale > 1
    resample, crop = INTERPOLATIONS[prep.interpolation], crop_box(nw, nh, prep.size, prep.crop_offset)
    if (nw, nh) == (w, h):  # the exact path only crops
        return np.asarray(im.crop(crop)), applied
    if how == "box":  # resize only the crop's region, straight to the crop
        sx, sy = w / nw, h / nh
        region = (crop[0] * sx, crop[1] * sy, crop[2] * sx, crop[3] * sy)
        return np.asarray(im.resize((prep.size, prep.size), resample, box=region)), True
    gap = k if how == "gap" else None
    if gap is not None:  # Pillow's rule: it reduces by int(side ratio / gap) per axis when either is >= 2
        applied = int(w / nw / gap) >= 2 or int(h / nh / gap) >= 2
    im = im.resize((nw, nh), resample, box=(0, 0, w / scale, h / scale), reducing_gap=gap)
    return np.asarray(im.crop(crop)), applied


def variants() -> dict[str, Callable[[bytes], object]]:
    """{name: bytes -> array}: exact, legacy, the exact path's decode alone, then the alternatives."""
    out: dict[str, Callable[[bytes], object]] = {
        "exact": lambda d: decode_image(d, EXACT, MAX_IMAGE_PIXELS),
        "legacy": lambda d: decode_image(d, legacy(EXACT.size), MAX_IMAGE_PIXELS),
        "full decode only": lambda d: Image.open(io.BytesIO(d)).convert("RGB"),  # the exact path's share: no resize
    }

    def shortcut(how: str, k: float) -> Callable[[bytes], object]:
        return lambda d: alternative(d, EXACT, how, k)

    for name, how, k in ALTERNATIVES:
        out[name] = shortcut(how, k)
    return out


def rate(fn: Callable[[bytes], object], images: list[bytes], min_s: float) -> float:
    """Images/s of `fn` over `images`, whole passes until at least `min_s` seconds."""
    done, t0 = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - t0 < min_s:
        for d in images:
            fn(d)
        done += len(images)
    return done / (time.perf_counter() - t0)


def bench_speed(sets: dict[str, list[bytes]], rounds: int, min_s: float) -> dict[str, dict[str, list[float]]]:
    """{set: {variant: per-round images/s}}; each round rotates the variants' order."""
    fns = variants()
    names = list(fns)
    out: dict[str, dict[str, list[float]]] = {s: {n: [] for n in names} for s in sets}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            for s, images in sets.items():
                out[s][name].append(rate(fns[name], images, min_s))
        print(
            f"  round {r + 1}: exact/legacy "
            + ", ".join(f"{s} {v['exact'][-1] / v['legacy'][-1]:.3f}" for s, v in out.items()),
            flush=True,
        )
    return out


def report_speed(speed: dict[str, dict[str, list[float]]]) -> None:
    """Images/s per variant and set (medians of rounds), with the median per-round ratio to exact; then exact/legacy."""
    sets = list(speed)
    print("\nimages/s on one thread (x exact: median of the per-round ratios)")
    print("| variant | " + " | ".join(sets) + " |\n|---|" + "---:|" * len(sets))
    for n in speed[sets[0]]:
        cells = []
        for s in sets:
            ratio = statistics.median(v / e for v, e in zip(speed[s][n], speed[s]["exact"]))
            cells.append(f"{statistics.median(speed[s][n]):.1f} (x{ratio:.2f})")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\n| set | exact/legacy (median of rounds) | per round |\n|---|---:|---|")
    for s in sets:
        per = [e / g for e, g in zip(speed[s]["exact"], speed[s]["legacy"])]
        print(f"| {s} | **{statistics.median(per):.3f}** | {', '.join(f'{x:.3f}' for x in per)} |")


def sizes(images: list[bytes]) -> str:
    """'200-3000 px': the range of the long sides."""
    longs = [max(Image.open(io.BytesIO(d)).size) for d in images]
    return f"{min(longs)}-{max(longs)} px"


def report_reduced(sets: dict[str, list[bytes]]) -> None:
    """Per alternative and set: max / mean abs difference to the exact path over the images it changed."""
    exact = {s: [decode_image(d, EXACT, MAX_IMAGE_PIXELS).astype(np.int16) for d in imgs] for s, imgs in sets.items()}
    print("\nmax / mean abs difference to the exact path, levels of 255, over the images each changed (changed of all)")
    print(
        "| alternative | "
        + " | ".join(f"{s} ({sizes(v)})" for s, v in sets.items())
        + " | changed images within 1 level |"
    )
    print("|---|" + "---:|" * (len(sets) + 1))
    for name, how, k in ALTERNATIVES:
        cells, within, changed = [], 0, 0
        for s, images in sets.items():
            diffs = []
            for d, ref in zip(images, exact[s]):
                arr, applied = alternative(d, EXACT, how, k)
                if applied:
                    diffs.append(np.abs(arr.astype(np.int16) - ref))
            within += sum(int(x.max()) <= 1 for x in diffs)
            changed += len(diffs)
            if not diffs:
                cells.append(f"- (0 of {len(images)})")
                continue
            mean = float(np.mean([x.mean() for x in diffs]))
            shown = "< 0.001" if 0 < mean < 0.001 else f"{mean:.3f}"
            cells.append(f"{max(int(x.max()) for x in diffs)} / {shown} ({len(diffs)} of {len(images)})")
        print(f"| {name} | " + " | ".join(cells) + f" | {within} of {changed} |")


def model_files(folder: Path, model: str, given: str) -> dict[str, str]:
    """{"exact": an export whose spec has `preprocess`, "legacy": a copy of it whose sidecar spec has none}."""
    exact = Path(given) if given else folder / "model.pt"
    if not given:
        from sluice.cli import main as sluice

        if sluice(["model", "export", model, "--no-pretrained", "--out", str(exact)]) != 0:
            raise SystemExit(f"sluice model export {model} failed")
    spec = json.loads(Path(f"{exact}.json").read_text())
    if spec.pop("preprocess", None) is None:
        raise SystemExit(f"{exact}.json has no preprocess: export it again with this version")
    old = folder / f"legacy{exact.suffix}"
    shutil.copyfile(exact, old)
    Path(f"{old}.json").write_text(json.dumps(spec))
    return {"exact": str(exact), "legacy": str(old)}


def bench_worker(files: dict[str, str], images: list[bytes], args: argparse.Namespace) -> dict[str, list[float]]:
    """{"exact"|"legacy" + " pipeline"|" node": per-round images/s}: worker runs on `images` repeated, alternating."""
    from bench.worker import BUCKET, CONTROL, bench_pipeline, s3_client, start_s3

    server, env = start_s3(args.latency_ms)
    os.environ.update(env)
    out: dict[str, list[float]] = {}
    try:
        s3 = s3_client()
        s3.create_bucket(Bucket=BUCKET)
        s3.create_bucket(Bucket=CONTROL)
        keys = [f"photos/{i:04d}" for i in range(args.worker_images)]
        for i, key in enumerate(keys):
            s3.put_object(Bucket=BUCKET, Key=key, Body=images[i % len(images)])
        for r in range(args.rounds):
            for name in ("exact", "legacy") if r % 2 == 0 else ("legacy", "exact"):
                got = bench_pipeline(keys, files[name], EXACT.size, args.batch_size, {})
                out.setdefault(f"{name} pipeline", []).append(got["pipeline"])
                out.setdefault(f"{name} node", []).append(got["node"])
            print(
                f"  round {r + 1}: pipeline exact/legacy {out['exact pipeline'][-1] / out['legacy pipeline'][-1]:.3f}"
            )
    finally:
        server.stop()
    return out


def report_worker(runs: dict[str, list[float]], model: str, n: int) -> None:
    print(f"\nworker: {model}, {n} images (the photos set repeated), CPU")
    print("| run | exact (images/s) | legacy (images/s) | exact/legacy (median of rounds) | per round |")
    print("|---|---:|---:|---:|---|")
    for part, label in (("pipeline", "pipeline (model ready to last chunk)"), ("node", "node (start-up included)")):
        e, g = runs[f"exact {part}"], runs[f"legacy {part}"]
        per = [x / y for x, y in zip(e, g)]
        print(
            f"| {label} | {statistics.median(e):.1f} | {statistics.median(g):.1f} | **{statistics.median(per):.3f}** "
            f"| {', '.join(f'{x:.3f}' for x in per)} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="speed,reduced,worker", help="comma list of speed, reduced, worker")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.5, help="per variant, set and round")
    ap.add_argument("--model", default="timm:efficientnet_lite0", help="exported with --no-pretrained")
    ap.add_argument("--model-file", default="", help="an existing export with `preprocess` in its spec")
    ap.add_argument("--worker-images", type=int, default=240)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="moto S3's sleep per image GET")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    sets = image_sets()
    print(
        f"command: python bench/preprocess.py {' '.join(sys.argv[1:])}".rstrip()
        + f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start, Pillow {Image.__version__}; "
        + "; ".join(f"{s}: {len(v)} files, {sizes(v)}" for s, v in sets.items())
    )
    if "speed" in parts:
        report_speed(bench_speed(sets, args.rounds, args.min_seconds))
    if "reduced" in parts:
        report_reduced(sets)
    if "worker" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            files = model_files(Path(tmp), args.model, args.model_file)
            report_worker(bench_worker(files, sets["photos"], args), args.model_file or args.model, args.worker_images)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
