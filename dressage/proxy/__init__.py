"""The recording proxy: an OpenAI-compatible front of the inference engine."""
