"""tokenmill: the data side of an LLM pretraining stack.

Curate licensed corpora into modded-nanogpt token shards plus a datamix manifest,
build tokenizer legality tables and n-gram side models over them, and train on them.
"""

__version__ = "0.1.0"
