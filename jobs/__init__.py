"""Flink entry points: thin wiring over ``operators``."""
