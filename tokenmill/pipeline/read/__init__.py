"""Reading: sources resolved to files, files read into documents and quarantine rows,
the source and per-document license gates, and text normalization."""
