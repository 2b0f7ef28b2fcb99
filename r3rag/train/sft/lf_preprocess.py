"""Run LLaMA-Factory's own data pipeline on an SFT folder and dump its input ids and labels.

    python -m r3rag.train.sft.lf_preprocess --model DIR --dataset-dir DIR --dataset NAME --out FILE.jsonl
    python -m r3rag.train.sft.lf_preprocess ... --cutoff-len 2064 --cutoff-len 4096 --out FILE.jsonl

Runs in LLaMA-Factory's environment: its dataset loader, converter (sharegpt/alpaca), template
(r3rag's, registered from the model's tokenizer, or any stock one with ``--template``) and
supervised processor, exactly as training would, once per ``--cutoff-len`` (default: none that
cuts) in one process. Each output line is ``{"cutoff_len": N, "input_ids": [...], "labels": [...]}``,
in dataset order per cutoff; the contract test compares them with the rollout's trajectories token
by token, and ``train/sft.py`` measures examples with a stock template this way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model (tokenizer) folder")
    ap.add_argument("--dataset-dir", required=True)
    ap.add_argument("--dataset", required=True, help="name registered in the folder's dataset_info.json")
    ap.add_argument("--template", default="r3rag")
    ap.add_argument("--observation-role", default="tool")
    ap.add_argument("--cutoff-len", type=int, action="append", help="repeatable (default: 100000, no cut)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
    if a.template == "r3rag":
        from r3rag.train.sft.lf_template import register_r3rag_template

        register_r3rag_template(a.model, observation_role=a.observation_role)
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp, open(a.out, "w", encoding="utf-8") as fh:
        for cutoff in a.cutoff_len or [100_000]:
            model_args, data_args, training_args, _, _ = get_train_args({
                "model_name_or_path": a.model, "stage": "sft", "do_train": True, "finetuning_type": "full",
                "dataset": a.dataset, "dataset_dir": a.dataset_dir, "template": a.template, "cutoff_len": cutoff,
                "output_dir": tmp, "overwrite_cache": True, "preprocessing_num_workers": None, "use_cpu": True,
                "report_to": "none", "overwrite_output_dir": True,
            })
            tokenizer_module = load_tokenizer(model_args)
            template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
            module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
            for row in module["train_dataset"]:
                fh.write(json.dumps({"cutoff_len": cutoff, "input_ids": list(row["input_ids"]),
                                     "labels": list(row["labels"])}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
