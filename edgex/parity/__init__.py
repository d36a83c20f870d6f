"""Parity: run artifacts in real runtimes and compare them with the eager reference."""
