"""Launching training runs: the slime command builder (cluster) and its typed run settings."""
