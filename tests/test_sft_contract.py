"""One rendering for SFT and RL: LLaMA-Factory's own preprocessing (its loader, sharegpt converter,
template and supervised processor, run in its environment) gives, token for token, the rollout's
ids and loss mask (end-of-turn convention of r3rag.train.sft.chat_slots).

- at every shipped SFT config's template, observation role and cutoff, on the shipped cold start's
  1-4 hop chains tokenised by the real SmolLM2 tokenizer; a cutoff one token below the longest
  chain must break the equality (the check can fail) and ``train/sft.py``'s length check refuses it.
  The 7-8B configs (``r3rag-llama3.1-8b``, ``r3rag-qwen2.5-7b``) name Llama's and Qwen's
  tokenizers, which are not available offline: their template (``r3rag``: cut from the model's own
  chat template) and cutoff run here with SmolLM2's, which checks their cutoff and role, not
  their tokenizer;
- for both trajectory formats (tiny tokenizer), both layouts (sharegpt, alpaca-per-step).
"""

from __future__ import annotations

import json

import pytest

from r3rag.config import load_config
from r3rag.rollout.backends.hf_loading import load_tokenizer
from r3rag.rollout.trajectory import Trajectory
from r3rag.testing.tiny_models import save_tiny_model
from r3rag.train.coldstart.builder import build_coldstart
from r3rag.train.coldstart.config import ColdStartConfig
from r3rag.train.coldstart.store import read_rows
from r3rag.train.sft.chat_slots import derive_slots, sft_view
from r3rag.train.sft.config import SFTConfig
from r3rag.train.sft.lengths import SFTDataError, check_lengths
from tests.sft_helpers import ROOT, lf_rows, make_world, require_lf_env, smollm2_tokenizer_dir

FORMATS = ("r3rag_steps", "r1searcher_tags")
SHIPPED_SFT = sorted((ROOT / "configs" / "sft").glob("*.yaml"))


def mismatched(rows: list[dict], trajs: list[Trajectory], eot: list[int]) -> list[int]:
    """Indices of the chains whose LLaMA-Factory ids or trained positions differ from the rollout's."""
    assert len(rows) == len(trajs)
    bad = []
    for k, (t, row) in enumerate(zip(trajs, rows)):
        ids, mask = sft_view(t, eot)
        if row["input_ids"] != ids or row["labels"] != [i if m else -100 for i, m in zip(ids, mask)]:
            bad.append(k)
    return bad


def _eot(tok) -> list[int]:
    return list(tok(derive_slots(tok).eot, add_special_tokens=False).input_ids)


# ---- the shipped configurations, SmolLM2's tokenizer ---------------------------------------------


@pytest.fixture(scope="module")
def smollm2_chains(tmp_path_factory):
    """The shipped world cold start (configs/coldstart/world-oracle.yaml: its profile, teacher
    variety and format) on 4 questions of each hop count 1-2 and 8 of each 3-4, in SmolLM2's tokens."""
    require_lf_env()
    root = tmp_path_factory.mktemp("shipped")
    tok_dir = smollm2_tokenizer_dir(root)
    world, index = make_world(root, size="small")
    qs = [json.loads(x) for x in (world / "train.jsonl").read_text().splitlines()]
    picked = [q for h, n in ((1, 4), (2, 4), (3, 8), (4, 8)) for q in [q for q in qs if q["metadata"]["hops"] == h][:n]]
    (root / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in picked))
    cfg = load_config(ColdStartConfig, ROOT / "configs/coldstart/world-oracle.yaml", [
        f"data.questions={root / 'q.jsonl'}", f"retriever.index_dir={index}", f"teacher.tokenizer={tok_dir}",
        "attempts.max_attempts=2", f"output.dir={root / 'cs'}", "output.progress=false"])
    build_coldstart(cfg)
    trajs = [Trajectory.from_dict(d) for d in read_rows(root / "cs", "trajectories")]
    return tok_dir, root / "cs", trajs, cfg.rollout.format


