"""What operators run against a deployed stack or a local emulator: read-only views and reports.

dryrun (`sluice plan` / `submit`: the manifest Lambda's validation, scan and preflight, run
here), plan_report (the preflight table), status (`sluice status` / `sluice runs`), metrics
(`sluice metrics`: PromQL on AMP or Prometheus), recipe (`sluice output sql`), schemas (the
event details' JSON Schemas).
"""
