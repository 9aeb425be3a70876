"""Small audio models with random weights, saved as Hugging Face folders (no hub here): CLAP and wav2vec2.

`clap_folder(path)` writes a ClapModel (a fusion HTSAT audio tower, a one-layer RoBERTa text
tower), its ClapFeatureExtractor and a byte-level BPE tokenizer trained on a few sentences;
`wav2vec2_folder(path)` a two-layer Wav2Vec2Model and its feature extractor (do_normalize).
Both load with from_pretrained like a downloaded model, so the export reads them as it reads a hub id.
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = (
    "a dog barking in the rain",
    "a piano melody, slow and quiet",
    "speech in a busy street with cars",
    "birds singing at dawn",
)


def clap_folder(path: Path, fusion: bool = True) -> Path:
    """A tiny ClapModel folder: config, random weights (seeded), feature extractor, tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizerFast

    audio = {
        "patch_embeds_hidden_size": 16,
        "hidden_size": 128,
        "depths": [1, 1, 1, 1],
        "num_attention_heads": [1, 1, 2, 2],
        "projection_dim": 32,
        "enable_fusion": fusion,
        "fusion_type": "aff_2d" if fusion else None,
    }
    text = {
        "vocab_size": 400,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 37,
        "max_position_embeddings": 66,
        "projection_dim": 32,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = ClapModel(ClapConfig(audio_config=audio, text_config=text, projection_dim=32)).eval()
    model.save_pretrained(path)
    ClapFeatureExtractor(truncation="fusion" if fusion else "rand_trunc").save_pretrained(path)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(WORDS) * 4, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=64)
    tok.save_pretrained(path)
    return path


def wav2vec2_folder(path: Path) -> Path:
    """A tiny Wav2Vec2Model folder (random weights, seeded) and its feature extractor."""
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    cfg = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(16, 16, 16, 16, 16, 16, 16),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        Wav2Vec2Model(cfg).eval().save_pretrained(path)
    Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=False).save_pretrained(path)
    return path
