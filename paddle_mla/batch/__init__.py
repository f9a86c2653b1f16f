"""JSONL batches: parse input lines into requests, run them through an engine, write one record per line
(shared by the CLI and Ray Data)."""
