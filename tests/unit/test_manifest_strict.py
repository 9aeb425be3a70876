"""Strict parsing at the boundary: JSON, lines, bucket names, model and output URIs, inflation limits."""

from __future__ import annotations

import gzip
import json
import logging
import zlib

import pytest

from sluice.aws.s3uri import bad_char, bucket_problem, is_bucket_name
from sluice.contracts.manifest import Manifest
from sluice.contracts.sections import BUILTIN_MODELS
from sluice.errors import Rejection, RetriableError
from sluice.input.checks import check_manifest, guarded, input_error
from sluice.input.inventory_files import csv_keys, inflate
from sluice.input.lines import MAX_LINE_BYTES, LineTooLong, decode_lines
from sluice.input.manifest import ManifestSource, parse_manifest
from sluice.input.sources import Problems, iter_keylist
from sluice.input.strictjson import loads
from sluice.settings import Settings
from tests.unit.aws_errors import client_error


def _reasons(body: bytes | str, key: str = "manifests/m.json") -> list[str]:
    data = body.encode() if isinstance(body, str) else body
    with pytest.raises(Rejection) as exc:
        parse_manifest(ManifestSource("ctl", key, data), Settings())
    return exc.value.reasons


STAND_IN = "builtin:reference-cnn"  # named: a deployed run refuses a manifest without model.uri


def _m(**kw: object) -> str:
    return json.dumps({"version": 1, "input": {"keys": ["a"], "bucket": "images"}, **kw})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": 1, "a": 2}', "field 'a' appears twice"),
        ('{"a": {"b": 1, "b": 1}}', "field 'b' appears twice"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),
        ("[" * 200_000, "nested deeper than 32 levels"),
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": -Infinity}', "-Infinity is not a JSON number"),
        ('{"x": ' + "1" * 5000 + "}", "4300 digits"),
        ('{"x": "\\ud800"}', "x: holds a lone UTF-16 surrogate"),
        ('{"\\udfff": 1}', "field name at top level"),
        (b"\xc3\x28", "not UTF-8 (invalid byte at offset 0)"),
        ("{", "not valid JSON"),
    ],
)
def test_strict_json_rejects_with_the_place(text, reason):
    with pytest.raises(Rejection, match=reason.replace("(", r"\(").replace(")", r"\)")):
        loads(text, "m.json")


def test_strict_json_strips_a_bom():
    assert loads("\ufeff{}", "m") == {}
    assert loads(b"\xef\xbb\xbf[1]", "m") == [1]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (json.dumps({"version": "1", "input": {}}), "version: the string '1' is not a version"),
        (json.dumps({"version": True, "input": {}}), "version: true is not a version"),
        (json.dumps({"version": 2, "input": {}}), "unsupported manifest version 2: this Sluice reads version 1"),
        (_m(job={"keys_per_shard": True}), "job.keys_per_shard: Input should be a valid integer, not true"),
        (_m(job={"attempts": 2.0}), "job.attempts: Input should be a valid integer"),
        (_m(retry_failed="1"), "retry_failed: Input should be a valid integer, not the string '1'"),
        (_m(max_failed_fraction=True), "max_failed_fraction: Input should be a valid number, not true"),
        (_m(model={"image_size": [224]}), "model.image_size: Input should be a valid integer, not a list"),
        (_m(input={"keys": ["a", 7], "bucket": "images"}), "input.keys[1]: Input should be a valid string, not 7"),
        (_m(input={"keys": ["a"], "bucket": "Images"}), "input.bucket: 'Images' is not a valid bucket name"),
        (_m(input={"keys": ["a"], "suffixes": [""]}), "input.suffixes: suffix 0 ('') is empty"),
        (_m(input={"key_list": "s3://images"}), "input.key_list: 's3://images' names a bucket but no object key"),
        (_m(input={"inventory": "/tmp/manifest.json"}), "input.inventory: '/tmp/manifest.json' is not an s3:// URI"),
        (_m(model={"uri": "http://x/m.pt"}), "model.uri: 'http://x/m.pt': workers read models from s3://"),
        (_m(model={"uri": "hf://org/model"}), "workers read models from s3:// or builtin:NAME only"),
        (
            _m(model={"uri": "builtin:resnet"}),
            "unknown builtin model 'resnet'; builtins: reference-cnn, reference-cnn-large",
        ),
        (_m(model={"uri": "s3://b/"}), "model.uri"),
        (_m(output={"prefix": "runs/out/"}), "output.prefix: 'runs/out/' is not an s3:// URI"),
        (_m(output={"prefix": "s3://" + "b" * 70 + "/x/"}), "3 to 63 characters"),
        (_m(output={"prefix": "s3://bucket/" + "k" * 900}), "longer than 800 bytes"),
        (_m(job={"queue": ""}), "job.queue"),
    ],
)
def test_typed_fields_reject_what_they_cannot_use(body, reason):
    assert any(reason in r for r in _reasons(body)), _reasons(body)


