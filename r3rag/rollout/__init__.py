"""Trajectory formats, policy backends and the multi-turn rollout engine.

- :mod:`r3rag.rollout.trajectory`  segments, steps, stop reasons, loss mask
- :mod:`r3rag.rollout.formats`     ``r3rag_steps`` and ``r1searcher_tags`` (chat and raw modes)
- :mod:`r3rag.rollout.backends`    ``hf``, ``vllm``, ``openai`` behind :class:`PolicyBackend`
- :mod:`r3rag.rollout.engine`      :class:`RolloutEngine` (batched rounds, one retrieval call per round)
- :mod:`r3rag.rollout.oracle`      the gold-decomposition policy for the embedded world
"""
