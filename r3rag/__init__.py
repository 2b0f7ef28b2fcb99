"""r3rag: teach language models to reason and retrieve step by step with reinforcement learning.

The library is organised by pipeline piece:

- ``r3rag.data``       question and passage records, dataset readers, validation
- ``r3rag.world``      the embedded fictional multi-hop world (default data of every command)
- ``r3rag.metrics``    QA metrics (EM, F1, cover-EM, substring accuracy) with named normalisers
- ``r3rag.config``     typed YAML configs with dotted command-line overrides
- ``r3rag.retrieval``  index builders, searchers, the HTTP service and its client
- ``r3rag.rollout``    trajectory formats, policy backends and the multi-turn rollout engine
- ``r3rag.rewards``    reward components, recipes and the LLM judge
"""

__version__ = "0.1.0"