def test_a_valid_manifest_normalises_its_output_prefix():
    src = ManifestSource("ctl", "manifests/m.json", _m(output={"prefix": "s3://out-b/x"}).encode())
    m = parse_manifest(src, Settings())
    assert m.output.prefix == "s3://out-b/x/"
    assert Manifest.model_validate_json(m.model_dump_json()) == m  # the prepare stage reads it back


def test_builtin_names_match_the_worker():
    model = pytest.importorskip("gpu_worker.models.builtins")
    textmodel = pytest.importorskip("gpu_worker.kinds.textmodel")
    assert set(BUILTIN_MODELS) == set(model.BUILTINS) | {textmodel.BUILTIN_TEXT.split(":", 1)[1]}


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("images-in", True),
        ("a.b-c", True),
        ("abc", True),
        ("ab", False),
        ("a" * 64, False),
        ("Images", False),
        ("my_bucket", False),
        ("-abc", False),
        ("abc-", False),
        ("a..b", False),
        ("192.168.0.1", False),
        ("xn--bucket", False),
        ("sthree-bucket", False),
        ("bucket-s3alias", False),
        ("bucket--ol-s3", False),
        ("bucket.mrap", False),
    ],
)
def test_bucket_names_follow_s3_rules(name, ok):
    assert is_bucket_name(name) is ok
    assert (bucket_problem(name) is None) is ok


def test_bad_characters_are_named_with_their_position():
    assert bad_char("a.jpg") is None and bad_char("é ü/x y.jpg") is None
    assert "U+0000 at character 2" in (bad_char("a\0") or "")
    assert "control character U+0009" in (bad_char("a\tb") or "")
    assert "lone UTF-16 surrogate U+D800" in (bad_char("\ud800") or "")


def test_lines_drop_a_bom_only_at_the_start_and_bound_a_line():
    assert list(decode_lines([b"\xef", b"\xbb\xbfa\nb"], "k.txt")) == ["a", "b"]
    assert list(decode_lines([b"\xef\xbb\xbfa\n"], "k.txt", bom=False)) == ["\ufeffa"]
    assert list(decode_lines([b"a\n\xef\xbb\xbfb\n"], "k.txt")) == ["a", "\ufeffb"]
    with pytest.raises(LineTooLong) as exc:
        list(decode_lines([b"ok\n", b"x" * (MAX_LINE_BYTES + 1)], "s3://b/k.txt"))
    assert (exc.value.line, exc.value.offset) == (2, 3)
    assert exc.value.reasons == [
        f"k.txt line 2: longer than {MAX_LINE_BYTES} bytes: not a key-list line (is this a key list?)"
    ]


def _keylist(body: bytes, kind: str, bucket: str | None = "images") -> tuple[list[tuple[str, str]], list[str]]:
    problems = Problems()
    try:
        pairs = [(b, k) for b, ks in iter_keylist([body], "s3://c/l" + kind, kind, bucket, problems) for k in ks]
        problems.raise_if_any()
    except Rejection as exc:
        return [], exc.reasons
    return pairs, []


