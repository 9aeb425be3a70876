"""What several commands share: the exit codes, one invocation's Settings, the error map, argument types."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.errors import Rejection, RetriableError, ShardFormatError, SluiceError

if TYPE_CHECKING:
    from sluice.settings import Settings

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command a closed pipe (SIGPIPE) ended
EXIT_INTERRUPTED = 130  # what a shell reports for a command Ctrl-C (SIGINT) ended


class Invocation:
    """One run of one command: its Settings, read from the environment once and only if a command asks."""

    @functools.cached_property
    def settings(self) -> Settings:
        """SLUICE_* settings, built on first use (a command that needs none never reads them)."""
        from sluice.settings import Settings

        return Settings.from_env()

    def s3(self) -> Any:
        """The S3 client (sluice.aws.clients: created on first use, then shared)."""
        from sluice.aws.clients import client

        return client("s3")


Command = Callable[[argparse.Namespace, Invocation], int]


def run(command: Command, args: argparse.Namespace) -> int:
    """Run one command; what it raises is one message on stderr and the exit code the map gives it."""
    try:
        return int(command(args, Invocation()))
    except Rejection as exc:
        print("manifest rejected:", file=sys.stderr)
        for r in exc.reasons:
            print(f"  - {r}", file=sys.stderr)
        return EXIT_FAIL
    except RetriableError as exc:  # what a Lambda retries; a command gives up at once and says so
        where = os.environ.get("AWS_ENDPOINT_URL")
        print(
            f"sluice: error: {str(exc).removesuffix('; will retry')} (not retried: check "
            + (f"that {where} is up" if where else "your network and the AWS region")
            + ", then run the command again)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except (ShardFormatError, SluiceError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except (ClientError, BotoCoreError) as exc:
        print(f"sluice: AWS error: {exc} (check credentials, region and AWS_ENDPOINT_URL)", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:  # the reader of stdout went away before the command finished
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except (OSError, RuntimeError) as exc:  # unreachable Prometheus, PromQL errors, ...
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("sluice: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def silence_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and the interpreter's last flush must not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def int_from(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low, with the limit in the error."""

    def parse(text: str) -> int:
        """The integer `text` spells, refused below `low`."""
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is too small: use {low} or more")
        return n

    return parse


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"{f} is outside 0..1 (0.05 means 5% of a shard's keys)")
    return f


def version() -> str:
    """The installed package's version (the source tree's, when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("sluice")
    except PackageNotFoundError:
        return "(not installed)"
