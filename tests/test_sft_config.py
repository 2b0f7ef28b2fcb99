"""SFT config -> LLaMA-Factory YAML and launch command; chat slots and the end-of-turn convention."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3rag.config import load_config
from r3rag.errors import ConfigError
from r3rag.rollout.formats import get_format
from r3rag.rollout.trajectory import Segment, Step, Trajectory
from r3rag.rollout.tiny_tokenizer import build_tiny_tokenizer
from r3rag.train.sft.chat_slots import SlotError, derive_slots, encode_pieces, render_pieces, sft_view
from r3rag.train.sft.config import SFTConfig, llamafactory_args
from r3rag.train.sft.export import dataset_info, rendering_matches, to_sharegpt
from r3rag.train.sft.launch import check_dataset, command
from tests.sft_helpers import ROOT

CONFIGS = ROOT / "configs" / "sft"


@pytest.mark.parametrize("name,lr", [("r3rag-llama3.1-8b", 1e-5), ("r3rag-qwen2.5-7b", 7e-6)])
def test_gpu_recipes_are_r3rags(name, lr):
    cfg = load_config(SFTConfig, CONFIGS / f"{name}.yaml")
    args = llamafactory_args(cfg, "/models/x")
    assert args["finetuning_type"] == "full" and args["cutoff_len"] == 4096 and args["num_train_epochs"] == 3
    assert args["lr_scheduler_type"] == "cosine" and args["warmup_ratio"] == 0.1 and args["learning_rate"] == lr
    assert args["bf16"] is True and args["template"] == "r3rag"
    assert (ROOT / args["deepspeed"]).is_file() and '"stage": 3' in (ROOT / args["deepspeed"]).read_text()


def test_multi_node_launch_is_torchrun(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    cfg = load_config(SFTConfig, CONFIGS / "r3rag-qwen2.5-7b.yaml",
                      [f"launch.venv={venv}", "launch.nnodes=2", "launch.node_rank=1", "launch.master_addr=node0.cluster"])
    cmd = command(cfg, Path("x.yaml"))
    assert cmd[0].endswith("torchrun")
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--node_rank") + 1] == "1"
    assert cmd[cmd.index("--nproc_per_node") + 1] == "8" and cmd[cmd.index("--master_addr") + 1] == "node0.cluster"
    assert cmd[-3:] == ["-m", "r3rag.train.sft.lf_launch", "x.yaml"]
    single = command(load_config(SFTConfig, CONFIGS / "world-smollm2-cpu.yaml", [f"launch.venv={venv}"]), Path("x.yaml"))
    assert single == [str(venv / "bin" / "python"), "-m", "r3rag.train.sft.lf_launch", "x.yaml"]


def test_cpu_config_and_dataset_check(tmp_path):
    cfg = load_config(SFTConfig, CONFIGS / "world-smollm2-cpu.yaml", [f"data.dataset_dir={tmp_path}"])
    args = llamafactory_args(cfg, "m")
    assert args["use_cpu"] is True and args["disable_gradient_checkpointing"] is True
    assert args["r3rag_max_minutes"] == cfg.train.max_minutes
    with pytest.raises(ConfigError, match="no dataset_info.json"):
        check_dataset(cfg)
    (tmp_path / "dataset_info.json").write_text(__import__("json").dumps(dataset_info("r3rag_steps")))
    with pytest.raises(ConfigError, match="empty or missing"):
        check_dataset(cfg)
    (tmp_path / "sharegpt").mkdir()
    (tmp_path / "sharegpt" / "part-00000-of-00001.jsonl").write_text("{}\n")
    check_dataset(cfg)
    bad = cfg.model_copy(update={"data": cfg.data.model_copy(update={"dataset": "nope"})})
    with pytest.raises(ConfigError, match="not in"):
        check_dataset(bad)


def test_slots_cut_where_the_rollout_cuts():
    tok = build_tiny_tokenizer()
    s = derive_slots(tok)
    assert s.assistant == "{{content}}<|im_end|>" and s.eot == "<|im_end|>"
    assert s.observation.startswith("\n<|im_start|>") and s.observation.endswith("<|im_start|>assistant\n")
    assert s.user.endswith("<|im_start|>assistant\n") and s.system.startswith("<|im_start|>system\n")


def test_slots_refuse_a_template_without_eos_turn_end():
    tok = build_tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    with pytest.raises(SlotError):
        derive_slots(tok)


def _traj(fmt, tok, turns):
    """A hand-built chat trajectory: turns = [(model_text, documents_text | None)]."""
    from r3rag.data.records import Passage

    prompt = fmt.render_prompt("Who?")
    t = Trajectory("q", "Who?", fmt.name, [Segment("prompt", prompt, tok(prompt, add_special_tokens=False).input_ids)])
    text = prompt
    for i, (model, docs) in enumerate(turns):
        ids = tok(model, add_special_tokens=False).input_ids
        t.segments.append(Segment("model", model, ids))
        text += model
        parsed = fmt.parse_turn(model, i)
        step = Step(i, analysis=parsed.analysis, query=parsed.query, answer=parsed.answer, raw=model)
        if docs is not None:
            step.documents = [Passage("d", docs)]
            fb = fmt.feedback_text(text, step.documents, i)
            t.segments.append(Segment("env", fb, tok(fb, add_special_tokens=False).input_ids))
            text += fb
        t.steps.append(step)
    return t


def test_end_of_turn_convention_tags_format():
    tok = build_tiny_tokenizer()
    fmt = get_format("r1searcher_tags", mode="chat", tokenizer=tok)
    slots = derive_slots(tok)
    t = _traj(fmt, tok, [(fmt.render_turn(0, "look", query="who"), "Title\ntext"), (fmt.render_turn(1, "ok", answer="Bo"), None)])
    eot = tok("<|im_end|>", add_special_tokens=False).input_ids
    ids, mask = sft_view(t, eot)
    assert ids == t.token_ids + eot  # the last turn gets its end-of-turn token
    flipped = [k for k, (a, b) in enumerate(zip(mask, t.loss_mask)) if a != b]
    assert len(flipped) == 1 and ids[flipped[0]] == eot[0]  # the env-written end of the query turn
    assert rendering_matches(t, fmt, slots, tok)
    system, msgs = fmt.system_prompt, to_sharegpt(t, fmt)["conversations"]
    assert [m["from"] for m in msgs] == ["human", "gpt", "observation", "gpt"]
    assert "Title" in msgs[2]["value"] and all("Title" not in m["value"] for m in msgs if m["from"] == "gpt")
    pieces = render_pieces(slots, system, [{"role": {"human": "user", "gpt": "assistant"}.get(m["from"], "observation"),
                                            "content": m["value"]} for m in msgs])
    assert encode_pieces(tok, pieces) == (ids, mask)


def test_non_canonical_ids_are_caught():
    tok = build_tiny_tokenizer()
    fmt = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    t = _traj(fmt, tok, [(fmt.render_turn(0, "so", answer="Bo"), None)])
    assert rendering_matches(t, fmt, derive_slots(tok), tok)
    seg = t.segments[1]
    first = tok.convert_ids_to_tokens(seg.token_ids[0])
    split = [tok.convert_tokens_to_ids(ch) for ch in first]
    if len(first) < 2 or any(i is None or i == tok.unk_token_id for i in split):
        pytest.skip("first token cannot be split into single-character tokens")
    seg.token_ids = split + seg.token_ids[1:]  # same text, other ids: a teacher that sampled a rare split
    assert not rendering_matches(t, fmt, derive_slots(tok), tok)
