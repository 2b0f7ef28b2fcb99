"""CPU stand-in for ``vllm`` (see train/envs/standins/README.md): imports, never generates.

Every ``vllm.<sub>`` module is created on demand by a meta-path finder, and every attribute of
any of them is a placeholder class, so ``from vllm.inputs import TokensPrompt`` or
``import vllm.distributed.utils`` succeed. Calling a placeholder returns an object that records
its keyword arguments as attributes (enough for code that builds ``SamplingParams(...)`` and
reads them back). Anything that needs a real engine fails loudly at use.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.29.0"  # the version OpenRLHF 0.11.2 expects; checked by its engine code only
__r3rag_standin__ = True


class _Placeholder:
    """Inert stand-in: keeps its keyword arguments as attributes."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"<vllm stand-in {type(self).__name__}>"


def _placeholder(name: str) -> type:
    return type(name, (_Placeholder,), {"__module__": "vllm", "__r3rag_standin__": True})


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        module.__r3rag_standin__ = True
        return module

    def exec_module(self, module):
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

sys.modules[__name__].__class__ = _StandinModule