@pytest.mark.parametrize(
    ("body", "kind", "pairs"),
    [
        (b"\xef\xbb\xbfa.jpg\nb.jpg\n", ".txt", [("images", "a.jpg"), ("images", "b.jpg")]),
        (b"\xef\xbb\xbfs3://other/a.jpg\r\n", ".txt", [("other", "a.jpg")]),
        (b"\xef\xbb\xbfkey\na.jpg\n", ".csv", [("images", "a.jpg")]),
        (b'\xef\xbb\xbf"a.jpg"\n', ".jsonl", [("images", "a.jpg")]),
        (b"  \n\t\na.jpg\n", ".txt", [("images", "a.jpg")]),
    ],
)
def test_a_bom_is_no_part_of_a_key(body, kind, pairs):
    assert _keylist(body, kind) == (pairs, [])


@pytest.mark.parametrize(
    ("body", "kind", "reason"),
    [
        (b"a.jpg\nb\x00.jpg\n", ".txt", "l.txt line 2: not a key: 'b\\x00.jpg' holds a control character U+0000"),
        (b"a\x1f\n", ".txt", "line 1: not a key: 'a\\x1f' holds a control character U+001F"),
        (b"\x0c\n", ".txt", "U+000C"),
        (b"a\rb\n", ".txt", "U+000D"),
        (b'"a\\u0000b"\n', ".jsonl", "l.jsonl line 1: not a key"),
        (b'"a\\udc80"\n', ".jsonl", "lone UTF-16 surrogate U+DC80"),
        (b'{"key": "a", "key": "b"}\n', ".jsonl", "field 'key' appears twice"),
        (b'{"key": "a", "bucket": ["x"]}\n', ".jsonl", "'bucket' must be a string"),
        (b"[" * 10_000 + b"\n", ".jsonl", "not JSON: RecursionError"),
        (b"key\n" + b"k" * 200_000 + b"\n", ".csv", "l.csv line 2: not CSV: field larger than field limit"),
        (b"bucket,key\nBAD,a\n", ".csv", "'BAD' is not a valid bucket name"),
        (b"a.jpg\n", ".txt", None),
    ],
)
def test_key_list_lines_are_checked_and_named(body, kind, reason):
    pairs, reasons = _keylist(body, kind)
    if reason is None:
        assert pairs and not reasons
    else:
        assert any(reason in r for r in reasons), reasons


def test_the_bare_key_reason_names_the_way_to_give_a_bucket():
    problems = Problems("or pass --bucket BUCKET")
    with pytest.raises(Rejection, match="write s3://bucket/key, or pass --bucket BUCKET"):
        list(iter_keylist([b"a.jpg\n"], "l.txt", ".txt", None, problems))
        problems.raise_if_any()


def test_inflate_streams_several_members_and_stops_a_bomb():
    data = gzip.compress(b"a\n") + gzip.compress(b"b\n")
    assert b"".join(inflate([data[:7], data[7:]], "f")) == b"a\nb\n"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(z.compress(b"\0" * 2**20) for _ in range(64)) + z.flush()
    seen = 0
    with pytest.raises(Rejection, match="a compression bomb"):
        for piece in inflate([bomb], "s3://b/inv/a.csv.gz"):
            seen += len(piece)
            assert len(piece) <= 2**20
    assert seen <= 100 * len(bomb) + 2**20  # stopped at the limit, not after inflating it all
    with pytest.raises(Rejection, match="SLUICE_MAX_INFLATED_BYTES"):
        list(inflate([gzip.compress(b"x" * 5000)], "f", max_inflated=1000))
    with pytest.raises(Rejection, match="truncated"):
        list(inflate([gzip.compress(b"abc" * 100)[:-10]], "f"))
    with pytest.raises(Rejection, match="not gzip data"):
        list(inflate([b"PK\x03\x04 a zip file"], "f"))


