"""A rank's pass over its keys: the shared base, the image pass with its loaders, the parts pass (text, video)."""
