"""Local mode: a moto server, the template's resources on it, and the real handlers."""
