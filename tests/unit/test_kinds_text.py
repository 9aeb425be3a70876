"""Text objects: what is text, the chunks of a token window, the manifest's kind checks."""

from __future__ import annotations

import codecs
import itertools

import pytest
from pydantic import ValidationError

from gpu_worker.errors import ObjectFailure
from gpu_worker.kinds.text import TextWindow, WordTokenizer, chunks, decode_text, text_chunks
from sluice.contracts.manifest import Manifest


@pytest.mark.parametrize(
    "data",
    [b"hello", codecs.BOM_UTF8 + b"hello", "hello".encode("utf-16"), codecs.BOM_UTF16_BE + "hello".encode("utf-16-be")],
)
def test_utf8_and_utf16_with_a_bom_are_text(data):
    assert decode_text(data) == "hello"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"  \n\t ", "empty"),
        (codecs.BOM_UTF8, "empty"),
        (b"\xfd\x80\x81\xff binary", "not_text"),
        (b"\x00\x00\x00\x01Bud1", "not_text"),
        ("no bom".encode("utf-16-le"), "not_text"),
    ],
)
def test_what_is_not_a_text_fails_with_its_reason(data, reason):
    with pytest.raises(ObjectFailure) as exc:
        decode_text(data)
    assert str(exc.value.reason) == reason


def test_chunks_cover_every_token_with_the_overlap_and_character_offsets():
    text = " ".join(f"w{i}" for i in range(100))
    toks = list(WordTokenizer().tokens(text))
    got = list(chunks(toks, TextWindow(32, 8)))
    assert [c.part for c in got] == list(range(len(got)))
    assert all(len(c.ids) == 32 for c in got[:-1])
    assert got[0].start == 0 and got[-1].end == len(text)
    for a, b in itertools.pairwise(got):
        assert a.ids[-8:].tolist() == b.ids[:8].tolist()  # the overlap
        assert b.start == 0 or text[b.start - 1] == " "  # offsets at token bounds: a chunk starts at a word
        assert a.end == len(text) or text[a.end] == " "  # ... and ends at one
        assert len(text[b.start : a.end].split()) == 8  # the overlap's 8 tokens are 8 words of the text
    assert len({t for c in got for t in range(c.start, c.end)}) == len(text)  # nothing left out


def test_a_short_text_is_one_chunk_and_the_window_must_step():
    (one,) = text_chunks(b"just a few words", WordTokenizer(), TextWindow(256, 32))
    assert (one.part, one.start, one.end) == (0, 0, 16)
    with pytest.raises(Exception, match="overlap_tokens"):
        TextWindow(8, 8).check()


def _manifest(inp: dict, **rest) -> Manifest:
    return Manifest.model_validate({"version": 1, "input": {"keys": ["s3://b/a.txt"], **inp}, **rest})


def test_a_text_run_defaults_to_the_text_builtin_and_images_stay_the_default_kind():
    assert _manifest({"kind": "text"}).models[0].uri == "builtin:reference-text"
    m = _manifest({})
    assert m.input.kind == "image" and m.models[0].uri == "builtin:reference-cnn"


def test_a_model_of_another_kind_is_rejected_naming_both():
    with pytest.raises(ValidationError, match=r"builtin:reference-cnn embeds image or video, but input.kind is 'text'"):
        _manifest({"kind": "text"}, model={"uri": "builtin:reference-cnn"})
    with pytest.raises(
        ValidationError, match=r"model\[1\]: builtin:reference-text embeds text, but input.kind is 'image'"
    ):
        _manifest({}, model=[{"uri": "builtin:reference-cnn-large"}, {"uri": "builtin:reference-text"}])


def test_kind_options_belong_to_their_kind():
    with pytest.raises(ValidationError, match='chunk_tokens is for "kind": "text"'):
        _manifest({"chunk_tokens": 128})
    with pytest.raises(ValidationError, match=r"overlap_tokens .64. must be less than chunk_tokens .64."):
        _manifest({"kind": "text", "chunk_tokens": 64, "overlap_tokens": 64})
    with pytest.raises(ValidationError, match="not both"):
        _manifest({"kind": "video", "frames_per_second": 1.0, "frames_per_video": 8})
    content = _manifest({"kind": "text", "chunk_tokens": 128, "overlap_tokens": 16}).input.content
    assert (content.kind, content.chunk_tokens, content.overlap_tokens) == ("text", 128, 16)


def test_a_model_file_whose_spec_names_other_kinds_is_rejected_at_upload(tmp_path):
    from sluice.errors import Rejection
    from sluice.input.checks import check_manifest
    from sluice.settings import Settings

    settings = Settings.from_values({"job_queue": "q", "local_mode": True})
    text_model, image_model = tmp_path / "minilm.pt", tmp_path / "vit.pt"
    text_model.write_bytes(b"model")
    (tmp_path / "minilm.pt.json").write_text('{"kinds": ["text"], "context_length": 128}')
    image_model.write_bytes(b"model")
    (tmp_path / "vit.pt.json").write_text('{"image_size": 224}')
    check_manifest(_manifest({"kind": "text"}, model={"uri": str(text_model)}), settings, control="c")
    check_manifest(_manifest({"kind": "video"}, model={"uri": str(image_model)}), settings, control="c")
    with pytest.raises(Rejection, match=r"minilm.pt embeds text \(its spec\), but input.kind is 'image'"):
        check_manifest(_manifest({}, model={"uri": str(text_model)}), settings, control="c")
    with pytest.raises(Rejection, match=r"model\[1\].uri: .*vit.pt embeds image or video \(its spec\), but input"):
        check_manifest(
            _manifest({"kind": "text"}, model=[{"uri": str(text_model)}, {"uri": str(image_model)}]),
            settings,
            control="c",
        )
