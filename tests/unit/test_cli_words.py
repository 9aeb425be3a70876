"""What the commands' help and closing lines say: the flags that work, every argument explained, docs as built."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.cli import main
from sluice.index.__main__ import query_flag
from sluice.index.build import BuildReport, TableReport

ROOT = Path(__file__).resolve().parents[2]


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_local_run_is_described_by_what_it_does(capsys):
    text = _help(capsys, "local")
    assert "embedded default" not in text and "a whole run on this machine" in text


def test_index_reruns_run_id_is_explained(capsys):
    text = _help(capsys, "index", "rerun")
    assert "RUN_ID the run whose index stage failed" in text


def test_search_help_says_text_queries_work_for_text_indexes(capsys):
    text = _help(capsys, "search")
    assert "(CLIP-style models)" not in text and "a text run's" in text


@pytest.mark.parametrize(
    ("model_id", "flag"),
    [
        ("uri:s3://m/minilm.pt;chunk_tokens=default;overlap_tokens=default", '--text "..."'),
        ("builtin:reference-cnn@w1;image_size=128", "--image FILE"),
    ],
)
def test_a_built_index_suggests_the_query_its_kind_takes(model_id, flag):
    report = BuildReport("idx/", tables=[TableReport("m", model_id, "idx/m.lance", 8)])
    assert query_flag(report) == flag


def test_the_docs_do_not_call_the_wired_index_stage_unwired():
    assert "not wired yet" not in (ROOT / "docs" / "index.md").read_text()
    assert (ROOT / "sluice" / "control" / "indexing" / "stage.py").is_file()  # the stage the completion submits
