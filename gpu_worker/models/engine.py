"""The model step: uint8 NHWC host batch -> L2-normalized float32 embeddings.

Fixed-size batches (a partial batch is padded, so shapes never change), channels_last
(the NHWC uint8 batch permuted to NCHW *is* channels_last: no copy), normalisation on the
device, torch.inference_mode(), bf16 autocast on GPU (unless the model's spec says fp32). On
GPU the host batch is copied into one of two pinned staging buffers, sent with non_blocking=True
on a copy stream of its own (the model's stream waits for it), and the result comes back into
pinned memory behind a CUDA event: the host prepares batch k+1, and its copy runs, while the
GPU runs batch k. On CPU the step is synchronous.

With several models the loaders decode each image once, at the largest input size; an engine
whose model takes fewer pixels resizes the batch on its device (antialiased bilinear). The
decode's centre crop is the same region at every size, so that equals decoding at its own size
up to resampling.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpu_worker.errors import ConfigError
from gpu_worker.models.load import ModelInfo
from gpu_worker.telemetry.stats import Observer, Stats


def _trace(model: Any, example: torch.Tensor) -> Any:
    """Trace + freeze an eager model for CPU (~1.4x faster: conv+BN folded, one GIL release per
    forward); the eager model when tracing is unavailable."""
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            return torch.jit.freeze(torch.jit.trace(model, example, check_trace=False))
    except Exception:  # pragma: no cover - depends on the torch build
        return model


@dataclass(frozen=True)
class EngineOptions:
    """How an Engine runs its model; the defaults are WorkerConfig's (SLUICE_WORKER_AUTOCAST, _JIT)."""

    autocast: bool = True  # bf16 autocast (GPU only)
    jit: bool = True  # trace and freeze an eager model on CPU
    input_size: int | None = None  # the host batches' side (None: the model's own); larger for another model's


class Engine:
    """Runs a model on one device; `submit` returns the (tag, embeddings) of finished batches."""

    def __init__(
        self,
        model: Any,
        info: ModelInfo,
        device: str,
        batch_size: int,
        options: EngineOptions | None = None,
        observer: Observer | None = None,
    ) -> None:
        options = options or EngineOptions()
        autocast, jit, input_size = options.autocast, options.jit, options.input_size
        self.device = torch.device(device)
        self.info = info
        # The host batches' side: the model's own, or larger when another model in the pass needs more.
        self.input_size = input_size or info.image_size
        if self.input_size < info.image_size:
            raise ValueError(f"input_size {self.input_size} < the model's {info.image_size}")
        self.batch_size = batch_size
        self._obs = observer or Stats()
        self._cuda = self.device.type == "cuda"
        self._autocast = autocast and self._cuda and info.precision != "fp32"  # fp32: bf16 failed its export check
        model = model.to(self.device)
        with contextlib.suppress(TypeError, RuntimeError, AttributeError):  # some graphs refuse; they still run
            model = model.to(memory_format=torch.channels_last)
        scale = torch.tensor(info.std, dtype=torch.float32) * 255.0
        self._mean = (torch.tensor(info.mean, dtype=torch.float32) * 255.0).view(1, 3, 1, 1).to(self.device)
        self._inv_std = (1.0 / scale).view(1, 3, 1, 1).to(self.device)
        self._model: Callable[[torch.Tensor], torch.Tensor] = model
        host = self.input_size
        if jit and info.eager and not self._cuda:
            self._model = _trace(model, self._normalize(torch.zeros(batch_size, host, host, 3, dtype=torch.uint8)))
        if self._cuda:
            self._stage = [torch.empty(batch_size, host, host, 3, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._out: list[torch.Tensor] = []
            self._pending: deque[tuple[Any, int, Any]] = deque()
            self._copy = torch.cuda.Stream(self.device)  # host-to-device copies, beside the model's stream
            self._k = 0
        self.output_dim = self._dry_run()

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 3, 1, 2).float()  # NHWC memory viewed as NCHW: channels_last
        size = self.info.image_size
        if x.shape[-1] != size:  # decoded for a larger model of the pass: (B, 3, S, S) -> (B, 3, size, size)
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
            x = x.contiguous(memory_format=torch.channels_last)
        return x.sub_(self._mean).mul_(self._inv_std)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
            y = self._model(self._normalize(x))
        if isinstance(y, tuple | list):
            y = y[0]
        if y.dim() != 2:
            y = y.flatten(1)
        with torch.inference_mode():
            return F.normalize(y.float(), dim=1)

    def _dry_run(self) -> int:
        size = self.input_size
        x = torch.zeros(self.batch_size, size, size, 3, dtype=torch.uint8, device=self.device)
        try:
            y = self._forward(x)
        except torch.cuda.OutOfMemoryError:
            raise  # autotune probes for it
        except Exception as exc:
            raise ConfigError(
                f"model {self.info.name} fails on a ({self.batch_size}, 3, {self.info.image_size}, "
                f"{self.info.image_size}) batch: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from None
        if y.shape[0] != self.batch_size:
            raise ConfigError(f"model {self.info.name} returned {y.shape[0]} rows for a batch of {self.batch_size}")
        dim = int(y.shape[1])
        if self.info.output_dim is not None and dim != self.info.output_dim:
            raise ConfigError(f"model {self.info.name} outputs {dim} dims; its spec says {self.info.output_dim}")
        if self._cuda:
            self._out = [torch.empty(self.batch_size, dim, dtype=torch.float32, pin_memory=True) for _ in range(2)]
            torch.cuda.synchronize(self.device)
        return dim

    def submit(self, batch: torch.Tensor, tag: Any) -> list[tuple[Any, np.ndarray]]:
        """Queue one (B, H, W, 3) uint8 host batch; the caller may reuse `batch` when this returns."""
        if batch.shape[0] != self.batch_size:
            raise ValueError(f"batch has {batch.shape[0]} rows, engine runs {self.batch_size}")
        started = time.perf_counter()
        if not self._cuda:
            out = self._forward(batch).numpy()
            self._obs.incr("model_seconds", time.perf_counter() - started)
            return [(tag, out)]
        j = self._k % 2
        self._k += 1
        stage = self._stage[j]
        stage.copy_(batch)
        y = self._forward(self._to_device(stage))
        self._out[j].copy_(y, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((event, j, tag))
        done = self._collect(keep=1)
        self._obs.incr("model_seconds", time.perf_counter() - started)
        return done

    def _to_device(self, stage: torch.Tensor) -> torch.Tensor:
        """Copy a pinned batch on the copy stream; the model's stream waits for that copy only.

        So batch k+1's copy runs while the model still runs batch k. The stage buffer is written
        again two batches later, after `_collect` has waited for batch k's event (recorded after
        its model step, which waited for its copy).
        """
        with torch.cuda.stream(self._copy):
            x = stage.to(self.device, non_blocking=True)
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self._copy)
        x.record_stream(compute)  # allocated on the copy stream, used on the model's
        return x

    def _collect(self, keep: int) -> list[tuple[Any, np.ndarray]]:
        done = []
        while len(self._pending) > keep:
            event, j, tag = self._pending.popleft()
            event.synchronize()
            done.append((tag, self._out[j].numpy().copy()))
        return done

    def drain(self) -> list[tuple[Any, np.ndarray]]:
        """Results of every batch still on the device."""
        return self._collect(keep=0) if self._cuda else []
