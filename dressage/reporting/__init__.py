"""Reports of a finished run: the learning curves (PNG) and the end-of-run summary."""
