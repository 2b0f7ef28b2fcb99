"""The update-noise checks on tiny saved models: a pure-noise AdamW walk sits at the noise floor, a
constant-sign update at ``steps x lr``; the random-sign copy keeps every ``|delta|`` and loads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from r3rag.testing.tiny_models import save_tiny_model
from r3rag.train.rl.update_noise import adam_noise_floor, load_weights, main, run_update_summary, update_line, write_like

LR, STEPS = 1e-3, 4


def trained_run(tmp_path, start, how: str):
    """An RL-run-like folder (config.yaml, metrics.jsonl, final/) whose final/ is ``start`` moved by
    ``STEPS`` AdamW steps on every tensor but the embeddings (left frozen): on fresh Gaussian
    gradients (``noise``) or on one fixed gradient (``constant``)."""
    w = load_weights(start)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in w.items() if "embed" not in k}
    opt = torch.optim.AdamW(params.values(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    fixed = {k: torch.randn(p.shape, generator=gen) for k, p in params.items()}
    for _ in range(STEPS):
        for k, p in params.items():
            p.grad = fixed[k] if how == "constant" else torch.randn(p.shape, generator=gen)
        opt.step()
    moved = {k: params[k].detach() if k in params else v for k, v in w.items()}
    run = tmp_path / f"run-{how}"
    run.mkdir()
    write_like(start, moved, run / "final")
    (run / "config.yaml").write_text(f"algo:\n  lr: {LR}\n  betas: [0.9, 0.95]\n  schedule: constant\n")
    recs = [{"kind": "train", "step": i + 1, "batch/optimizer_steps": 1} for i in range(STEPS)] + [{"kind": "eval", "step": STEPS}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run, w, moved


def stats(capsys, start, run) -> dict:
    """The CLI's JSON summary."""
    assert main(["stats", str(start), str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture()
def start(tmp_path):
    return save_tiny_model(tmp_path / "start")


def test_noise_walk_sits_at_the_floor_and_a_constant_gradient_at_steps_x_lr(tmp_path, start, capsys):
    noise_run, w, _ = trained_run(tmp_path, start, "noise")
    s = stats(capsys, start, noise_run)
    frozen = sum(v.numel() for k, v in w.items() if "embed" in k)
    assert s["steps"] == STEPS and s["lr"] == LR and s["params"] == sum(v.numel() for v in w.values())
    assert s["moved"] == s["params"] - frozen  # the embeddings did not move
    assert s["mean_abs_delta"] == pytest.approx(s["noise_floor"], rel=0.05)
    assert s["consistency"] < 0.6

    assert s["at_noise_floor"] and "at the noise floor" in update_line(s)

    const_run, _, _ = trained_run(tmp_path, start, "constant")
    c = stats(capsys, start, const_run)
    assert not c["at_noise_floor"] and "above the noise floor" in update_line(c)
    assert c["mean_abs_delta"] == pytest.approx(STEPS * LR, rel=0.01) and c["consistency"] > 0.99
    assert c["mean_abs_delta"] > c["signal_1"] > c["noise_floor"]
    assert c["max_abs_delta"] == pytest.approx(STEPS * LR, rel=0.01)


def test_random_sign_copy_keeps_every_size_flips_about_half_and_loads(tmp_path, start, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, w, moved = trained_run(tmp_path, start, "noise")
    out = tmp_path / "flipped"
    assert main(["random-sign", str(start), str(run), "--out", str(out), "--seed", "3"]) == 0
    flipped = load_weights(out)
    agree = total = 0
    for k, a in w.items():
        d_trained, d_flipped = moved[k] - a, flipped[k] - a
        assert torch.allclose(d_flipped.abs(), d_trained.abs(), atol=1e-7), k
        if "embed" in k:
            assert torch.equal(flipped[k], a)  # a parameter that did not move stays
        else:
            agree += int((torch.sign(d_flipped) == torch.sign(d_trained)).sum())
            total += d_trained.numel()
    assert 0.45 < agree / total < 0.55
    AutoModelForCausalLM.from_pretrained(out)  # an HF folder every command takes as --model
    assert AutoTokenizer.from_pretrained(out) is not None
    # another seed, other signs; an existing --out is refused
    assert main(["random-sign", str(start), str(run), "--out", str(tmp_path / "f4"), "--seed", "4"]) == 0
    proj = next(k for k in w if "proj" in k)
    assert not torch.equal(load_weights(tmp_path / "f4")[proj], flipped[proj])
    assert main(["random-sign", str(start), str(run), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    # --scale 0.5: every |delta| halved, the same signs as the same seed at full size
    assert main(["random-sign", str(start), str(run), "--out", str(tmp_path / "half"), "--seed", "3", "--scale", "0.5"]) == 0
    half = load_weights(tmp_path / "half")
    assert torch.allclose(half[proj] - w[proj], 0.5 * (flipped[proj] - w[proj]), atol=1e-7)
    assert main(["random-sign", str(start), str(run), "--out", str(tmp_path / "zero"), "--scale", "0"]) == 2


def test_errors_are_clear(tmp_path, start, capsys):
    other = save_tiny_model(tmp_path / "other", arch="qwen2")
    assert main(["stats", str(start), str(other), "--lr", "1e-3", "--steps", "2"]) == 2
    assert "different tensors" in capsys.readouterr().err  # qwen2 has attention biases llama lacks
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["stats", str(start), str(empty), "--lr", "1e-3", "--steps", "2"]) == 2
    assert "no *.safetensors" in capsys.readouterr().err
    shutil.copytree(start, tmp_path / "copy")
    assert main(["stats", str(start), str(tmp_path / "copy")]) == 2  # a model folder, no run: lr and steps needed
    assert "--lr and --steps" in capsys.readouterr().err


def test_noise_floor_one_step_is_lr_and_needs_a_step():
    assert adam_noise_floor(1e-3, 1) == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ValueError):
        adam_noise_floor(1e-3, 0)


def test_run_summary_reads_the_start_from_the_run_config(tmp_path, start):
    run, _, _ = trained_run(tmp_path, start, "noise")
    with (run / "config.yaml").open("a") as f:
        f.write(f"model:\n  path: {start}\n")
    s = run_update_summary(run)
    assert s["start"] == str(start) and s["steps"] == STEPS and s["at_noise_floor"]
    (run / "config.yaml").write_text(f"algo:\n  lr: {LR}\n")  # no model.path: nothing to compare with
    from r3rag.errors import DataError

    with pytest.raises(DataError, match="model.path"):
        run_update_summary(run)


def test_run_settings_count_the_logged_optimizer_steps(tmp_path):
    # the loop logs batch/optimizer_steps = passes x steps per pass already: not multiplied again
    from r3rag.train.rl.update_noise import run_settings

    (tmp_path / "config.yaml").write_text("algo:\n  lr: 2.0e-5\n  epochs_per_batch: 2\n")
    recs = [{"kind": "train", "batch/optimizer_steps": 4}, {"kind": "eval"}, {"kind": "train", "batch/optimizer_steps": 4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert run_settings(tmp_path) == {"lr": 2e-5, "betas": (0.9, 0.95), "steps": 8}


def test_bf16_steps_move_exactly_n_weights_one_bf16_step_among_the_trained_ones(tmp_path, start, capsys):
    run, w, moved = trained_run(tmp_path, start, "noise")  # every tensor but the embeddings moved
    out = tmp_path / "probe"
    assert main(["bf16-steps", str(start), "--count", "50", "--among", str(run), "--out", str(out), "--seed", "3"]) == 0
    assert "with 50 of" in capsys.readouterr().out
    probe = load_weights(out)
    changed = 0
    for k, v in w.items():
        before, after = v.bfloat16(), probe[k].bfloat16()
        diff = before != after
        if "embed" in k:
            assert not diff.any()  # not moved by the trained model: never drawn
            assert torch.equal(probe[k], v)
            continue
        changed += int(diff.sum())
        # each changed weight is the next representable bfloat16 value above or below in magnitude
        steps = (after[diff].view(torch.int16).int() - before[diff].view(torch.int16).int()).abs()
        assert steps.tolist() == [1] * int(diff.sum())
        assert torch.equal(probe[k][~diff], v[~diff])  # the others are the very same float32 values
    assert changed == 50
    # both directions are drawn
    ups = sum(int((probe[k].bfloat16().float().abs() > v.bfloat16().float().abs()).sum()) for k, v in w.items())
    assert 10 < ups < 40
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_bf16_steps_draw_among_all_weights_and_refuse_a_count_too_large(tmp_path, start, capsys):
    w = load_weights(start)
    assert main(["bf16-steps", str(start), "--count", "7", "--out", str(tmp_path / "all")]) == 0
    capsys.readouterr()
    probe = load_weights(tmp_path / "all")
    assert sum(int((probe[k].bfloat16() != v.bfloat16()).sum()) for k, v in w.items()) == 7
    total = sum(int((v.bfloat16() != 0).sum()) for v in w.values() if v.is_floating_point())
    assert main(["bf16-steps", str(start), "--count", str(total + 1), "--out", str(tmp_path / "x")]) == 2
    assert f"between 1 and the {total:,} candidate weights" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_write_like_keeps_the_model_files_and_leaves_the_trainer_state(tmp_path, start):
    # a trainer's output folder: the model, plus the trainer's state, logs and a checkpoint folder
    trained = tmp_path / "trained"
    shutil.copytree(start, trained)
    for name in ("trainer_state.json", "training_args.bin", "all_results.json", "trainer_log.jsonl", "pipeline.log"):
        (trained / name).write_text("{}")
    (trained / "checkpoint-25").mkdir()
    (trained / "checkpoint-25" / "optimizer.pt").write_text("x")
    (trained / "chat_template.jinja").write_text("{{ messages }}")
    w = load_weights(trained)
    out = write_like(trained, {k: v + 1.0 for k, v in w.items()}, tmp_path / "copy")
    names = {p.name for p in out.iterdir()}
    assert "config.json" in names and "tokenizer_config.json" in names and "chat_template.jinja" in names
    assert names.isdisjoint({"trainer_state.json", "training_args.bin", "all_results.json", "trainer_log.jsonl",
                             "pipeline.log", "checkpoint-25"})
    assert names - {"model.safetensors"} == {p.name for p in start.iterdir() if p.suffix != ".safetensors"} | {"chat_template.jinja"}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    name = next(k for k in w if "q_proj" in k)
    assert torch.equal(dict(model.named_parameters())[name].detach(), w[name] + 1.0)
