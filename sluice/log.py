"""The one Powertools Logger every Sluice module and handler shares (JSON, structured).

It writes to stderr: Lambda captures stderr like stdout, and CLI commands keep stdout
for their own output (`--json`).
"""

from __future__ import annotations

import logging
import sys

from aws_lambda_powertools import Logger

logger = Logger(service="sluice", logger_handler=logging.StreamHandler(sys.stderr))
