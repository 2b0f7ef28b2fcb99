"""The demo page: a question in, the trajectory streamed out step by step.

- :mod:`r3rag.demo.config`    ``DemoConfig`` (``configs/demo.yaml``)
- :mod:`r3rag.demo.policies`  policies by name: ``hf``, ``openai``, ``oracle``
- :mod:`r3rag.demo.runner`    ``DemoRunner``: the rollout engine + retrieval client, as events
- :mod:`r3rag.demo.cards`     HTML for step cards, the final card, the raw view, messages
- :mod:`r3rag.demo.app`       ``DemoApp`` and the Gradio page (``python -m r3rag.demo.app``)
"""
