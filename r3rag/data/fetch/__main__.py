"""``python -m r3rag.data.fetch``: see :mod:`r3rag.data.fetch.cli`."""

from r3rag.cli import run_main
from r3rag.data.fetch.cli import main

run_main(main)
