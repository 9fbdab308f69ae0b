"""The public session engine (built by the engine issue). Composes `eventlog` and `projections`."""

__all__: list[str] = []
