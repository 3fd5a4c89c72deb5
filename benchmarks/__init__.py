"""Benchmarks: scripts that print figures side by side. They assert nothing."""
