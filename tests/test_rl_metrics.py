"""Bookkeeping of the RL loop: metrics records cut back on resume, curves, data order,
micro-batches by token budget, checkpoint folders that are whole or absent."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from r3rag.errors import ConfigError
from r3rag.train.rl.batch import micro_batches
from r3rag.train.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from r3rag.train.rl.loop import BalancedOrder, DataOrder, data_order
from r3rag.train.rl.metrics import MetricsLog, read_records
from r3rag.train.rl.plots import plot_curves


def test_resume_cuts_records_after_the_checkpoint_and_curves_are_drawn(tmp_path):
    log = MetricsLog(tmp_path, 0, tensorboard=True)
    log.write({"step": 0, "kind": "eval", "eval/em": 10.0})
    for s in range(1, 5):
        log.write({"step": s, "kind": "train", "reward/total": 0.1 * s, "kl/mean": 0.01, "time/rollout": 1.0, "stop/answered": 0.5})
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "kind": "tr')  # a write killed half-way
    log = MetricsLog(tmp_path, 2, tensorboard=False)  # resume from the checkpoint after 2 iterations
    log.write({"step": 3, "kind": "train", "reward/total": 0.9})
    log.close()
    recs = read_records(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in recs] == [(0, "eval"), (1, "train"), (2, "train"), (3, "train")]
    assert recs[-1]["reward/total"] == 0.9
    png = plot_curves(tmp_path)
    assert png is not None and png.stat().st_size > 10_000


def test_data_order_is_a_function_of_the_iteration():
    a, b = DataOrder(10, seed=3), DataOrder(10, seed=3)
    first_epoch = [i for it in range(5) for i in a.indices(it, 2)]
    assert sorted(first_epoch) == list(range(10))  # every question once per epoch
    assert b.indices(7, 2) == a.indices(7, 2)  # no state: a resumed run draws the same questions
    assert DataOrder(10, seed=4).indices(0, 10) != a.indices(0, 10)


def test_a_balanced_order_gives_every_hop_count_the_same_share_of_each_iteration():
    # a split like the world's: 2-hop questions are the majority (7 of 10 here)
    hops = [2, 2, 1, 2, 2, 3, 2, 2, 1, 2]
    qs = [SimpleNamespace(metadata={"hops": h}) for h in hops]
    order = data_order(qs, seed=0, balance_by="hops")
    assert isinstance(order, BalancedOrder)
    for it in range(6):
        picks = order.indices(it, 3)
        assert sorted(hops[i] for i in picks) == [1, 2, 3]  # one of each stratum per iteration of 3
    drawn = Counter(i for it in range(14) for i in order.indices(it, 3))  # 14 draws per stratum
    assert {i for i in drawn if hops[i] == 2} == {i for i, h in enumerate(hops) if h == 2}  # every 2-hop question seen
    assert drawn[5] == 14  # the one 3-hop question repeats once per round
    assert [drawn[i] for i in (2, 8)] == [7, 7]  # the two 1-hop questions share their 14 draws
    again = data_order(qs, seed=0, balance_by="hops")
    assert again.indices(9, 3) == order.indices(9, 3)  # a function of the iteration: resume draws the same
    assert data_order(qs, seed=1, balance_by="hops").indices(0, 30) != order.indices(0, 30)
    plain = data_order(qs, seed=0, balance_by=None)
    assert Counter(hops[i] for i in plain.indices(0, 10)) == Counter(hops)  # unbalanced: the split's shares


def test_a_balanced_order_names_the_missing_key():
    qs = [SimpleNamespace(metadata={"hops": 1}), SimpleNamespace(metadata={})]
    with pytest.raises(ConfigError, match=r"1 of 2 training questions have no metadata\['hops'\]"):
        data_order(qs, seed=0, balance_by="hops")


def test_micro_batches_respect_the_token_budget():
    lengths = [100, 30, 90, 40, 35, 300]
    mbs = micro_batches(lengths, 200)
    assert sorted(i for mb in mbs for i in mb) == list(range(6))
    for mb in mbs:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 200
    assert [5] in mbs  # longer than the budget: alone


def test_checkpoint_is_whole_or_absent(tmp_path):
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, 1, {"policy": lin, "optimizer": opt}, {"seed": 0})
    (tmp_path / "checkpoints" / "iter_000002.tmp").mkdir()  # killed while writing the next one
    save_checkpoint(tmp_path, 3, {"policy": lin, "optimizer": opt}, {"seed": 0}, keep=2)
    r = torch.rand(1)  # the first draw after the checkpoint
    ck = latest_checkpoint(tmp_path)
    assert ck.name == "iter_000003" and not (tmp_path / "checkpoints" / "iter_000002.tmp").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_000001", "iter_000003"]
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    state = load_checkpoint(ck, {"policy": fresh, "optimizer": fresh_opt})
    assert state["completed"] == 3 and torch.equal(fresh.weight, lin.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == 1
    assert torch.equal(torch.rand(1), r)  # the RNG state saved at checkpoint time came back
    json.dumps(state)


def test_a_run_killed_before_its_first_checkpoint_logs_its_start_evaluation_once(tmp_path, monkeypatch):
    """Seen on a GPU: a run that died in its first iteration (out of memory) had logged its start
    evaluation; the rerun starts from scratch and logs it again. metrics.jsonl must hold it once."""
    from r3rag.train.rl.loop import RLTrainer
    from tests.rl_helpers import QUESTIONS, tiny_cfg, tiny_trainer

    def trainer():
        cfg = tiny_cfg("group_norm", iterations=2)
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"eval_at_start": True, "eval_at_end": False})})
        t = tiny_trainer(cfg, tmp_path)
        t._eval_questions = QUESTIONS[:2]
        return t

    real = RLTrainer.iteration

    def dies(self, it):
        raise MemoryError("out of memory in the first update")

    monkeypatch.setattr(RLTrainer, "iteration", dies)
    with pytest.raises(MemoryError):
        trainer().run()
    assert [(r["step"], r["kind"]) for r in read_records(tmp_path / "metrics.jsonl")] == [(0, "eval")]
    monkeypatch.setattr(RLTrainer, "iteration", real)
    trainer().run()
    recs = read_records(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in recs] == [(0, "eval"), (1, "train"), (2, "train")]


def test_time_budget_and_end_evaluation_are_wired_into_the_loop(tmp_path, monkeypatch):
    import r3rag.train.rl.loop as loop
    from tests.rl_helpers import QUESTIONS, tiny_cfg, tiny_trainer

    def run(name, **train):
        cfg = tiny_cfg("group_norm", iterations=3)
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})
        t = tiny_trainer(cfg, tmp_path / name)
        t._eval_questions = QUESTIONS[:2]
        t.run()
        steps = [r["step"] for r in read_records(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"]
        evals = sorted(p.name for p in (tmp_path / name / "eval").glob("step_*.jsonl")) if (tmp_path / name / "eval").is_dir() else []
        return steps, evals

    assert run("plain") == ([1, 2, 3], ["step_000003.jsonl"])
    assert run("no-end-eval", eval_at_end=False) == ([1, 2, 3], [])
    # the budget is judged by the last iteration's length: when the next one would not fit, stop now
    calls = []
    monkeypatch.setattr(loop, "next_iteration_fits", lambda elapsed, last, limit: calls.append(limit) or False)
    assert run("budget", max_minutes=5.0) == ([1], ["step_000001.jsonl"])
    assert calls == [5.0]


def test_a_run_stopped_for_time_stays_stopped_after_a_kill(tmp_path, monkeypatch):
    """The budget spans kills: the checkpoint keeps the training time spent and the last
    iteration's length, and a rerun judges the next iteration with them instead of starting a
    fresh budget (which once trained a stopped run for another 15 minutes)."""
    import shutil

    import r3rag.train.rl.loop as loop
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    seen, fits = [], {"answer": False}
    monkeypatch.setattr(loop, "next_iteration_fits", lambda elapsed, last, limit: seen.append((elapsed, last, limit)) or fits["answer"])
    cfg = tiny_cfg("group_norm", iterations=3)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_minutes": 5.0})})
    out = tmp_path / "run"

    def train_steps():
        return [r["step"] for r in read_records(out / "metrics.jsonl") if r["kind"] == "train"]

    def killed_before_the_final_folder():
        shutil.rmtree(out / "final")
        (out / "DONE").unlink()
        seen.clear()

    tiny_trainer(cfg, out).run()
    state = json.loads((latest_checkpoint(out) / "state.json").read_text())
    assert train_steps() == [1] and state["completed"] == 1
    assert state["train_s"] >= state["last_iteration_s"] > 0
    killed_before_the_final_folder()
    tiny_trainer(cfg, out).run()
    assert seen == [(state["train_s"], state["last_iteration_s"], 5.0)]  # judged once, with the saved times
    assert train_steps() == [1] and (out / "final" / "config.json").is_file()
    # a raised budget (here: the check says it fits) goes on, the time already spent still counted
    killed_before_the_final_folder()
    fits["answer"] = True
    tiny_trainer(cfg, out).run()
    assert train_steps() == [1, 2, 3]
    assert seen[0] == (state["train_s"], state["last_iteration_s"], 5.0)
    assert seen[1][0] >= state["train_s"] + seen[1][1]  # elapsed after the first resumed iteration includes the earlier training
    # a checkpoint written before these keys existed: a fresh budget, as before
    state_file = latest_checkpoint(out) / "state.json"
    old = {k: v for k, v in json.loads(state_file.read_text()).items() if k not in ("train_s", "last_iteration_s")}
    state_file.write_text(json.dumps(old))
    killed_before_the_final_folder()
    fits["answer"] = False
    tiny_trainer(cfg, out).run()
    assert seen == [(0.0, 0.0, 5.0)]


def test_a_finished_run_goes_on_when_its_iterations_or_minutes_are_raised(tmp_path, monkeypatch):
    """Rerunning a finished run returns its final folder; with ``train.iterations`` or
    ``train.max_minutes`` raised it continues from its last checkpoint (no iteration repeated, the
    final folder rewritten); without checkpoints (the quickstart deletes them) it stays finished."""
    import shutil

    import r3rag.train.rl.loop as loop
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    def with_train(cfg, **kw):
        return cfg.model_copy(update={"train": cfg.train.model_copy(update=kw)})

    def train_steps():
        return [r["step"] for r in read_records(out / "metrics.jsonl") if r["kind"] == "train"]

    out = tmp_path / "run"
    cfg = tiny_cfg("group_norm", iterations=2)
    tiny_trainer(cfg, out).run()
    assert train_steps() == [1, 2] and (out / "DONE").is_file()
    first_final = (out / "final" / "model.safetensors").stat().st_mtime_ns
    assert tiny_trainer(cfg, out).room_to_continue() is None
    tiny_trainer(cfg, out).run()  # the same settings: nothing runs
    assert train_steps() == [1, 2] and (out / "final" / "model.safetensors").stat().st_mtime_ns == first_final

    more = with_train(cfg, iterations=4)
    assert "finished after 2 iterations" in tiny_trainer(more, out).room_to_continue()
    tiny_trainer(more, out).run()
    assert train_steps() == [1, 2, 3, 4] and (out / "DONE").is_file()
    assert (out / "final" / "model.safetensors").stat().st_mtime_ns != first_final
    assert json.loads((latest_checkpoint(out) / "state.json").read_text())["completed"] == 4

    # the time budget: a run stopped for time stays stopped until the budget allows another iteration
    fits = {"answer": False}
    monkeypatch.setattr(loop, "next_iteration_fits", lambda elapsed, last, limit: fits["answer"])
    timed = with_train(cfg, iterations=10, max_minutes=5.0)
    out = tmp_path / "timed"
    tiny_trainer(timed, out).run()
    assert train_steps() == [1]
    assert tiny_trainer(timed, out).room_to_continue() is None
    fits["answer"] = True  # as if train.max_minutes had been raised
    calls = {"n": 0}

    def fits_twice(elapsed, last, limit):
        calls["n"] += 1
        # yes to: the check before continuing, the loop's own check on resume, the one after
        # iteration 2; no after iteration 3
        return calls["n"] <= 3

    monkeypatch.setattr(loop, "next_iteration_fits", fits_twice)
    tiny_trainer(timed, out).run()
    assert train_steps() == [1, 2, 3]
    # checkpoints deleted: finished for good, whatever the settings
    shutil.rmtree(out / "checkpoints")
    assert tiny_trainer(with_train(timed, iterations=20), out).room_to_continue() is None


def test_a_bf16_rollout_copy_generates_with_the_weights_of_each_iteration(tmp_path):
    """``model.rollout_weights: bfloat16``: the rollout's model is a separate bf16 copy, and every
    rollout runs with the trainer's current weights (reloaded after each update), never stale ones."""
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    cfg = tiny_cfg("group_norm", iterations=3)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"rollout_weights": "bfloat16"})})
    t = tiny_trainer(cfg, tmp_path / "copy")
    seen = []
    inner = t._rollout

    def rollout(it):
        gen, pol = dict(t.backend.model.named_parameters()), dict(t.models.policy.named_parameters())
        seen.append({
            "separate": t.backend.model is not t.models.policy,
            "dtype": {p.dtype for p in gen.values()},
            "stale": max(float((gen[k].float() - pol[k].detach().to(torch.bfloat16).float()).abs().max()) for k in pol),
            "embed": pol["model.embed_tokens.weight"].detach().clone(),
        })
        return inner(it)

    t._rollout = rollout
    t.run()
    assert len(seen) == 3
    assert all(s["separate"] and s["dtype"] == {torch.bfloat16} for s in seen)
    assert [s["stale"] for s in seen] == [0.0, 0.0, 0.0]  # the copy equals the trainer's weights, rounded to bf16
    assert not torch.equal(seen[0]["embed"], seen[2]["embed"])  # ... which the updates did move
    assert next(t.models.policy.parameters()).dtype == torch.float32  # the trainer's own weights stay float32


