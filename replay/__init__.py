"""Transcripts in, bundles in and out (built by the replay issue). Uses the public API of `sessions`."""

__all__: list[str] = []
