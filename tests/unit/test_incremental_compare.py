"""The skip decision of an incremental run (sluice.prepare.reducer.skip), case by case.

A key is skipped only when, for every model of the run, the newest record of the lineage for
(key, that model's model_id) was read from the object version the input names now.
"""

from __future__ import annotations

import pytest

from sluice.outputs import object_version
from sluice.prepare.reducer.skip import CURRENT, Skipper, distinct, matches, parse, record

B = "imgs"


def skipper(n_models: int = 1) -> Skipper:
    return Skipper(n_models)


def test_same_etag_same_model_is_skipped() -> None:
    s = skipper()
    s.add_current(B, "a.jpg", "e1", None)
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)
    assert s.skips(B, "a.jpg")
    assert s.keep(B, ["a.jpg"]) == []


def test_a_changed_etag_is_embedded() -> None:
    s = skipper()
    s.add_current(B, "a.jpg", "e2", None)
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)
    assert not s.skips(B, "a.jpg")


def test_quotes_around_an_etag_do_not_matter() -> None:
    s = skipper()
    s.add_current(B, "a.jpg", '"e1"', None)  # a HEAD or listing may quote it; output rows never do
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)
    assert s.skips(B, "a.jpg")


def test_failed_earlier_means_no_row_and_is_embedded() -> None:
    s = skipper()
    s.add_current(B, "failed.jpg", "e1", None)
    s.add_current(B, "ok.jpg", "e1", None)
    s.add_earlier(B, "ok.jpg", 0, 0, "e1", None)
    assert s.keep(B, ["failed.jpg", "ok.jpg"]) == ["failed.jpg"]


def test_a_key_without_a_current_version_is_embedded() -> None:
    # A HEAD that found nothing (404) or was denied: the GPU worker records the key's failure.
    s = skipper()
    s.add_earlier(B, "gone.jpg", 0, 0, "e1", None)
    assert not s.skips(B, "gone.jpg")


def test_versioned_bucket_compares_version_ids() -> None:
    s = skipper()
    s.add_current(B, "same.jpg", "e1", "v1")
    s.add_current(B, "newer.jpg", "e1", "v2")  # the same bytes uploaded again: a new version
    s.add_earlier(B, "same.jpg", 0, 0, "e1", "v1")
    s.add_earlier(B, "newer.jpg", 0, 0, "e1", "v1")
    assert s.skips(B, "same.jpg")
    assert not s.skips(B, "newer.jpg")


def test_a_listing_names_only_etags_so_a_versioned_row_matches_by_etag() -> None:
    s = skipper()
    s.add_current(B, "a.jpg", "e1", None)  # ListObjectsV2 has no version id
    s.add_current(B, "b.jpg", "e2", None)
    s.add_earlier(B, "a.jpg", 0, 0, "e1", "v7")
    s.add_earlier(B, "b.jpg", 0, 0, "e1", "v7")
    assert s.skips(B, "a.jpg") and not s.skips(B, "b.jpg")


def test_null_version_id_is_an_unversioned_object() -> None:
    # Objects written before versioning was enabled have the version id "null" (S3's word for none).
    assert object_version("e1", "null") == object_version("e1", None)
    s = skipper()
    s.add_current(B, "a.jpg", "e1", "null")
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)
    assert s.skips(B, "a.jpg")


def test_multi_model_is_skipped_only_when_every_model_has_a_matching_row() -> None:
    s = skipper(2)
    for k in ("both.jpg", "first-only.jpg", "second-stale.jpg"):
        s.add_current(B, k, "e1", None)
    s.add_earlier(B, "both.jpg", 0, 0, "e1", None)
    s.add_earlier(B, "both.jpg", 0, 1, "e1", None)
    s.add_earlier(B, "first-only.jpg", 0, 0, "e1", None)  # model 1 failed or was added since
    s.add_earlier(B, "second-stale.jpg", 0, 0, "e1", None)
    s.add_earlier(B, "second-stale.jpg", 0, 1, "e0", None)
    assert s.keep(B, ["both.jpg", "first-only.jpg", "second-stale.jpg"]) == ["first-only.jpg", "second-stale.jpg"]


def test_two_models_of_one_artifact_need_one_row() -> None:
    assert distinct(["builtin:a@1", "builtin:b@1", "builtin:a@1"]) == ["builtin:a@1", "builtin:b@1"]


def test_lineage_of_two_runs_with_a_key_re_embedded_in_the_middle_one() -> None:
    # Run A (rank 1) embedded everything at v1; run B (rank 0, incremental on A) re-embedded
    # "changed.jpg" at v2 and "reverted.jpg" at v2; "kept.jpg" stayed A's.
    s = skipper()
    s.add_current(B, "kept.jpg", "v1", None)
    s.add_current(B, "changed.jpg", "v2", None)
    s.add_current(B, "reverted.jpg", "v1", None)  # back to its old bytes since B
    for k in ("kept.jpg", "changed.jpg", "reverted.jpg"):
        s.add_earlier(B, k, 1, 0, "v1", None)
    s.add_earlier(B, "changed.jpg", 0, 0, "v2", None)
    s.add_earlier(B, "reverted.jpg", 0, 0, "v2", None)
    assert s.skips(B, "kept.jpg"), "A's row is its newest and matches"
    assert s.skips(B, "changed.jpg"), "B's re-embedding matches"
    # A's row matches, but B's is the newest (what the read recipe returns): embed it again.
    assert not s.skips(B, "reverted.jpg")


def test_the_order_records_arrive_in_does_not_matter() -> None:
    recs = [(1, "v1"), (0, "v2"), (2, "v2"), (0, "v2")]
    outcomes = set()
    for order in (recs, list(reversed(recs)), recs[1:] + recs[:1]):
        s = skipper()
        s.add_current(B, "k", "v2", None)
        for rank, etag in order:
            s.add_earlier(B, "k", rank, 0, etag, None)
        outcomes.add(s.skips(B, "k"))
    assert outcomes == {True}


def test_two_sources_naming_different_versions_embed_the_key() -> None:
    # A key listed twice whose object changed between two HEADs: which version is current is unknown.
    s = skipper()
    s.add_current(B, "k", "e1", None)
    s.add_current(B, "k", "e2", None)
    s.add_earlier(B, "k", 0, 0, "e1", None)
    assert not s.skips(B, "k")


def test_the_same_key_in_another_bucket_is_another_object() -> None:
    s = skipper()
    s.add_current("other", "a.jpg", "e1", None)
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)
    assert not s.skips("other", "a.jpg")


@pytest.mark.parametrize("key", ["a.jpg", "dir/with spaces/ünïcode.jpg", "x" * 1024])
def test_records_round_trip(key: str) -> None:
    assert parse(record(key, CURRENT, 0, "e", None)) == (key, CURRENT, 0, "e", None)
    assert parse(record(key, 3, 2, "abc-12", "v.1")) == (key, 3, 2, "abc-12", "v.1")
    s = skipper(3)
    s.add(B, record(key, CURRENT, 0, "abc-12", None))
    for m in range(3):
        s.add(B, record(key, 0, m, "abc-12", "v.1"))
    assert s.skips(B, key)


def test_matches_uses_object_version_on_both_sides() -> None:
    assert matches(object_version("e", "v"), "e", "v")
    assert not matches(object_version("e", "v"), "e", "w")
    assert matches(object_version("e", None), "e", "w")
    assert not matches(object_version("e", None), "f", None)
