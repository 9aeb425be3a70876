"""Contracts between processes, defined once, one module a boundary: results, events, prepare, manifest, plan.

Sluice writes every model here, so each forbids unknown fields: a writer that drifts fails
its tests instead of silently sending something a reader ignores. `python -m sluice.ops.schemas`
writes the JSON Schema of each event detail into docs/schemas/ (CI checks it is current). The
runs table's items live beside the control plane (sluice.control.table.items), the distributed
index build's files beside the index (sluice.index.fleet.files).
"""
