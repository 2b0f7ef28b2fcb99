#!/usr/bin/env python
"""Write OpenRLHF's prompt file (``--data.prompt_dataset``) from a questions JSONL.

Reads FlashRAG (``id, question, golden_answers, metadata``) or R1-Searcher (``idx, question,
answer``) records; writes one ``{"question": ..., "label": "<JSON: id, golden_answers,
metadata>"}`` per line (r3rag.train.openrlhf.data), the keys the launch scripts pass as
``--data.input_key question --data.label_key label``. Written to a temporary file and renamed,
so an interrupted run leaves no half file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from r3rag.data.readers import read_questions
from r3rag.errors import R3RagError
from r3rag.train.openrlhf.data import prompt_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="questions JSONL (FlashRAG or R1-Searcher)")
    ap.add_argument("--out", required=True, help="OpenRLHF prompts JSONL to write")
    ap.add_argument("--limit", type=int, default=None, help="keep the first N questions")
    args = ap.parse_args(argv)
    try:
        rows = prompt_rows(read_questions(args.dataset, args.limit))
    except R3RagError as err:
        print(f"openrlhf_prompts.py: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    print(f"wrote {len(rows)} prompts to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
