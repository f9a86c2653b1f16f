"""Shared test helpers: fakes, harnesses and case generators (no tests here)."""
