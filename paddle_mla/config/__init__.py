"""Typed configuration: the schema (YAML, `--set`, validation) and the backend capability table."""
