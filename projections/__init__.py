"""Pure folds from events to read models, persisted next to the log (built by the engine issue).

Imports only `eventlog`.
"""

__all__: list[str] = []
