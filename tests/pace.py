"""How busy this machine is: the grace periods and stall thresholds of tests scale with it.

A test that sets a stall threshold or a grace period races real work (a Python process
starting, torch importing, a model loading) against a clock, and on a machine shared with
other work that real work takes many times longer than on an idle one: a 10 s threshold that
is ample on an idle machine ends a healthy worker on one with ten runnable processes a core.
So such a threshold is the idle machine's value times `slowness()`, the runnable processes per
core now (the 1-minute load average over the CPUs), at least 1. A test then still checks what
happened (a stalled worker was ended, a healthy one was not), never how fast.
A deadline on a wait for an event is a guard against a hang, not a check: it scales too, so
a busy machine does not trip it.
"""

from __future__ import annotations

import math
import os


def slowness() -> float:
    """Runnable processes per core now (1-minute load average / CPUs), at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: assume an idle machine
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scaled(seconds: float) -> float:
    """`seconds` on an idle machine, stretched by how busy this one is now."""
    return seconds * slowness()


def scaled_s(seconds: float) -> int:
    """scaled(), in whole seconds (rounded up): for a setting that takes an integer."""
    return math.ceil(scaled(seconds))
