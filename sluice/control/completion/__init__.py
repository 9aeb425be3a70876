"""The completion Lambda's side: record a Batch job state change, decide the run's outcome or its retry pass."""
