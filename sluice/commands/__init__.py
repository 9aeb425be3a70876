"""The `sluice` commands, one module a subsystem; each registers its subparsers and handlers (sluice.cli)."""
