"""The config system: YAML + dotted overrides, one clear error line for every mistake."""

from __future__ import annotations

import pytest
from pydantic import Field

from r3rag.config import Section, apply_overrides, dump_config, load_config, parse_override
from r3rag.errors import ConfigError


class Rollout(Section):
    max_steps: int = Field(5, ge=1)
    temperature: float = 0.0
    stop: list[str] = []


class Retrieval(Section):
    urls: list[str] = ["http://127.0.0.1:8000"]
    topk: int = 5


class Cfg(Section):
    name: str = "demo"
    rollout: Rollout = Rollout()
    retrieval: Retrieval = Retrieval()


def write(tmp_path, text):
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_defaults_file_and_overrides_compose(tmp_path):
    p = write(tmp_path, "rollout:\n  max_steps: 7\n  temperature: 0.5\n")
    cfg = load_config(Cfg, p, ["rollout.max_steps=3", "retrieval.urls=[http://127.0.0.1:9000, http://127.0.0.1:9001]"])
    assert cfg.rollout.max_steps == 3  # override beats file
    assert cfg.rollout.temperature == 0.5  # file beats default
    assert cfg.retrieval.urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"]
    assert cfg.retrieval.topk == 5  # default kept


def test_dump_reloads_to_same_config(tmp_path):
    cfg = load_config(Cfg, None, ["rollout.stop=[a, b]", "name=x"])
    p = write(tmp_path, dump_config(cfg))
    assert load_config(Cfg, p) == cfg


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    p = write(tmp_path, "rollout:\n  max_stepz: 7\n")
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, p)
    msg = str(err.value)
    assert str(p) in msg and "rollout.max_stepz" in msg and "unknown key" in msg
    assert "\n" not in msg


def test_bad_value_from_override_names_set_and_expectation():
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, None, ["rollout.max_steps=abc"])
    msg = str(err.value)
    assert msg.startswith("--set: rollout.max_steps:") and "integer" in msg and "'abc'" in msg


def test_constraint_violation_is_reported():
    with pytest.raises(ConfigError, match=r"rollout.max_steps: .*greater than or equal to 1"):
        load_config(Cfg, None, ["rollout.max_steps=0"])


def test_bad_yaml_and_missing_file(tmp_path):
    p = write(tmp_path, "rollout:\n  max_steps: [1,\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml:\d+: not valid YAML"):
        load_config(Cfg, p)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Cfg, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Cfg, write(tmp_path, "- a\n- b\n"))


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("rollout.max_steps")
    with pytest.raises(ConfigError, match="empty key"):
        parse_override("rollout..x=1")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_override_values_are_typed_yaml():
    assert parse_override("a=5") == (["a"], 5)
    assert parse_override("a=0.5") == (["a"], 0.5)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=hello world") == (["a"], "hello world")
    assert parse_override("a=") == (["a"], "")