def test_inventory_csv_rows_are_decoded_strictly():
    rows = b'"b1x","a%20b.jpg"\n"b1x","dir/"\n"b1x","%FF"\n"b1x"\n"Bad","k"\n'
    problems = Problems()
    with pytest.raises(Rejection) as exc:
        pairs = [(b, k) for b, ks in csv_keys(gzip.compress(rows), ["Bucket", "Key"], "f.csv.gz", problems) for k in ks]
        problems.raise_if_any()
    reasons = exc.value.reasons
    assert any("line 3: key '%FF' is not URL-encoded UTF-8" in r for r in reasons)
    assert any("line 4: row has 1 columns" in r for r in reasons)
    assert any("line 5: 'Bad' is not a valid bucket name" in r for r in reasons)
    good = Problems()
    pairs = [(b, k) for b, ks in csv_keys(gzip.compress(rows[:30]), ["Bucket", "Key"], "f", good) for k in ks]
    assert pairs == [("b1x", "a b.jpg")]  # the folder marker skipped
    with pytest.raises(Rejection, match="has no Bucket and Key columns"):
        csv_keys(b"", ["Bucket", "Size"], "f", Problems())


def _settings(**kw: object) -> Settings:
    return Settings.from_values(
        {"job_queue": "arn:aws:batch:us-east-1:1:job-queue/st-gpu", "mnp_job_queue": "st-mnp", **kw}
    )


@pytest.mark.parametrize(
    ("job", "ok"),
    [
        ({"queue": "st-gpu"}, True),
        ({"queue": "arn:aws:batch:us-east-1:1:job-queue/st-gpu"}, True),
        ({"queue": "st-mnp"}, True),
        ({"queue": "other"}, False),
        ({"mode": "multinode", "queue": "st-gpu"}, False),
        ({"mode": "multinode", "queue": "st-mnp"}, True),
        ({}, True),
    ],
)
def test_job_queue_must_be_one_of_sluices(job, ok):
    m = Manifest.model_validate({"version": 1, "input": {"keys": ["a"]}, "model": {"uri": STAND_IN}, "job": job})
    if ok:
        check_manifest(m, _settings(), control="ctl")
    else:
        with pytest.raises(Rejection, match=r"job\.queue"):
            check_manifest(m, _settings(), control="ctl")


def test_output_bucket_and_local_model_rules():
    def m(**kw: object) -> Manifest:
        return Manifest.model_validate({"version": 1, "input": {"keys": ["a"]}, "model": {"uri": STAND_IN}, **kw})

    check_manifest(m(output={"prefix": "s3://ctl/x/"}), _settings(), control="ctl")
    check_manifest(m(output={"prefix": "s3://out-b/x/"}), _settings(allowed_output_buckets=("out-b",)), control="ctl")
    with pytest.raises(Rejection, match="bucket 'out-b' is not the control bucket"):
        check_manifest(m(output={"prefix": "s3://out-b/x/"}), _settings(), control="ctl")
    with pytest.raises(Rejection, match="is a local path"):
        check_manifest(m(model={"uri": "./m.pt"}), _settings(), control="ctl")
    check_manifest(m(model={"uri": "./m.pt"}), _settings(local_mode=True), control="ctl")
    # Every reason at once.
    both = m(model={"uri": "./m.pt"}, job={"queue": "x"}, output={"prefix": "s3://o-b/"})
    with pytest.raises(Rejection) as exc:
        check_manifest(both, _settings(), control="ctl")
    assert len(exc.value.reasons) == 3


