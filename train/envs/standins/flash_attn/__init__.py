"""CPU stand-in for ``flash_attn`` (see train/envs/standins/README.md); not the real package."""

__version__ = "0.0.0+r3rag.standin"
__r3rag_standin__ = True
