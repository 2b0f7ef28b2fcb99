"""benchmark/gpu_training.py, the GPU run of world -> cold start -> SFT -> RL, on the CPU.

The script's SFT stands in for LLaMA-Factory on a GPU machine: its loss must be the mean token
cross-entropy over the trained tokens only (model turns), whatever the padding. The whole script
runs here in its ``--tiny`` form (small world, tiny random model, one RL iteration) so the code
path the GPU run takes cannot rot unseen; the summary's paired difference is checked against the
two evaluation files it was computed from.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_training", ROOT / "benchmark" / "gpu_training.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sft_loss_is_the_mean_cross_entropy_of_the_trained_tokens_only():
    from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer

    gt = _script()
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok)
    # two chains of different lengths; mask 0 = prompt and documents, 1 = the model's turns
    a = ([5, 9, 14, 22, 31, 7, 8, 40], [0, 0, 1, 1, 0, 0, 1, 1])
    b = ([11, 12, 13, 50, 51], [0, 1, 1, 0, 1])
    loss = gt.sft_loss(model, [a, b], pad_id=0, device="cpu")
    nll, count = 0.0, 0
    for ids, mask in (a, b):  # unpadded, one chain at a time (no grad needed for the reference)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)  # [T, V]
        for t in range(1, len(ids)):
            if mask[t]:
                nll -= float(logp[t - 1, ids[t]])
                count += 1
    assert count == 7
    assert float(loss) == pytest.approx(nll / count, rel=1e-5)
    # a document token's identity changes the context but is never a target: the loss moves,
    # and it still averages over the same 7 trained tokens (no -100 leaks into the count)
    a_doc = ([5, 9, 14, 22, 99, 7, 8, 40], a[1])
    assert float(gt.sft_loss(model, [a_doc, b], pad_id=0, device="cpu")) != pytest.approx(float(loss))


@pytest.mark.slow
def test_the_tiny_run_goes_through_every_stage_and_pairs_its_two_evaluations(tmp_path):
    gt = _script()
    work = tmp_path / "gpu"
    assert gt.main(["--work", str(work), "--device", "cpu", "--tiny", "--threads", "1", "--bootstrap", "200"]) == 0
    s = json.loads((work / "summary.json").read_text())
    assert set(s["seconds"]) == {"world+index", "coldstart", "sft", "rl"}
    assert s["coldstart"]["kept"] > 0
    assert s["sft"]["steps"] == 3 and len(s["sft"]["losses"]) == 3
    assert (work / "sft" / "config.json").is_file()
    assert s["rl"]["evaluations"] == ["step_000000.jsonl", "step_000001.jsonl"]
    assert s["rl"]["iterations"] == 1
    rows = [[json.loads(x) for x in (work / "rl" / "eval" / name).read_text().splitlines()] for name in s["rl"]["evaluations"]]
    before = {r["id"]: r["scores"]["em"] for r in rows[0]}
    after = {r["id"]: r["scores"]["em"] for r in rows[1]}
    assert len(before) == len(after) == 4
    diff = s["rl"]["rl_minus_sft"]["em"]
    assert diff["n"] == 4
    assert diff["diff"] == pytest.approx(100 * sum(after[i] - before[i] for i in before) / 4)
    # a rerun skips the finished stages and answers the same
    assert gt.main(["--work", str(work), "--device", "cpu", "--tiny", "--threads", "1", "--bootstrap", "200"]) == 0
    again = json.loads((work / "summary.json").read_text())
    assert again["rl"]["rl_minus_sft"] == s["rl"]["rl_minus_sft"]
    assert again["sft"]["losses"] == s["sft"]["losses"]
