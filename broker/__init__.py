"""The broker's shared state: settings, the topic catalog, and the data directory (its file names,
its locks, the run directory). Imported by the flusher, the router, the workers and the operator
tooling; never by the client library."""