def test_reading_errors_are_classified_once(caplog):
    def failing(exc: BaseException):
        yield ("b", ["k"])
        raise exc

    with pytest.raises(RetriableError, match="ServiceUnavailable"):
        list(guarded(failing(client_error("ServiceUnavailable", 503))))
    with pytest.raises(RetriableError, match="SlowDown"):
        list(guarded(failing(client_error("SlowDown", 503))))
    with pytest.raises(Rejection, match="cannot read the input: S3: AccessDenied"):
        list(guarded(failing(client_error("AccessDenied", 403))))
    with caplog.at_level(logging.ERROR), pytest.raises(Rejection) as exc:
        list(guarded(failing(ZeroDivisionError("division by zero"))))
    assert exc.value.reasons == ["unexpected error while reading the input: ZeroDivisionError: division by zero"]
    assert any(r.exc_info for r in caplog.records)
    rejected = Rejection("x")
    assert input_error(rejected) is rejected


class _S3:
    """An S3 client whose every call fails as S3 would answer (moto enforces no IAM)."""

    def __init__(self, code: str, status: int) -> None:
        self.error = client_error(code, status)

    def head_object(self, **_: object) -> None:
        raise self.error

    def get_object(self, **_: object) -> None:
        raise self.error


def test_a_check_the_role_may_not_make_is_skipped_not_a_rejection():
    from sluice.input.inventory import verify_checksum

    m = Manifest.model_validate({"version": 1, "input": {"keys": ["a"]}, "model": {"uri": "s3://ctl/models/m.pt"}})
    check_manifest(m, _settings(), control="ctl", s3=_S3("AccessDenied", 403))
    with pytest.raises(Rejection, match="does not exist: upload the model first"):
        check_manifest(m, _settings(), control="ctl", s3=_S3("404", 404))
    with pytest.raises(RetriableError, match="ServiceUnavailable"):
        check_manifest(m, _settings(), control="ctl", s3=_S3("ServiceUnavailable", 503))
    verify_checksum(_S3("AccessDenied", 403), "s3://inv-b/r/manifest.json", b"{}")
    verify_checksum(_S3("NoSuchKey", 404), "s3://ctl/manifests/manifest.json", b"{}")  # copied by hand
    with pytest.raises(Rejection, match=r"manifest\.checksum does not exist"):
        verify_checksum(_S3("NoSuchKey", 404), "s3://inv-b/r/manifest.json", b"{}")
    with pytest.raises(RetriableError):
        verify_checksum(_S3("SlowDown", 503), "s3://inv-b/r/manifest.json", b"{}")


def test_the_prepare_stage_reads_a_bom_and_control_characters_as_the_lambda_does(tmp_path):
    """Several workers over byte ranges: the BOM belongs to range 0 only, a bad line is named in the whole file."""
    from sluice.prepare.offline import OfflineJob, prepare_offline
    from sluice.shards import FileSource, ShardReader

    lines = [f"s3://img-a/k{i:04d}.jpg" for i in range(400)]
    (tmp_path / "keys.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    prepare_offline(
        OfflineJob(str(tmp_path / "keys.txt"), str(tmp_path / "out"), 3, keys_per_shard=1000, processes=False)
    )
    got = ShardReader(FileSource(str(tmp_path / "out" / "shards" / "0.shard"))).pairs()
    assert sorted(got) == sorted(("img-a", ln[11:]) for ln in lines)

    lines[300] = "s3://img-a/bad\x00.jpg"
    (tmp_path / "bad.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    with pytest.raises(Rejection) as exc:
        prepare_offline(OfflineJob(str(tmp_path / "bad.txt"), str(tmp_path / "out2"), 3, processes=False))
    assert exc.value.reasons == [
        "bad.txt line 301: not a key: 's3://img-a/bad\\x00.jpg' holds a control character U+0000 at character 15: "
        "remove it (is the file binary or damaged?)"
    ]

    csv_body = "\ufeffbucket,key\n" + "".join(f"img-a,k{i}.jpg\n" for i in range(300))
    (tmp_path / "keys.csv").write_text(csv_body)
    prepare_offline(
        OfflineJob(str(tmp_path / "keys.csv"), str(tmp_path / "out3"), 2, keys_per_shard=1000, processes=False)
    )
    got = ShardReader(FileSource(str(tmp_path / "out3" / "shards" / "0.shard"))).pairs()
    assert len(got) == 300 and ("img-a", "key") not in got
