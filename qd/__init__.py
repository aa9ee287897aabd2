"""qd: quality-diversity search with a JAX archive and LLM operators."""

__version__ = "0.1.0"
