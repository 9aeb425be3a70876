"""What a rank reports: counters, Prometheus families and collector, remote write to AMP."""
