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
def test_the_tiny_run_goes_through_every_stage_and_its_figures_are_the_rows(tmp_path):
    gt = _script()
    work = tmp_path / "gpu"
    args = ["--work", str(work), "--device", "cpu", "--tiny", "--threads", "1", "--bootstrap", "200"]
    assert gt.main(args) == 0
    s = json.loads((work / "summary.json").read_text())
    assert list(s["seconds"]) == ["world+index", "coldstart", "sft", "rl", "null-control", "eval"]
    assert "failed" not in s and s["coldstart"]["kept"] > 0
    assert s["sft"]["steps"] == 3 and len(s["sft"]["losses"]) == 3
    assert (work / "sft" / "config.json").is_file()
    assert s["rl"]["iterations"] == 1 and s["rl"]["optimizer_steps"] >= 1
    # RL's own check: its first training questions, before and after, each row with its reward
    checks = [[json.loads(x) for x in p.read_text().splitlines()] for p in sorted((work / "rl" / "eval").glob("step_*.jsonl"))]
    train_ids = {json.loads(x)["id"] for x in (work / "world" / "train.jsonl").read_text().splitlines()}
    assert len(checks) == 2 and all(len(c) == 2 and {r["id"] for r in c} <= train_ids for c in checks)
    assert s["rl"]["reward_check"]["n"] == 2
    assert s["rl"]["reward_check"]["diff"] == pytest.approx(sum(a["reward"] - b["reward"] for a, b in zip(*checks[::-1])) / 2,
                                                            abs=1e-4)
    # four evaluations on the same held-out dev questions; each figure is computed from their rows
    rows = {k: {r["id"]: r["scores"]["em"] for r in (json.loads(x) for x in (work / "eval" / k / "predictions.jsonl")
                                                     .read_text().splitlines())} for k in ("base", "sft", "rl", "null")}
    dev = {json.loads(x)["id"] for x in (work / "world" / "dev.jsonl").read_text().splitlines()}
    assert all(set(r) == set(rows["base"]) and len(r) == 4 and set(r) <= dev for r in rows.values())
    e = s["effects"]
    for key, (b, a) in {"sft_vs_base": ("sft", "base"), "rl_vs_sft": ("rl", "sft"), "rl_vs_null": ("rl", "null")}.items():
        assert e[key]["em"]["n"] == 4
        assert e[key]["em"]["diff"] == pytest.approx(100 * sum(rows[b][i] - rows[a][i] for i in rows["base"]) / 4), key
    # the null control is SFT moved by RL's update with random signs: |null - sft| == |rl - sft|
    from r3rag.train.rl.update_noise import load_weights

    w = {k: load_weights(work / p) for k, p in (("sft", "sft"), ("rl", "rl/final"), ("null", "rl/null-control"))}
    assert all(torch.allclose((w["null"][k] - w["sft"][k]).abs(), (w["rl"][k] - w["sft"][k]).abs(), atol=1e-6) for k in w["sft"])
    assert [c["name"] for c in e["claims"]] == ["sft_vs_base", "rl_training"]
    assert s["figures"][1].startswith("SFT - base: ") and s["figures"][3].startswith("RL - null control: ")
    # a rerun skips the finished stages and answers the same
    assert gt.main(args) == 0
    again = json.loads((work / "summary.json").read_text())
    assert again["effects"]["rl_vs_null"] == e["rl_vs_null"] and again["sft"]["losses"] == s["sft"]["losses"]


def test_a_failing_stage_is_named_in_the_summary_and_raises(tmp_path):
    gt = _script()
    work = tmp_path / "gpu"
    with pytest.raises(Exception):
        gt.main(["--work", str(work), "--device", "cpu", "--tiny", "--threads", "1", "--coldstart-limit", "0"])
    s = json.loads((work / "summary.json").read_text())
    assert s["failed"]["stage"] == "coldstart" and "effects" not in s
