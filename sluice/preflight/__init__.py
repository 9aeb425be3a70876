"""`sluice plan`'s preflight: a run checked against every published limit it will meet, and priced."""

from sluice.preflight.checks import Check, Preflight, preflight
from sluice.preflight.facts import Capacity, RunFacts

__all__ = ["Capacity", "Check", "Preflight", "RunFacts", "preflight"]
