"""The embedded engine: an SGLang-compatible subset of the HTTP API over a transformers model."""
