"""Cold-start data: a teacher reasons and retrieves, a correctness filter keeps the first right chain.

``build_coldstart(config)`` (see :mod:`r3rag.train.coldstart.builder`); CLI: ``train/build_coldstart.py``.
"""
