"""A registry's samples as a Prometheus remote-write 1.0 WriteRequest, raw-snappy compressed.

Hand-encoded (prometheus/prompb remote.proto, types.proto): the four messages need ~20 lines,
where a generated protobuf module would add the protobuf runtime to the worker image. The
tests decode these bytes with Google's protobuf runtime and the official schema.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry

Series = tuple[tuple[tuple[str, str], ...], float]  # (sorted labels incl. __name__, value)
# Prometheus' staleness marker: a NaN with this bit pattern ends a series at once.
STALE_NAN = struct.pack("<Q", 0x7FF0000000000002)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def encode_write_request(series: Iterable[Series], timestamp_ms: int, *, stale: bool = False) -> bytes:
    """WriteRequest{timeseries: [TimeSeries{labels, samples: [Sample{value, timestamp}]}]}.

    `stale` sends Prometheus' staleness marker instead of each value: the series end now.
    """
    ts_tag = _varint(2 << 3 | 0)
    out = bytearray()
    for labels, value in series:
        body = bytearray()
        for name, val in labels:
            body += _field(1, _field(1, name.encode()) + _field(2, val.encode()))
        raw = STALE_NAN if stale else struct.pack("<d", value)
        body += _field(2, b"\x09" + raw + ts_tag + _varint(timestamp_ms))  # 0x09: field 1, fixed64
        out += _field(1, bytes(body))
    return bytes(out)


def registry_series(
    registry: CollectorRegistry, keep: Sequence[str] | None = None, extra: Mapping[str, str] | None = None
) -> list[Series]:
    """Every sample of the registry as a series; `keep` lists the metric families to include.

    Labels with an empty value are left out: Prometheus treats them as absent, and some
    receivers refuse them.
    """
    wanted = set(keep) if keep is not None else None
    out: list[Series] = []
    for family in registry.collect():
        # prometheus_client names a counter family without "_total"; accept either spelling.
        if wanted is not None and family.name not in wanted and f"{family.name}_total" not in wanted:
            continue
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # prometheus_client's creation timestamps: not worth a series each
            labels = {**(extra or {}), **s.labels, "__name__": s.name}
            out.append((tuple(sorted((k, v) for k, v in labels.items() if v != "")), float(s.value)))
    return out


def snappy_block(data: bytes) -> bytes:
    """Raw (block) snappy, as remote write requires (not the framed format)."""
    import cramjam

    return bytes(cramjam.snappy.compress_raw(data))
