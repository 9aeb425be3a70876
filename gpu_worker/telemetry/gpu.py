"""NVML readings of one GPU (utilization, memory, power, temperature) for a rank's gauges."""

from __future__ import annotations

from typing import Any

from gpu_worker.log import child

log = child("metrics")


class GpuProbe:
    """NVML readings of one device; `read()` returns {} when there is no GPU or no driver."""

    def __init__(self, index: int | None) -> None:
        self._handle: Any = None
        if index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            log.info("GPU metrics unavailable: %s", exc)
            self._handle = None

    def read(self) -> dict[str, float]:
        if self._handle is None:
            return {}
        n, h, out = self._nvml, self._handle, {}
        for key, fn in (
            ("util", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            ("mem", lambda: float(n.nvmlDeviceGetMemoryInfo(h).used)),
            ("power", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("temp", lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
        ):
            try:
                out[key] = fn()
            except Exception:  # noqa: S112 - a reading the device does not support
                continue
        return out
