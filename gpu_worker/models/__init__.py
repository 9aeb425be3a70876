"""The models a worker runs: builtins, a file's spec, loading, the inference engine, the text tower."""
