"""Lambda handlers: decorators plus a short body that calls one core function."""
