"""Problems keeps the structured form of the problems a caller acts on: a code, where, the key, the reason."""

from __future__ import annotations

import pytest

from sluice.errors import MAX_REASONS, Rejection
from sluice.input.sources import BARE_KEY, BUCKET_HINT, Problem, Problems, inline_keys, keylist_pairs


def test_a_bare_key_is_a_problem_with_its_code_line_and_key():
    problems = Problems()
    pairs = list(keylist_pairs([b"s3://imgs/a.jpg\nb.jpg\n"], "s3://ctl/list.txt", ".txt", None, problems))
    assert pairs == [("imgs", "a.jpg")]
    text = f"list.txt line 2: bare key 'b.jpg' but no bucket: write s3://bucket/key, {BUCKET_HINT}"
    assert problems.reasons == [text]
    assert problems.details == [Problem(BARE_KEY, "list.txt line 2", text, key="b.jpg")]


def test_only_coded_problems_have_details_and_the_key_is_the_one_the_reason_shows():
    problems = Problems()
    list(inline_keys(["http://x/y.jpg", "k" * 100], None, problems))
    assert len(problems.reasons) == 2 and "or a bare key" in problems.reasons[0]
    (bare,) = problems.details
    assert (bare.code, bare.where, bare.key) == (BARE_KEY, "input.keys[1]", "k" * 80)
    assert bare.text == problems.reasons[1]


def test_details_are_kept_like_the_reasons_up_to_max_reasons():
    problems = Problems()
    body = "".join(f"k{i}.jpg\n" for i in range(MAX_REASONS + 5)).encode()
    with pytest.raises(Rejection):
        list(keylist_pairs([body], "list.txt", ".txt", None, problems))
    assert len(problems.details) == len(problems.reasons) == MAX_REASONS
    assert [p.text for p in problems.details] == problems.reasons


@pytest.mark.parametrize("bucket", [None, "imgs"])
def test_a_uri_with_spaces_around_it_is_named_with_the_spaces_not_called_a_bare_key(bucket):
    problems = Problems()
    pairs = list(keylist_pairs([b"s3://bkt/a.jpg\n  s3://bkt/c.jpg  \n"], "list.txt", ".txt", bucket, problems))
    assert pairs == [("bkt", "a.jpg")]
    assert problems.reasons == [
        "list.txt line 2: not a key: 's3://bkt/c.jpg' has spaces around it ('  s3://bkt/c.jpg  '): remove them"
    ]
    assert problems.details == []  # not a bare key: no --bucket would help
