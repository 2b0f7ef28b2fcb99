#!/usr/bin/env python
"""Fetch the benchmarks, training questions, wiki18 passages and e5 index (python -m r3rag.data.fetch).

    python data/download.py --list
    python data/download.py benchmarks train wiki18 e5-index
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import run_main  # noqa: E402
from r3rag.data.fetch.cli import main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
