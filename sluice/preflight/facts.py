"""What a preflight judges: the run's layout, and the capacity the stack was deployed with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.preflight.estimate import DEFAULT_FAMILY, IMAGES_PER_GPU_S, family_of
from sluice.preflight.instances import (
    AUDIO_DECODE_S_PER_CORE,
    AUDIO_S_PER_FILE,
    DECODE_PER_CORE_S,
    INSTANCES,
    Instance,
    audio_windows,
    instances,
    more_cpu_per_gpu,
)
from sluice.settings import Settings


@dataclass(frozen=True)
class Capacity:
    """The deployed stack's capacity (template.yaml parameters, passed to the functions as SLUICE_*).

    Built once per invocation (`build`: the settings and the instance table) and passed to
    everything that decides from it: the route, the plan (decode placement, timeout, stall
    time), the preflight and the cost, so `sluice plan`, the plan.json and the worker agree.
    """

    max_vcpus: int = 256  # MaxVcpus: each GPU compute environment
    mnp_max_vcpus: int = 64  # MnpMaxVcpus
    worker_vcpus: int = 4  # WorkerVcpus: per array child / MNP node
    worker_gpus: int = 1  # WorkerGpus: GPUs per array child / MNP node, the one count every figure uses
    gpu_family: str = DEFAULT_FAMILY  # first of GpuInstanceTypes
    images_per_gpu_s: float | None = None  # a measurement (gpu_worker.autotune) over the table's figure
    push_interval_s: float = 30.0  # the workers' remote-write period (SLUICE_WORKER_PUSH_INTERVAL_S default)
    models: int = 1  # models embedded in one pass: each image costs each model's GPU time
    instance_type: str | None = None  # a size (g6e.xlarge): its vCPUs per GPU feed the decode check
    decode: str = "auto"  # job.decode: cpu decode binds the estimates when the CPUs cannot keep up
    decode_per_core_s: float = DECODE_PER_CORE_S  # images/s one core decodes (gpu_worker.autotune measures)
    # An audio run: the windows of a planned file (instances.audio_windows), each costing the GPU an image;
    # its files decode on the CPU whatever job.decode says. 0: not audio (a key is one image's work).
    audio_windows: int = 0
    # The sizes' vCPUs and GPUs (sluice.preflight.instances): the table build() was given.
    table: Mapping[str, Instance] = field(default_factory=lambda: INSTANCES, compare=False, repr=False)

    @classmethod
    def build(cls, settings: Settings, table: Mapping[str, Instance] | None = None) -> Capacity:
        """The stack's capacity: its settings, on the instance table (SLUICE_INSTANCES_FILE read once)."""
        first = settings.gpu_instance_types.split(",")[0].strip().lower()
        return cls(
            max_vcpus=settings.max_vcpus,
            mnp_max_vcpus=settings.mnp_max_vcpus,
            worker_vcpus=settings.worker_vcpus,
            worker_gpus=settings.worker_gpus,
            gpu_family=family_of(first),
            images_per_gpu_s=settings.images_per_gpu_s,
            instance_type=first if "." in first else None,
            table=instances() if table is None else table,
        )

    def for_manifest(self, manifest: Manifest) -> Capacity:
        """For a run of this manifest: every model costs each image GPU time; job.decode says who decodes."""
        c = manifest.input.content
        windows = audio_windows(c.window_s, c.hop_s) if c.kind == "audio" else 0
        return replace(self, models=len(manifest.models), decode=manifest.job.decode, audio_windows=windows)

    def for_plan(self, plan: RunPlan) -> Capacity:
        """For a planned run, as for_manifest."""
        c = plan.content
        windows = audio_windows(c.window_s, c.hop_s) if c.kind == "audio" else 0
        return replace(self, models=len(plan.models), decode=plan.decode, audio_windows=windows)

    @property
    def size(self) -> Instance | None:
        """The instance size's vCPUs and GPUs (None: a family, or a size the table does not know)."""
        return self.table.get(self.instance_type) if self.instance_type else None

    @property
    def node_vcpus(self) -> float:
        """vCPUs one worker (array child or MNP node) holds of a compute environment's MaxVcpus.

        Batch counts an instance's vCPUs: a worker of WorkerGpus GPUs holds its share of the
        instance size given (--instance-type), else of the family's smallest size with that many
        GPUs and WorkerVcpus vCPUs (g6e: 1 GPU -> xlarge, 4 vCPUs; 4 -> 12xlarge, 48; 8 -> 48xlarge,
        192); at least WorkerVcpus. A family the table lacks: WorkerVcpus per GPU.
        """
        gpus = max(1, self.worker_gpus)
        fits = [
            i
            for name, i in self.table.items()
            if name.startswith(self.gpu_family + ".") and i.gpus >= gpus and i.vcpus >= self.worker_vcpus
        ]
        inst = self.size or min(fits, key=lambda i: (i.vcpus, i.gpus), default=None)
        if inst is None:
            return float(self.worker_vcpus * gpus)
        return max(float(self.worker_vcpus), inst.vcpus_per_gpu * gpus)

    @property
    def parts_per_key(self) -> int:
        """What a key costs the GPU in images: an audio file's windows, else 1."""
        return max(1, self.audio_windows)

    @property
    def model_rate(self) -> float:
        """Keys (images, audio files) per GPU-second the models take (through every model of the pass), decode aside."""
        one = self.images_per_gpu_s or IMAGES_PER_GPU_S.get(self.gpu_family, IMAGES_PER_GPU_S[DEFAULT_FAMILY])
        return one / max(1, self.models) / self.parts_per_key

    @property
    def cpu_per_gpu(self) -> float:
        """vCPUs feeding each GPU: the instance size's, else a worker container's (one GPU each)."""
        return self.size.vcpus_per_gpu if self.size else float(self.worker_vcpus)

    @property
    def cpu_decode_rate(self) -> float:
        """Keys per second the CPUs of one GPU decode (each once, whatever the models): images, or audio files."""
        if self.audio_windows:
            return self.cpu_per_gpu * AUDIO_DECODE_S_PER_CORE / AUDIO_S_PER_FILE
        return self.cpu_per_gpu * self.decode_per_core_s

    @property
    def decode_binds(self) -> bool:
        """CPU decode is slower than the models: a CPU-decoding worker leaves its GPU waiting."""
        return self.cpu_decode_rate < self.model_rate

    @property
    def rate(self) -> float:
        """Keys per GPU-second for estimates: the models' rate, or CPU decode's where it binds (audio: always)."""
        if self.decode == "cpu" or self.audio_windows:
            return min(self.model_rate, self.cpu_decode_rate)
        return self.model_rate

    @property
    def part_rate(self) -> float:
        """Rows (images, audio windows) per GPU-second: what a batch of the workers' takes."""
        return self.rate * self.parts_per_key

    @property
    def rate_source(self) -> str:
        cpus = f"{self.cpu_per_gpu:g} vCPUs a GPU"
        if self.rate < self.model_rate:
            why = "audio decodes on the CPU" if self.audio_windows else "job.decode cpu"
            return f"bound by CPU decode ({why}, {cpus}; the models take {self.model_rate:g})"
        if self.audio_windows:
            return (
                f"{self.model_source}, an image's GPU time a window, {self.audio_windows} windows a "
                f"{AUDIO_S_PER_FILE:g} s file (a planning guess)"
            )
        return self.model_source

    @property
    def model_source(self) -> str:
        if self.images_per_gpu_s:
            return "measured (--images-per-gpu-s / SLUICE_IMAGES_PER_GPU_S)"
        return f"table estimate for {self.gpu_family} (measure with python -m gpu_worker.autotune)"