@pytest.mark.slow
def test_llamafactory_trains_the_rollout_tokens_at_every_shipped_sft_config(smollm2_chains, tmp_path):
    tok_dir, folder, trajs, fmt = smollm2_chains
    tok = load_tokenizer(str(tok_dir))
    eot = _eot(tok)
    lengths = [len(sft_view(t, eot)[0]) for t in trajs]
    assert {t.metadata["hops"] for t in trajs} >= {3, 4} and sum(t.metadata["hops"] >= 3 for t in trajs) >= 6
    assert max(lengths) > 1024  # the chains the former 1024-token cutoff cut are here
    longest = max(lengths)
    configs = {p.name: load_config(SFTConfig, p, [f"model={tok_dir}", f"data.dataset_dir={folder}"]) for p in SHIPPED_SFT}
    assert set(configs) >= {"world-smollm2-cpu.yaml", "r3rag-llama3.1-8b.yaml", "r3rag-qwen2.5-7b.yaml"}
    groups: dict[tuple[str, str], set[int]] = {}
    for cfg in configs.values():
        assert cfg.data.cutoff_len >= longest, f"a shipped cutoff {cfg.data.cutoff_len} cuts a {longest}-token chain"
        groups.setdefault((cfg.template, cfg.observation_role), set()).add(cfg.data.cutoff_len)
    mutation = longest - 1
    first = True
    for (template, role), cutoffs in groups.items():
        extra = (mutation,) if first else ()
        rows = lf_rows(folder, f"{fmt}_sharegpt", tmp_path / f"{template}-{role}.jsonl", tok_dir, template, role,
                       (*sorted(cutoffs), *extra))
        for name, cfg in configs.items():
            if (cfg.template, cfg.observation_role) == (template, role):
                assert mismatched(rows[cfg.data.cutoff_len], trajs, eot) == [], name
                # train/sft.py's own measurement is LLaMA-Factory's length, and passes the dataset
                report = check_lengths(cfg, tok_dir, tmp_path / name, tokenizer=tok)
                assert (report.examples, report.longest, report.longer) == (len(trajs), longest, 0)
        if first:  # the mutation: a cutoff that cuts the longest chain must break the equality
            assert mismatched(rows[mutation], trajs, eot) == [k for k, n in enumerate(lengths) if n > mutation] != []
            assert [len(r["input_ids"]) for r in rows[max(cutoffs)]] == lengths
            first = False
    cut = load_config(SFTConfig, SHIPPED_SFT[0], [f"model={tok_dir}", f"data.dataset_dir={folder}", f"data.cutoff_len={mutation}"])
    n_long = sum(n > mutation for n in lengths)
    with pytest.raises(SFTDataError, match=rf"^{n_long} of {len(trajs)} examples .* longer than data.cutoff_len {mutation} "
                       rf"\(longest {longest} tokens\)"):
        check_lengths(cut, tok_dir, tmp_path / "cut", tokenizer=tok)


# ---- both formats and layouts, a tiny tokenizer ------------------------------------------------


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


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_llamafactory_tokens_and_labels_equal_rollout(exported, fmt, tmp_path):
    require_lf_env()
    model, folders = exported
    tok = load_tokenizer(str(model))
    eot = _eot(tok)
    trajs = [Trajectory.from_dict(d) for d in read_rows(folders[fmt], "trajectories")]
    # both layouts in one LLaMA-Factory run: the sharegpt chains, then R3-RAG's alpaca-per-step rows
    both = lf_rows(folders[fmt], f"{fmt}_sharegpt,{fmt}_alpaca_steps", tmp_path / "rows.jsonl", model)[100_000]
    rows, steps = both[:len(trajs)], both[len(trajs):]
    assert mismatched(rows, trajs, eot) == []
    for t, row in zip(trajs, rows):
        ids, mask = sft_view(t, eot)
        # the convention only ever adds end-of-turn tokens to what the rollout trains on
        diff = [k for k, (a, b) in enumerate(zip(mask, t.loss_mask + [1] * (len(mask) - len(t.loss_mask)))) if a != b]
        assert all(ids[k] in eot for k in diff)
        if fmt == "r3rag_steps":
            assert ids == t.token_ids and mask == t.loss_mask  # the model generates its end-of-turn token
        # documents are never trained on
        for seg_start, seg in _env_spans(t):
            assert all(lab == -100 for lab in row["labels"][seg_start + len(eot): seg_start + len(seg.token_ids)])
    # R3-RAG's alpaca-per-step layout: one example per model turn
    assert len(steps) == sum(len(t.steps) for t in trajs)
    # train/sft.py measures both layouts as LLaMA-Factory does
    cfg = load_config(SFTConfig, None, [f"model={model}", f"data.dataset_dir={folders[fmt]}",
                                        f"data.dataset={fmt}_sharegpt,{fmt}_alpaca_steps"])
    report = check_lengths(cfg, model, tmp_path, tokenizer=tok)
    assert (report.examples, report.longest) == (len(both), max(len(r["input_ids"]) for r in both))


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
    model, folders = exported
    tok = load_tokenizer(str(model))
    trajs = [Trajectory.from_dict(d) for d in read_rows(folders["r3rag_steps"], "trajectories")]
    rows = lf_rows(folders["r3rag_steps"], "r3rag_steps_sharegpt", tmp_path / "rows.jsonl", model, template="chatml")[100_000]
    newline = tok("\n", add_special_tokens=False).input_ids
    assert len(mismatched(rows, trajs, _eot(tok))) == len(trajs)
    assert any(lab in newline for row in rows for lab in row["labels"] if lab != -100)
