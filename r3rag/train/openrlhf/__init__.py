"""RL on a GPU cluster with stock OpenRLHF (0.11.2): our agent plugin and the per-step reward hook.

- :mod:`.agent` is the file given to ``--train.agent_func_path``: it defines ``AgentExecutor``
  (OpenRLHF's ``AgentExecutorBase``) around :class:`.rollout.AgentRollout`, which runs one
  trajectory with the shared :class:`~r3rag.rollout.env.RetrievalEnv` (format rules, stop strings,
  retrieval, documents) on OpenRLHF's vLLM engine and scores it with a reward recipe;
- :mod:`.config` reads the plugin's settings (the class is built without arguments): a YAML file
  named by ``R3RAG_AGENT_CONFIG`` (a path, or the name of a config packaged in ``configs/``),
  dotted overrides in ``R3RAG_AGENT_SET`` and retrieval URLs in ``R3RAG_RETRIEVER_URLS``;
- :mod:`.placement` and :mod:`.per_step` make OpenRLHF's experience maker compute the single-machine
  trainer's advantages (each step's reward on that step's last token, group statistics from kept
  samples, the vanishing-spread guard, documents not counted as time steps), installed in every
  Ray worker by :mod:`.launch`, the driver entry point that replaces
  ``python -m openrlhf.cli.train_ppo_ray``;
- :mod:`.flags` runs OpenRLHF's own argument parser on a launch script's flags (CI contract);
- :mod:`.retrieval` orders the per-node replica URLs (this node's first) and never rotates away
  from it while it answers; :mod:`.data` writes OpenRLHF's prompt rows (raw question + JSON label).

Nothing here is imported by the rest of r3rag; OpenRLHF itself is only needed by :mod:`.agent`,
:mod:`.per_step`, :mod:`.launch` and :mod:`.flags` (its own environment: train/envs/openrlhf.sh).
"""
