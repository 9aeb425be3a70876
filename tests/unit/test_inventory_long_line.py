"""An S3 Inventory data file whose first "line" is over the line limit is named, with what is wrong."""

from __future__ import annotations

import gzip

import pytest

from sluice.errors import Rejection
from sluice.input.inventory_files import csv_keys
from sluice.input.lines import MAX_LINE_BYTES
from sluice.input.sources import Problems


def test_a_data_file_that_is_not_csv_says_so_and_names_the_file():
    data = gzip.compress(b"PAR1" + b"\x01" * (MAX_LINE_BYTES + 10))  # e.g. a Parquet file under a CSV report
    with pytest.raises(Rejection) as exc:
        list(csv_keys(data, ["Bucket", "Key"], "s3://inv/data/part-1.csv.gz", Problems()))
    (reason,) = exc.value.reasons
    assert reason.startswith("part-1.csv.gz line 1: longer than 1048576 bytes: not a row of an inventory CSV file")
    assert "is this a key list" not in reason and "fileFormat" in reason
