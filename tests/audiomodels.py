"""Small audio models with random weights, saved as Hugging Face folders (no hub here): CLAP and wav2vec2.

`clap_folder(path)` writes a ClapModel (a fusion HTSAT audio tower, a one-layer RoBERTa text
tower), its ClapFeatureExtractor and a byte-level BPE tokenizer trained on a few sentences; `tiny`
makes it a 5 s window of 32 mel bins up to 4 kHz (a 128 x 128 spectrogram image: a quarter of the
patches of CLAP's own 10 s of 64 bins up to 14 kHz, which the benchmark runs; the test tones are
below 2.5 kHz, so the narrower bank tells them apart better);
`wav2vec2_folder(path)` a two-layer Wav2Vec2Model and its feature extractor (do_normalize);
`whisper_folder(path)` a one-layer WhisperModel (32-d) and its WhisperFeatureExtractor (80 mel bins, 30 s).
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


def clap_folder(path: Path, fusion: bool = True, tiny: bool = False) -> Path:
    """A small ClapModel folder: config, random weights (seeded), feature extractor, tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizerFast

    # HTSAT lays the (frames, mels) log-mel out as a spec x spec image of spec / mels bands: 1001 frames
    # (10 s) of 64 bins in 256, or 501 (5 s) of 32 in 128; its last stage (spec / 32 patches a side) keeps
    # at least spec / mels rows, and its attention window divides every stage's side.
    mels, seconds, spec, fmax = (32, 5, 128, 4000) if tiny else (64, 10, 256, 14_000)
    audio = {
        "patch_embeds_hidden_size": 16,
        "hidden_size": 128,
        "depths": [1, 1, 1, 1],
        "num_attention_heads": [1, 1, 2, 2],
        "projection_dim": 32,
        "enable_fusion": fusion,
        "fusion_type": "aff_2d" if fusion else None,
        "spec_size": spec,
        "num_mel_bins": mels,
        "window_size": 4 if tiny else 8,
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
    truncation = "fusion" if fusion else "rand_trunc"
    ClapFeatureExtractor(
        truncation=truncation, feature_size=mels, max_length_s=seconds, frequency_max=fmax
    ).save_pretrained(path)
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


def whisper_folder(path: Path) -> Path:
    """A tiny WhisperModel folder (random weights, seeded: one encoder and one decoder layer) and its extractor."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel

    cfg = WhisperConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
        max_target_positions=32,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        WhisperModel(cfg).eval().save_pretrained(path)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(path)
    return path
