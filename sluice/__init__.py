"""Sluice: GPU batch inference on AWS Batch, driven by manifests dropped in S3."""

__version__ = "0.1.0"
