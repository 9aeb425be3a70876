"""The sweep: stalled attempts, jobs left waiting, runs whose events were lost, uploads left in PLANNING."""
