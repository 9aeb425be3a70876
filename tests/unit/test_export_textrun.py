"""`sluice model export hf:<text encoder>`: one TorchScript text artifact, tokenizer inside, read by text runs."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_worker.export import tvcompat

tvcompat.ensure_importable()

from gpu_worker.config import WorkerConfig  # noqa: E402
from gpu_worker.errors import ConfigError  # noqa: E402
from gpu_worker.export import ExportError, export  # noqa: E402
from gpu_worker.kinds.base import Loading  # noqa: E402
from gpu_worker.kinds.textmodel import load_text  # noqa: E402
from sluice.models import ContentSpec, ModelSpec, PlannedModel  # noqa: E402

WORDS = ["a", "the", "of", "cat", "photo", "bridge", "golden", "gate", "at", "night", "zebra", "report"]
WORDS += ["section", "results", "quarter", ",", "!", "."]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A sentence-transformers-like folder: a 2-layer BERT config, its WordPiece tokenizer, CLS pooling."""
    import transformers

    root = tmp_path_factory.mktemp("tiny-bert")
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(str(root))
    cfg = transformers.BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    cfg.save_pretrained(str(root))
    (root / "modules.json").write_text("[]")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}'
    )
    return root


@pytest.fixture(scope="module")
def artifact(tiny_bert, tmp_path_factory):
    """The tiny encoder exported once: (file, ExportResult)."""
    out = str(tmp_path_factory.mktemp("bert-out") / "bert.pt")
    return out, export(f"hf:{tiny_bert}", out, pretrained=False)


def _embedder(path: str, **content):
    how = Loading(
        path, PlannedModel.of(ModelSpec(uri=path)), ContentSpec(kind="text", **content), "cpu", 8, WorkerConfig()
    )
    return load_text(how)


def test_a_text_encoder_exports_to_one_file_a_text_run_reads(tiny_bert, artifact):
    out, result = artifact
    spec = result.spec
    assert spec["kinds"] == ["text"] and spec["pooling"] == "cls" and spec["context_length"] == 32
    assert (spec["prefix_ids"], spec["suffix_ids"]) == ([2], [3]) and result.max_abs_diff < 1e-3
    with zipfile.ZipFile(out) as zf:  # the worker needs nothing beside the file
        assert {n.rsplit("/", 1)[-1] for n in zf.namelist() if "/extra/" in n} == {"sluice.json", "tokenizer.json"}
    Path(out + ".json").rename(out + ".kept")  # the spec inside the file is enough
    embedder = _embedder(out)
    assert embedder.window.chunk_tokens == 30  # 32 less [CLS] and [SEP]
    text = " ".join(["the cat at night"] * 30)  # 120 tokens: several chunks
    parts = embedder.split(text.encode())
    assert [p.part for p in parts] == list(range(len(parts))) and len(parts) >= 4
    assert parts[0].start == 0 and parts[-1].end == len(text)
    emb = embedder.embed([p.payload for p in parts])
    assert emb.shape == (len(parts), 32) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # The first chunk is [CLS] + 30 tokens + [SEP]: the eager model on those ids gives the same vector.
    import transformers

    model = transformers.BertModel(transformers.AutoConfig.from_pretrained(str(tiny_bert))).eval()
    model.load_state_dict({k[len("model.") :]: v for k, v in torch.jit.load(out).state_dict().items()}, strict=False)
    ids = torch.tensor([[2, *parts[0].payload.ids, 3]])
    with torch.no_grad():
        want = torch.nn.functional.normalize(model(input_ids=ids).last_hidden_state[:, 0], dim=1).numpy()
    assert np.abs(emb[0] - want[0]).max() < 1e-4


def test_a_window_over_the_context_or_an_image_model_is_refused(tiny_bert, artifact, tmp_path):
    with pytest.raises(ConfigError, match="chunk_tokens 64 is over the 30 tokens its context holds"):
        _embedder(artifact[0], chunk_tokens=64)
    with pytest.raises(ExportError, match="text artifacts are TorchScript"):
        export(f"hf:{tiny_bert}", str(tmp_path / "bert.pt2"), pretrained=False)
    image = str(tmp_path / "cnn.pt")  # an image model's file: its spec names no text
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 4)), image, _extra_files={"sluice.json": '{"image_size": 32}'})
    with pytest.raises(ConfigError, match="embeds image, not text"):
        _embedder(image)
