"""The file for OpenRLHF's ``--train.agent_func_path``: defines ``AgentExecutor``.

OpenRLHF loads this file by path (not as a package module), builds ``AgentExecutor()`` with no
arguments once per vLLM engine actor and awaits ``execute(...)`` once per sample. Settings come
from the environment (:mod:`r3rag.train.openrlhf.config`); the work is done by
:class:`r3rag.train.openrlhf.rollout.AgentRollout`.
"""

from openrlhf.utils.agent import AgentExecutorBase

from r3rag.train.openrlhf.rollout import AgentRollout


class AgentExecutor(AgentRollout, AgentExecutorBase):
    """r3rag's episodes (formats, retrieval, documents, reward recipes) as an OpenRLHF agent."""

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        return await AgentRollout.execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
