"""The one Powertools Logger every Sluice module and handler shares (JSON, structured)."""

from __future__ import annotations

from aws_lambda_powertools import Logger

logger = Logger(service="sluice")
