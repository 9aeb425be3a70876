"""The GPU worker container (issue: GPU worker). Imports torch; never imported by Lambdas."""

import warnings

# torch marks TorchScript deprecated (`torch.jit.trace`/`save`/`load`: a FutureWarning on every call).
# The worker loads TorchScript and torch.export (*.pt2) files alike, and `sluice model export` keeps
# TorchScript as its default on purpose (docs/models.md, "TorchScript and torch.export"): the notice
# is torch's about a choice the project has made, so it stays out of the user's output (sluice search,
# export, worker logs). Any other warning still shows.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
warnings.filterwarnings("ignore", message=r"`optimize` is deprecated and has no effect", category=FutureWarning)
