"""Staging: artifacts on fsspec URLs, written in transactions with the manifest last."""

from dressage.staging.artifacts import Artifact, ArtifactWriter, open_artifact
from dressage.staging.manifest import MANIFEST_NAME, ArtifactError, Manifest
from dressage.staging.validation import validate_artifact

__all__ = [
    "MANIFEST_NAME",
    "Artifact",
    "ArtifactError",
    "ArtifactWriter",
    "Manifest",
    "open_artifact",
    "validate_artifact",
]
