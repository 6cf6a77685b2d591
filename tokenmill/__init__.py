"""tokenmill: the data side of an LLM pretraining stack.

Curate a datamix (curation config) into modded-nanogpt token shards plus a curation
manifest, build tokenizer legality tables and n-gram side models over them, mix curated
sources into a training mix (mix spec -> mix manifest -> modded-nanogpt export), and train.
"""

__version__ = "0.1.0"
