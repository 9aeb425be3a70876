"""The text tower `sluice model export` writes beside a CLIP-style model, read by gpu_worker.models.texttower."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_worker.export import tvcompat

tvcompat.ensure_importable()  # before open_clip imports torchvision

from gpu_worker.errors import ConfigError  # noqa: E402
from gpu_worker.export import export  # noqa: E402
from gpu_worker.models.texttower import SIDECARS, TextSpec, encode_texts, has_text_tower, load_tokenizer  # noqa: E402

TEXTS = ["a photo of a cat", "Zebras & giraffes, 1999!", "  spaces\tand\nnewlines  ", "word " * 40]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[str, object]:
    import open_clip

    root = tmp_path_factory.mktemp("clip")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 12, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (root / "sluice-text-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(root / "sluice-text-clip.json")
    result = export("open_clip:sluice-text-clip", str(root / "m.pt"), pretrained=False)
    return str(root / "m.pt"), result


def test_the_tokenizer_and_tower_match_open_clip(clip):
    import open_clip

    path, result = clip
    spec = TextSpec.read(path + ".text.json")
    assert (spec.context_length, spec.output_dim, spec.inputs) == (12, 16, ("input_ids",))
    assert spec.image_weights_sha256 == result.spec["weights_sha256"] and result.text == spec
    want_ids = open_clip.get_tokenizer("sluice-text-clip")(TEXTS, context_length=12)
    got = [e.ids for e in load_tokenizer(path + ".tokenizer.json", spec).encode_batch(TEXTS)]
    assert got == want_ids.tolist()  # truncated to 12 with <end_of_text> last, as open_clip does
    tower = torch.jit.load(path + ".text.pt")
    with torch.no_grad():
        raw = tower(want_ids)
    vectors = encode_texts(path, TEXTS)
    assert np.abs(vectors - torch.nn.functional.normalize(raw, dim=1).numpy()).max() < 1e-5
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(len(TEXTS)), abs=1e-5)


def test_the_tower_file_is_a_text_artifact_for_text_runs(clip):
    """model.uri = <m>.text.pt in a text run: chunks framed <start_of_text> ... <end_of_text>, as open_clip does."""
    import open_clip

    from gpu_worker.config import WorkerConfig
    from gpu_worker.kinds.base import Loading
    from gpu_worker.kinds.textmodel import load_text
    from sluice.contracts.plan import PlannedModel
    from sluice.contracts.sections import ContentSpec, ModelSpec

    path = clip[0] + ".text.pt"
    planned = PlannedModel.of(ModelSpec(uri=path))
    how = Loading(path, planned, ContentSpec(kind="text"), "cpu", 4, WorkerConfig())
    embedder = load_text(how)
    assert (embedder.window.chunk_tokens, embedder.output_dim) == (10, 16)  # 12 less <start>, <end>
    text = "a photo of a cat"
    [part] = embedder.split(text.encode())
    got = embedder.embed([part.payload])
    ids = open_clip.get_tokenizer("sluice-text-clip")([text], context_length=12)
    want = torch.nn.functional.normalize(torch.jit.load(path)(ids), dim=1).detach().numpy()
    assert np.abs(got - want).max() < 1e-5 and (part.start, part.end) == (0.0, len(text))
    long = embedder.split(("word " * 40).encode())
    assert [p.part for p in long] == list(range(len(long))) and len(long) >= 4


def test_other_models_get_none_and_say_so(tmp_path):
    result = export("torchvision:mobilenet_v3_small", str(tmp_path / "m.pt"), pretrained=False, image_size=32)
    assert result.text is None and not has_text_tower(str(tmp_path / "m.pt"))
    assert not any(Path(str(tmp_path / "m.pt") + s).exists() for s in SIDECARS)
    with pytest.raises(ConfigError, match="export a CLIP-style model"):
        encode_texts(str(tmp_path / "m.pt"), ["x"])
