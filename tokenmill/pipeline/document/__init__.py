"""The per-document stages (one document in, kept or removed with a reason): length,
quality (Gopher, C4, FineWeb) and language id. A new document stage is a module here
and one line in :data:`tokenmill.pipeline.run.stage_list.STAGES`."""
