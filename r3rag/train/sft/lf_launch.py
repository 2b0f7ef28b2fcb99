"""LLaMA-Factory's training entry with r3rag's template registered first (runs in its venv).

    python -m r3rag.train.sft.lf_launch TRAIN.yaml                 # one process (CPU, one GPU)
    torchrun --nproc_per_node 8 -m r3rag.train.sft.lf_launch TRAIN.yaml   # every rank registers it

``TRAIN.yaml`` is the LLaMA-Factory YAML that ``train/sft.py`` writes. When its ``template`` is
``r3rag``, the template is derived from ``model_name_or_path``'s tokenizer (observation role from
``R3RAG_OBSERVATION_ROLE``, default ``tool``) and registered before LLaMA-Factory's ``run_exp``.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import yaml

    with open(argv[0], encoding="utf-8") as fh:
        args = yaml.safe_load(fh)
    if args.get("template") == "r3rag":
        from r3rag.train.sft.lf_template import register_r3rag_template

        register_r3rag_template(args["model_name_or_path"], observation_role=os.environ.get("R3RAG_OBSERVATION_ROLE", "tool"))
    from llamafactory.train.tuner import run_exp

    run_exp(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
