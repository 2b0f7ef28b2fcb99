"""One rendering for SFT and RL: LLaMA-Factory's own preprocessing (its loader, sharegpt converter,
template and supervised processor, run in its environment) gives, token for token, the rollout's
ids and loss mask (end-of-turn convention of r3rag.train.sft.chat_slots) for both formats."""

from __future__ import annotations

import json
import subprocess

import pytest

from r3rag.config import load_config
from r3rag.rollout.backends.hf_loading import load_tokenizer
from r3rag.rollout.trajectory import Trajectory
from r3rag.testing.tiny_models import save_tiny_model
from r3rag.train.coldstart.builder import build_coldstart
from r3rag.train.coldstart.config import ColdStartConfig
from r3rag.train.coldstart.store import read_rows
from r3rag.train.sft.chat_slots import derive_slots, sft_view
from tests.sft_helpers import ROOT, make_world, require_lf_env

FORMATS = ("r3rag_steps", "r1searcher_tags")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Oracle cold-start folders (both formats) tokenised with a tiny model's tokenizer."""
    root = tmp_path_factory.mktemp("contract")
    w, idx = make_world(root)
    model = save_tiny_model(root / "model")
    out = {}
    for fmt in FORMATS:
        cfg = load_config(ColdStartConfig, None, [
            f"data.questions={w / 'train.jsonl'}", "data.limit=12", f"retriever.index_dir={idx}",
            f"teacher.tokenizer={model}", f"rollout.format={fmt}", f"output.dir={root / fmt}", "output.progress=false"])
        summary = build_coldstart(cfg)
        assert summary["kept"] >= 5
        out[fmt] = root / fmt
    return model, out


def _lf_rows(py, model, folder, dataset, tmp_path, template="r3rag"):
    dump = tmp_path / f"{dataset}-{template}.jsonl"
    r = subprocess.run([str(py), "-m", "r3rag.train.sft.lf_preprocess", "--model", str(model), "--dataset-dir", str(folder),
                        "--dataset", dataset, "--template", template, "--out", str(dump)],
                       capture_output=True, text=True, cwd=str(ROOT), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in dump.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_llamafactory_tokens_and_labels_equal_rollout(exported, fmt, tmp_path):
    py = require_lf_env()
    model, folders = exported
    tok = load_tokenizer(str(model))
    eot = list(tok(derive_slots(tok).eot, add_special_tokens=False).input_ids)
    trajs = [Trajectory.from_dict(d) for d in read_rows(folders[fmt], "trajectories")]
    rows = _lf_rows(py, model, folders[fmt], f"{fmt}_sharegpt", tmp_path)
    assert len(rows) == len(trajs)
    for t, row in zip(trajs, rows):
        ids, mask = sft_view(t, eot)
        assert row["input_ids"] == ids
        assert row["labels"] == [i if m else -100 for i, m in zip(ids, mask)]
        # the convention only ever adds end-of-turn tokens to what the rollout trains on
        diff = [k for k, (a, b) in enumerate(zip(mask, t.loss_mask + [1] * (len(mask) - len(t.loss_mask)))) if a != b]
        assert all(ids[k] in eot for k in diff)
        if fmt == "r3rag_steps":
            assert ids == t.token_ids and mask == t.loss_mask  # the model generates its end-of-turn token
        # documents are never trained on
        for seg_start, seg in _env_spans(t):
            assert all(lab == -100 for lab in row["labels"][seg_start + len(eot): seg_start + len(seg.token_ids)])
    # R3-RAG's alpaca-per-step layout goes through LLaMA-Factory too: one example per model turn
    steps = _lf_rows(py, model, folders[fmt], f"{fmt}_alpaca_steps", tmp_path)
    assert len(steps) == sum(len(t.steps) for t in trajs)


def _env_spans(t):
    pos = 0
    for seg in t.segments:
        if seg.role == "env":
            yield pos, seg
        pos += len(seg.token_ids)


@pytest.mark.slow
def test_stock_chatml_template_would_not_match(exported, tmp_path):
    """Why r3rag registers its own template: stock chatml trains on the newline after every
    end-of-turn token, which the rollout writes as environment text."""
    py = require_lf_env()
    model, folders = exported
    tok = load_tokenizer(str(model))
    trajs = [Trajectory.from_dict(d) for d in read_rows(folders["r3rag_steps"], "trajectories")]
    rows = _lf_rows(py, model, folders["r3rag_steps"], "r3rag_steps_sharegpt", tmp_path, template="chatml")
    newline = tok("\n", add_special_tokens=False).input_ids
    mismatched = sum(1 for t, row in zip(trajs, rows)
                     if row["labels"] != [i if m else -100 for i, m in zip(t.token_ids, t.loss_mask)])
    assert mismatched == len(trajs)
    assert any(lab in newline for row in rows for lab in row["labels"] if lab != -100)
