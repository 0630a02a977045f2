"""Benchmark scripts (not part of the test suite)."""
