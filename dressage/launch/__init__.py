"""Launching runs: the launcher port (``base``; ``local`` processes, ``ray_jobs`` over the Ray
Jobs API), the embedded services, the training job's contract, preflight checks, and the slime
command builder (cluster) with its typed run settings."""