def audio_decode(cap: Capacity) -> tuple[float, float, Literal["ok", "warn"], str, str]:
    """An audio run's decode check (value, limit, status, advice, unit): its CPUs against the files/s its models take.

    Audio decodes on the CPU whatever job.decode says; files/s to two places (4.7, not 5).
    """
    model, cpu, unit = cap.model_rate, cap.cpu_decode_rate, "audio files/s per GPU the models take (limit: CPU decode)"
    if not cap.decode_binds:
        return round(model, 2), round(cpu, 2), "ok", "", unit
    size = more_cpu_per_gpu(cap.gpu_family, model * AUDIO_S_PER_FILE / AUDIO_DECODE_S_PER_CORE, cap.table)
    advice = (
        f"CPU decode binds: {cap.cpu_per_gpu:g} vCPUs a GPU x {AUDIO_DECODE_S_PER_CORE:g} s of audio a second a core "
        f"= {cpu:,.2f} files of {AUDIO_S_PER_FILE:g} s a second, for models that take {model:,.2f}: the GPU idles "
        f"{1 - cpu / model:.0%} of the time, the estimates use {cpu:,.2f}" + (f"; {size} keeps it busy" if size else "")
    )
    return round(model, 2), round(cpu, 2), "warn", advice, unit


@dataclass(frozen=True)
class RunFacts:
    """The run as planned: keys, shards, jobs and the per-shard settings."""

    unique_keys: int
    keys_per_shard: int
    n_shards: int
    mode: Literal["array", "multinode"]
    jobs: list[tuple[str, int]] = field(default_factory=list)  # (kind, shards) per Batch job
    gpus_per_worker: int = 1  # the stack's WorkerGpus (Capacity.worker_gpus): what each worker gets
    gpus_asked: int | None = None  # the manifest's job.gpus_per_node where it sets one (checked against the stack's)
    timeout_s: int = 6 * 3600
    timeout_from_manifest: bool = False
    in_lambda: bool = True  # planned by the manifest function (else the prepare stage)
    max_keys: int = 1_000_000_000  # SLUICE_MAX_KEYS
    models: int = 1  # models embedded in one pass

    @classmethod
    def from_plan(cls, plan: RunPlan, *, in_lambda: bool, max_keys: int, manifest: Manifest | None = None) -> RunFacts:
        """The planned run; `manifest`: its job.gpus_per_node is checked against the plan's (the stack's)."""
        return cls(
            unique_keys=plan.total_keys,
            keys_per_shard=plan.keys_per_shard,
            n_shards=plan.n_shards,
            mode=plan.mode,
            jobs=[(j.kind, j.shard_count) for j in plan.jobs],
            gpus_per_worker=max(1, plan.gpus_per_node),
            gpus_asked=asked_gpus(manifest) if manifest else None,
            timeout_s=plan.timeout_s,
            in_lambda=in_lambda,
            max_keys=max_keys,
            models=len(plan.models),
        )


def asked_gpus(manifest: Manifest) -> int | None:
    """The manifest's job.gpus_per_node where it sets one (None: left to the stack's WorkerGpus)."""
    job = manifest.job
    return job.gpus_per_node if "gpus_per_node" in job.model_fields_set else None
