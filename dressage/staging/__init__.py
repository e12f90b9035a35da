"""Staging: artifacts on fsspec URLs, written in transactions with the manifest last."""

from dressage.staging.artifacts import Artifact, ArtifactWriter, open_artifact
from dressage.staging.manifest import MANIFEST_NAME, ArtifactError, Manifest
from dressage.staging.stage import StagedRun, StagingError, copy_artifact, stage_run
from dressage.staging.validation import validate_artifact

__all__ = [
    "MANIFEST_NAME",
    "Artifact",
    "ArtifactError",
    "ArtifactWriter",
    "Manifest",
    "StagedRun",
    "StagingError",
    "copy_artifact",
    "open_artifact",
    "stage_run",
    "validate_artifact",
]
