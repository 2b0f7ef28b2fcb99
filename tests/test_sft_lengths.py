"""train/sft.py never lets LLaMA-Factory cut an example: a dataset with one longer than
data.cutoff_len is refused (one line, exit 2) unless data.drop_longer leaves those out and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.config import load_config
from r3rag.rollout.backends.hf_loading import load_tokenizer
from r3rag.testing.tiny_models import save_tiny_model
from r3rag.train.sft.chat_slots import derive_slots, encode_pieces, render_pieces
from r3rag.train.sft.config import SFTConfig
from r3rag.train.sft.export import write_dataset_info
from r3rag.train.sft.lengths import DATA_FOLDER, SFTDataError, check_lengths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny model and a sharegpt folder of three chains of growing length, with their lengths."""
    root = tmp_path_factory.mktemp("lengths")
    model = save_tiny_model(root / "model")
    tok = load_tokenizer(str(model))
    slots = derive_slots(tok)
    folder = root / "data"
    (folder / "sharegpt").mkdir(parents=True)
    rows, lengths = [], []
    for k in (1, 4, 12):
        conv = [{"from": "human", "value": "Who founded the mill?"}]
        for i in range(k):
            conv += [{"from": "gpt", "value": f"Step {i + 1}: search the founder."},
                     {"from": "observation", "value": "Doc: the mill was founded by someone. " * 3}]
        conv.append({"from": "gpt", "value": "The final answer: someone"})
        rows.append({"id": f"q{k}", "system": "Answer step by step.", "conversations": conv})
        msgs = [{"role": {"human": "user", "gpt": "assistant"}.get(m["from"], "observation"), "content": m["value"]}
                for m in conv]
        lengths.append(len(encode_pieces(tok, render_pieces(slots, "Answer step by step.", msgs))[0]))
    (folder / "sharegpt" / "part-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_dataset_info(folder, "r3rag_steps")
    return model, folder, lengths


def _cfg(model, folder, out, *sets):
    return load_config(SFTConfig, None, [f"model={model}", f"data.dataset_dir={folder}", f"output_dir={out}", *sets])


def test_a_dataset_within_the_cutoff_trains_as_it_is(data, tmp_path):
    model, folder, lengths = data
    report = check_lengths(_cfg(model, folder, tmp_path, f"data.cutoff_len={max(lengths)}"), model, tmp_path)
    assert (report.examples, report.longest, report.longer, report.dropped) == (3, max(lengths), 0, 0)
    assert report.dataset_dir == str(folder)


def test_a_longer_example_is_refused_naming_count_longest_and_cutoff(data, tmp_path):
    model, folder, lengths = data
    cutoff = sorted(lengths)[1]  # the middle chain fits exactly; only the longest is over it
    with pytest.raises(SFTDataError, match=rf"^1 of 3 examples in r3rag_steps_sharegpt .* longer than data.cutoff_len "
                       rf"{cutoff} \(longest {max(lengths)} tokens\).*data.drop_longer=true"):
        check_lengths(_cfg(model, folder, tmp_path, f"data.cutoff_len={cutoff}"), model, tmp_path)
    assert not (tmp_path / DATA_FOLDER).exists()


def test_drop_longer_trains_on_the_rest_from_its_own_folder(data, tmp_path):
    model, folder, lengths = data
    cutoff = sorted(lengths)[1]
    report = check_lengths(_cfg(model, folder, tmp_path, f"data.cutoff_len={cutoff}", "data.drop_longer=true"), model, tmp_path)
    assert (report.examples, report.longer, report.dropped) == (3, 1, 1)
    kept = Path(report.dataset_dir)
    assert kept == tmp_path / DATA_FOLDER
    rows = [json.loads(x) for x in (kept / "r3rag_steps_sharegpt.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q4"]
    info = json.loads((kept / "dataset_info.json").read_text())
    assert info["r3rag_steps_sharegpt"]["file_name"] == "r3rag_steps_sharegpt.jsonl"
    assert info["r3rag_steps_sharegpt"]["formatting"] == "sharegpt"
    # the same again (a resumed run) gives the same folder
    check_lengths(_cfg(model, folder, tmp_path, f"data.cutoff_len={cutoff}", "data.drop_longer=true"), model, tmp_path)
    assert [json.loads(x)["id"] for x in (kept / "r3rag_steps_sharegpt.jsonl").read_text().splitlines()] == ["q1", "q4"]


@pytest.mark.slow
def test_train_sft_refuses_with_one_line_and_exit_2_or_drops_when_told(data, tmp_path):
    model, folder, lengths = data
    cutoff = sorted(lengths)[1]
    base = [sys.executable, str(ROOT / "train" / "sft.py"), "--config", str(ROOT / "configs/sft/world-smollm2-cpu.yaml"),
            "--set", f"model={model}", "--set", f"data.dataset_dir={folder}", "--set", f"output_dir={tmp_path / 'out'}",
            "--set", f"data.cutoff_len={cutoff}", "--set", f"launch.venv={Path(sys.executable).parents[1]}", "--dry-run"]
    r = subprocess.run(base, capture_output=True, text=True, cwd=str(ROOT), timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: 1 of 3 examples") and f"cutoff_len {cutoff}" in lines[0]
    assert not (tmp_path / "out" / "r3rag_sft.yaml").exists()  # nothing a rerun would trust
    r = subprocess.run([*base, "--set", "data.drop_longer=true"], capture_output=True, text=True, cwd=str(ROOT), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"left out 1 of 3 examples longer than data.cutoff_len {cutoff} (longest {max(lengths)} tokens)" in r.stderr
    assert f"dataset_dir: {(tmp_path / 'out' / DATA_FOLDER).resolve()}" in r.stdout
    assert f"cutoff_len: {cutoff}" in r.stdout
