"""The manifest handler runs the preflight: an error rejects the run, warnings and cost go out with it."""

from __future__ import annotations

from tests.integration.helpers import all_jobs, bus_events, submit_keys


def _upload(aws, stack, monkeypatch, name, job, n_keys=20, extra_env=None):
    return submit_keys(aws, stack, monkeypatch, name, n_keys=n_keys, job=job, extra_env=extra_env)


def test_an_mnp_job_that_can_never_start_is_rejected_with_the_limit_and_what_to_do(aws, stack, monkeypatch):
    # 17 nodes x 4 vCPUs is more than the MNP environment's 64: Batch would leave it RUNNABLE for ever.
    out = _upload(aws, stack, monkeypatch, "mnp17", {"mode": "multinode", "nodes": 17}, n_keys=34)
    assert out["status"] == "rejected", out
    (reason,) = out["reasons"]
    assert reason.startswith("preflight: MNP vCPUs: 68 vCPUs (MnpMaxVcpus) (limit 64): ")
    assert "raise MnpMaxVcpus or lower job.nodes" in reason
    assert all_jobs(aws) == []  # nothing submitted
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Manifest Rejected"]
    assert ev["detail"]["reasons"] == out["reasons"]


def test_a_shard_longer_than_its_timeout_is_rejected(aws, stack, monkeypatch):
    job = {"keys_per_shard": 20, "timeout_s": 60}
    out = _upload(aws, stack, monkeypatch, "slow", job, extra_env={"SLUICE_IMAGES_PER_GPU_S": "0.25"})
    assert out["status"] == "rejected" and out["reasons"][0].startswith("preflight: shard time: 80 s"), out
    assert "a timed-out attempt is not retried" in out["reasons"][0]


def test_run_submitted_carries_the_warnings_and_the_cost_estimate(aws, stack, monkeypatch):
    # 100 one-key children x 4 vCPUs is more than MaxVcpus 256: a warning, not an error.
    out = _upload(
        aws, stack, monkeypatch, "wide", {"keys_per_shard": 1}, n_keys=100, extra_env={"SLUICE_IMAGES_PER_GPU_S": "1"}
    )
    assert out["status"] == "submitted", out
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    d = ev["detail"]
    stand_in, warning, startup = d["warnings"]
    assert stand_in.startswith("model.uri builtin:reference-cnn: a builtin stand-in")  # keys_manifest names it
    assert warning.startswith("preflight: vCPUs for all children at once: 400 vCPUs (MaxVcpus) (limit 256)")
    # 100 children of 1 s each: 100 minutes of start-up for 100 s of work.
    assert startup.startswith("preflight: child start-up share: 0.98 of a child's time (limit 0.25): each of 100")
    assert "at most 64 children run at once, so the run takes about 2 waves" in warning
    # 100 images at 1 image/s a GPU (100 GPU-seconds) and 100 children's 60 s start-up, priced on g6e.
    hours = (100 + 100 * 60) / 3600
    assert d["gpu_hours_estimate"] == round(hours, 2) and d["cost_estimate_usd"]["family"] == "g6e"  # sluice plan's
    assert d["cost_estimate_usd"]["on_demand"] == round(hours * 1.861, 2)


def test_gpus_per_node_other_than_the_stacks_worker_gpus_is_rejected(aws, stack, monkeypatch):
    # The stack's workers get one GPU each (WorkerGpus 1): a manifest planning 8 would be priced and paced wrong.
    out = _upload(aws, stack, monkeypatch, "gpus8", {"mode": "multinode", "nodes": 2, "gpus_per_node": 8}, n_keys=4)
    assert out["status"] == "rejected", out
    (reason,) = out["reasons"]
    assert reason.startswith("preflight: GPUs per node: 8 GPUs (WorkerGpus) (limit 1): job.gpus_per_node is 8")
    assert all_jobs(aws) == []
