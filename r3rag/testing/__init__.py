"""Builders shared by tests and benchmarks (tiny random models, small fixtures)."""
