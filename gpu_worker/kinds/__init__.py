"""Content kinds other than images (docs/kinds.md): each object becomes parts, each part one output row.

A kind's embedder (`Embedder`) turns one object's bytes into parts (`split`, in the fetch
threads: decode, chunk or sample) and a list of parts' payloads into unit-norm embeddings
(`embed`, on the rank's device); the parts pass (gpu_worker.passes.parts) runs them for a rank.
base.py holds the shared types, load.py picks a kind's embedder. Images keep their own pass
(gpu_worker.passes.images: loaders and shared-memory batches).
"""
