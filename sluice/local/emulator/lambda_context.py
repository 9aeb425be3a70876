"""A Lambda context object for invoking the real handlers locally."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass
class LocalContext:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str
    memory_limit_in_mb: int = 1024
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = ""
    function_version: str = "$LATEST"
    log_group_name: str = "local"
    log_stream_name: str = "local"

    def __post_init__(self) -> None:
        if not self.invoked_function_arn:
            self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return 900_000