@pytest.mark.parametrize("compute,expected", [("bfloat16", "bfloat16"), ("float32", "shared")])
def test_auto_rollout_weights_is_a_bf16_copy_only_when_the_cpu_computes_in_bf16(tmp_path, compute, expected):
    """``model.rollout_weights: auto`` (the default): a bf16 copy on a CPU whose compute dtype is
    bfloat16 (no per-step weight casts), the trainer's own model otherwise."""
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    cfg = tiny_cfg("group_norm", iterations=1)
    assert cfg.model.rollout_weights == "auto"
    cfg.model.compute_dtype = compute
    t = tiny_trainer(cfg, tmp_path / compute)
    t._build()
    assert t.rollout_weights == expected
    if expected == "bfloat16":
        assert t.backend.model is not t.models.policy and next(t.backend.model.parameters()).dtype == torch.bfloat16
        assert t.backend.autocast_dtype is None  # the copy needs no autocast
    else:
        assert t.backend.model is t.models.policy and t.backend.autocast_dtype is None  # float32: no autocast either


def test_a_vllm_rollout_starts_from_a_saved_folder_and_gets_the_trainers_weights_every_iteration(tmp_path, monkeypatch):
    """``model.rollout_backend: vllm``: the engine (here a stand-in that, like vLLM, holds its own
    copy of the model) starts from an HF folder of the starting weights, with the trainer's dtype,
    the run's seed and the configured engine arguments; before every rollout it is sent the
    trainer's current weights, so no rollout samples with stale ones."""
    from transformers import AutoModelForCausalLM

    from r3rag.rollout.backends import vllm as vllm_backend
    from r3rag.rollout.backends.hf import HFBackend
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    started, sent = [], []

    class OwnCopyEngine(HFBackend):
        def __init__(self, model, tokenizer=None, **kwargs):
            started.append((model, kwargs))
            super().__init__(AutoModelForCausalLM.from_pretrained(model), tokenizer)  # its own copy, read from the folder

        def update_weights(self, state_dict=None):
            sent.append({k: v.detach().clone() for k, v in state_dict.items()})
            self.model.load_state_dict(state_dict)
            self.clear_cache()

    monkeypatch.setattr(vllm_backend, "VLLMBackend", OwnCopyEngine)
    cfg = tiny_cfg("group_norm", iterations=3)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"rollout_backend": "vllm",
                                                                       "rollout_engine_kwargs": {"enforce_eager": True}})})
    t = tiny_trainer(cfg, tmp_path / "vllm")
    start = {k: v.detach().clone() for k, v in t._model.state_dict().items()}
    seen = []
    inner = t._rollout

    def rollout(it):
        gen, pol = t.backend.model.state_dict(), t.models.policy.state_dict()
        seen.append({"separate": t.backend.model is not t.models.policy,
                     "stale": max(float((gen[k] - pol[k]).abs().max()) for k in pol)})
        return inner(it)

    t._rollout = rollout
    t.run()
    (folder, kwargs), = started
    assert folder == str(tmp_path / "vllm" / "rollout-init")
    assert kwargs == {"dtype": "float32", "seed": cfg.train.seed, "enforce_eager": True}
    saved = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert all(torch.equal(saved[k], start[k]) for k in start)  # the folder holds the starting weights
    assert len(sent) == 3 and len(seen) == 3  # one weight transfer before each rollout
    assert all(s["separate"] for s in seen) and [s["stale"] for s in seen] == [0.0, 0.0, 0.0]
    key = "model.embed_tokens.weight"
    assert torch.equal(sent[0][key], start[key]) and not torch.equal(sent[2][key], start[key])  # the updates moved it


def test_the_rollout_generates_on_the_trainers_thread_unless_told_otherwise(tmp_path):
    """model.rollout_inline (default true): the HF rollout runs on the trainer's thread (one OpenMP
    team for generation and update); false gives the older worker-thread rollout, for both the
    shared model and the bf16 copy."""
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    cfg = tiny_cfg("group_norm", iterations=1)
    tr = tiny_trainer(cfg, tmp_path / "inline")
    tr._build()
    assert tr.backend.inline is True
    cfg2 = tiny_cfg("group_norm", iterations=1)
    cfg2.model.rollout_inline = False
    cfg2.model.rollout_weights = "bfloat16"
    tr2 = tiny_trainer(cfg2, tmp_path / "thread")
    tr2._build()
    assert tr2.backend.inline is False and tr2.backend.model is not tr2.models.policy
