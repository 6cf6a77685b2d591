"""Post-steps over a finished output folder (they read only what a run leaves behind):
the curation report (``report.html`` and its plots) and the curated text in the
Hugging Face Hub layout."""
