"""Rollout artifacts: samples written from segments (writer.py, for Parquet artifacts, follows)."""

from dressage.rollout.artifacts.samples import write_sample_from_segment

__all__ = ["write_sample_from_segment"]
