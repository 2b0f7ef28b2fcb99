"""Typed configs: pydantic models loaded from YAML, with dotted command-line overrides.

Every stage declares its settings as a pydantic model (``extra="forbid"``, so a typo is an
error) and loads them with :func:`load_config`::

    >>> class Rollout(Section):
    ...     max_steps: int = 5
    ...     temperature: float = 0.0
    >>> load_config(Rollout, None, ["max_steps=3"])
    Rollout(max_steps=3, temperature=0.0)

Sections nest (``rollout.max_steps=3`` reaches a ``rollout: Rollout`` field of a root config).

An unknown key or a bad value raises :class:`r3rag.errors.ConfigError` with one line naming
the key, where it came from (the file or ``--set``) and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from r3rag.errors import ConfigError

T = TypeVar("T", bound=BaseModel)


class Section(BaseModel):
    """Base class for config sections: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into ``(["a", "b", "c"], value)``; the value is read as YAML.

    >>> parse_override("rollout.max_steps=5")
    (['rollout', 'max_steps'], 5)
    >>> parse_override("retrieval.urls=[http://127.0.0.1:8000]")
    (['retrieval', 'urls'], ['http://127.0.0.1:8000'])
    """
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. rollout.max_steps=5")
    key, raw = item.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set {item!r}: empty key segment in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``a.b=value`` override applied (nested dicts made)."""
    out = _deep_copy(data)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {k!r} is a value, not a section")
            node = child
        node[keys[-1]] = value
    return out


def _deep_copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
) -> T:
    """Load ``cls`` from a YAML file (optional) plus dotted overrides, validating everything."""
    overrides = list(overrides)
    data = read_yaml(path) if path is not None else {}
    merged = apply_overrides(data, overrides)
    try:
        return cls.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(_describe(err, path, overrides)) from None


def _describe(err: ValidationError, path: str | Path | None, overrides: list[str]) -> str:
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"])
    from_set = any(o.split("=", 1)[0].strip() == key for o in overrides)
    source = "--set" if from_set else (str(path) if path is not None else "defaults")
    if e["type"] == "extra_forbidden":
        return f"{source}: unknown key {key!r}"
    got = e.get("input")
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {key}: {e['msg']}, got {got!r}{more}"


def dump_config(cfg: BaseModel) -> str:
    """The YAML that reloads to ``cfg`` (written beside every run's results)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def add_config_args(parser: Any, default: str | None = None) -> None:
    """Add ``--config FILE`` and repeatable ``--set KEY=VALUE`` to an argparse parser."""
    parser.add_argument("--config", default=default, help="YAML config file (default: %(default)s)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value with a dotted key, e.g. --set rollout.max_steps=5 (repeatable)",
    )
