"""Fetch the public data r3rag evaluates and trains on (``python -m r3rag.data.fetch --help``).

:mod:`~r3rag.data.fetch.catalog` (what exists and where), :mod:`~r3rag.data.fetch.hub`
(resumable, checksummed downloads through huggingface_hub), :mod:`~r3rag.data.fetch.convert`
(atomic conversion to r3rag's files), :mod:`~r3rag.data.fetch.manifest` (sha256 and size of every
file), :mod:`~r3rag.data.fetch.fetcher` (plan, disk check, run), :mod:`~r3rag.data.fetch.cli`.
"""
