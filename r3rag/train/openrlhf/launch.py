"""Driver entry point: stock ``openrlhf.cli.train_ppo_ray`` with our per-step reward hook in every process.

``python -m r3rag.train.openrlhf.launch <train_ppo_ray flags>`` takes exactly OpenRLHF's flags
(parsed by OpenRLHF's own parser) and runs OpenRLHF's own ``__main__``, after:

1. installing :func:`r3rag.train.openrlhf.per_step.install` in this process;
2. wrapping ``ray.init`` so that the runtime environment OpenRLHF asks for also carries a
   ``worker_process_setup_hook`` (Ray runs it in every worker process before any task, so the
   trainer actor that builds experiences has the hook too) and the ``R3RAG_*`` variables (the
   agent plugin in the vLLM engine actors reads its settings from them, on every node).

``R3RAG_PER_STEP=0`` skips both: stock OpenRLHF's objective (the total on the last token, dropped
samples in the group baselines, documents counted as GAE time steps), no longer the single
machine's. ``R3RAG_MIN_GROUP_STD`` (forwarded with the other ``R3RAG_*`` variables) sets the hook's
vanishing-spread guard, as ``algo.min_group_std`` on one machine.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any

HOOK = "r3rag.train.openrlhf.per_step.install"
OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith("R3RAG_")}


def merge_runtime_env(runtime_env: dict[str, Any] | None, per_step: bool = True) -> dict[str, Any]:
    """OpenRLHF's runtime env plus our hook and variables (its own values win on a clash).

    >>> merge_runtime_env({"env_vars": {"NCCL_DEBUG": "WARN"}}, per_step=True)["worker_process_setup_hook"]
    'r3rag.train.openrlhf.per_step.install'
    """
    out = dict(runtime_env or {})
    env_vars = dict(forwarded_env())
    env_vars.update(out.get("env_vars") or {})
    out["env_vars"] = env_vars
    if per_step:
        if out.get("worker_process_setup_hook") not in (None, HOOK):
            raise RuntimeError("a worker_process_setup_hook is already set; r3rag's per-step hook cannot be added")
        out["worker_process_setup_hook"] = HOOK
    return out


def wrap_ray_init(per_step: bool = True) -> None:
    import ray

    if getattr(ray.init, "__r3rag__", False):
        return
    orig = ray.init

    @functools.wraps(orig)
    def init(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_env"] = merge_runtime_env(kwargs.get("runtime_env"), per_step)
        return orig(*args, **kwargs)

    init.__r3rag__ = True  # type: ignore[attr-defined]
    ray.init = init


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    per_step = os.environ.get("R3RAG_PER_STEP", "1") not in ("0", "false", "no")
    if per_step:
        from r3rag.train.openrlhf.per_step import install

        install()
    wrap_ray_init(per_step)
    sys.argv = [OPENRLHF_MAIN] + list(argv)
    runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
