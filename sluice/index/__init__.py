"""The search index: a run's committed embeddings as one Lance table per model (docs/index.md).

    <index>/<model name>.lance     rows keyed by (key, model_id), the newest run's row per key;
                                   an IVF-PQ index (exact re-ranking) on embedding, a BTREE on key

Built by the index stage, an AWS Batch CPU job (`python -m sluice.index build`), after a run
succeeds, or by hand (`sluice index build`); searched with `sluice search`, or directly with
Lance, LanceDB or DuckDB. pyarrow, lance and numpy are imported inside functions only: the
Lambdas never import this package.
"""
