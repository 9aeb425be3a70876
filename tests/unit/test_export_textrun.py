"""`sluice model export hf:<text encoder>`: one TorchScript text artifact, tokenizer inside, read by text runs."""

from __future__ import annotations

import json
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
from sluice.contracts.plan import PlannedModel  # noqa: E402
from sluice.contracts.sections import ContentSpec, ModelSpec  # noqa: E402

WORDS = ["a", "the", "of", "cat", "photo", "bridge", "golden", "gate", "at", "night", "zebra", "report"]
WORDS += ["section", "results", "quarter", ",", "!", "."]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A sentence-transformers-like folder: a 2-layer BERT config, its WordPiece tokenizer, CLS pooling."""
    import transformers
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    root = tmp_path_factory.mktemp("tiny-bert")
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))  # a BERT tokenizer.json, as a hub folder holds one
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    special = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, mask_token="[MASK]", **special).save_pretrained(
        str(root)
    )
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


def test_the_models_own_files_set_the_window_and_its_tokenizers_padding_changes_nothing(tiny_bert, tmp_path):
    # all-MiniLM-L6-v2's tokenizer.json pads and cuts every text to 128; its sentence_bert_config.json says 256.
    import json
    import shutil

    root = tmp_path / "padded"
    shutil.copytree(tiny_bert, root)
    tok = json.loads((root / "tokenizer.json").read_text())
    tok["padding"] = {"strategy": {"Fixed": 12}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                      "pad_type_id": 0, "pad_token": "[PAD]"}  # fmt: skip
    tok["truncation"] = {"max_length": 12, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    (root / "tokenizer.json").write_text(json.dumps(tok))
    (root / "sentence_bert_config.json").write_text('{"max_seq_length": 24, "do_lower_case": true}')
    out = str(tmp_path / "m.pt")
    spec = export(f"hf:{root}", out, pretrained=False).spec
    assert spec["context_length"] == 24 and spec["lower_case"] is True  # the model's window, not the config's 32
    assert spec["lengths"] == [16, 24]  # padded to the batch's longest: 16 tokens, or the whole window
    embedder = _embedder(out)
    assert embedder.window.chunk_tokens == 22
    long_text = " ".join(["the cat at night"] * 10)  # 40 tokens: more than the tokenizer's own 12
    parts = embedder.split(long_text.upper().encode())  # lower-cased first, as do_lower_case says
    assert len(parts[0].payload.ids) == 22 and 1 not in parts[0].payload.ids  # no [UNK]: the words were found
    short = embedder.split(b"a cat")[0].payload
    both = embedder.embed([short, parts[0].payload])  # one batch of unlike lengths
    alone = embedder.embed([short])  # padded to 16, not 24
    assert np.abs(both[0] - alone[0]).max() < 1e-5


def test_orientation_is_refused_for_a_text_encoder(tiny_bert, tmp_path):
    with pytest.raises(ExportError, match="is a text encoder: --orientation is for image models"):
        export(f"hf:{tiny_bert}", str(tmp_path / "bert.pt"), pretrained=False, orientation="exif")
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_local_folders_spec_names_it_by_its_own_name_never_its_path(tiny_bert, artifact, tmp_path):
    from gpu_worker.export.sources import RANDOM_INIT, hf_names

    spec = artifact[1].spec
    assert (spec["name"], spec["version"]) == (f"hf:{tiny_bert.name}", RANDOM_INIT)
    assert str(tiny_bert.parent) not in json.dumps(spec)
    packaged = tmp_path / "site-packages" / "gt_minilm" / "model"  # a package's folder: its generic name and parent
    packaged.mkdir(parents=True)
    (packaged / "model.safetensors").write_bytes(b"weights")
    name, version = hf_names(str(packaged), None, True)
    assert name == "hf:gt_minilm/model" and version.startswith("sha256:") and len(version) == 23
    (packaged / "model.safetensors").write_bytes(b"other weights")
    assert hf_names(str(packaged), None, True)[1] != version  # the version follows the weights
    cached = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "c9745ed1"
    cached.mkdir(parents=True)
    assert hf_names(str(cached), None, True) == ("hf:sentence-transformers/all-MiniLM-L6-v2", "c9745ed1")
    assert hf_names("org/model", type("Cfg", (), {"_commit_hash": "abc"})(), True) == ("hf:org/model", "abc")
