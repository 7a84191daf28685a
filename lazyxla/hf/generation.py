"""HuggingFace generation on the lazy device: a decoding method for ``generate``.

HF's own decoding loop (``GenerationMixin._sample``, transformers 5) compiles a new program
for every token on lazyxla, for two reasons that no lazy device can remove from outside it:

- it never syncs. Each token it reads one value on the host (``unfinished_sequences.max() ==
  0``), and a value read keeps the IR it computed pending (R5), so the static KV cache's
  in-place updates (``index_copy_``) chain from token to token: every token's read computes
  every token so far, in a program one token larger than the last;
- it grows ``input_ids`` (and ``position_ids``, and a padding ``attention_mask``) by one column
  per token with ``torch.cat``: even with a sync per token, those ``[batch, prompt + t]``
  tensors make every token's program a program of new shapes.

``generate`` here is a decoding method in HF's ``custom_generate`` form, so HF's ``generate``
still prepares everything (its processors, stopping criteria, the static cache, the prompt's
prefill) and only the per-token loop is lazyxla's::

    out = model.generate(ids, max_new_tokens=32, cache_implementation="static",
                         custom_generate=lazyxla.hf.generate)

Its loop keeps the sequence in one buffer of the final length (each token written at a
device-tensor position), feeds the model one token at a time with HF's own
``prepare_inputs_for_generation`` (the padding mask, if any, at the cache's full length), and
ends every token as a step: replayed (``lazyxla.compile(step, replay=True)``) when the step's
Python cannot change from token to token, else traced and synced. Either way every token runs
the same program: the compiles do not grow with the number of tokens, greedy tokens are
eager's, and sampling draws from lazyxla's seed graph (``lazyxla.manual_seed``).

Prompts of a new length compile nothing within their bucket (``dynamic.bucket``: the next power
of two, or ``LAZYXLA_DYNAMIC_BUCKETS``): what HF prepared for the prompt (its mask and
positions) is read on the host (``executor.settle``), the prompt is padded at its end to its
bucket (the causal mask keeps every real position from the padding), and the cache and the
sequence buffer are as long as the bucket of the generate's length. The numbers are exact: the
logits are taken at the real last position and the cache's write position is set back to the
real length, so generated tokens overwrite the padding's keys and values before any token can
attend to them.

Supported: decoder-only models with a static cache (``cache_implementation="static"``),
greedy and sampling (``num_beams=1``), every logits processor and stopping criterion (those
that read the sequence get it exactly, but make the step's Python depend on the token, so the
step is traced per token instead of replayed, and a processor that computes on the sequence
compiles per length), ``return_dict_in_generate`` with ``scores`` and ``logits``. Not: beam search, encoder-decoder
models, streamers (HF does not hand a ``custom_generate`` method the streamer). A model not
on the lazy device runs HF's own loop. May touch: the model's cache (in place, as HF's loop does).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .. import dynamic
from ..engine import executor
from ..frontend.device import DEVICE
from ..errors import LazyXlaError
from ..frontend.tensor import LazyTensor

# Logits processors that read neither the sequence nor the step: a replayed step computes
# exactly what they compute (HF's sampling warpers).
_STATIC_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                      "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")
# Stopping criteria this loop computes itself: the length by counting, EOS on the new token.
_OWN_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")
# Model inputs the loop keeps itself (the rest of HF's model kwargs go to every forward as given)
_OWN_INPUTS = ("cache", "attention_mask", "position_ids", "use_cache")


def generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
             synced_gpus=False, streamer=None, replay=None, **model_kwargs):
    """HF's ``custom_generate`` decoding method for the lazy device (see the module's text).
    ``replay`` (pass it to ``generate``): None replays the per-token step when that is exact,
    False traces and syncs it every token."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

    if model.device.type != DEVICE.type:
        return GenerationMixin._sample(model, input_ids, logits_processor=logits_processor,
                                       stopping_criteria=stopping_criteria, generation_config=generation_config,
                                       synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)
    cfg = generation_config
    _check(model, cfg, model_kwargs, synced_gpus, streamer)
    batch, prompt = input_ids.shape
    # what HF's generate prepared for this prompt (its padding mask and positions) as values,
    # answered on the host when it can be (host_reads): a new prompt length costs no program
    # for them, and the tensors HF keeps are device data, not pending IR
    given = [input_ids] + [model_kwargs.get(k) for k in ("attention_mask", "position_ids")]
    lazy = [t for t in given if isinstance(t, LazyTensor)]
    got = dict(zip(map(id, lazy), executor.settle([t._state for t in lazy])))
    ids_h, mask_h, pos_h = [got.get(id(t), t) if isinstance(t, torch.Tensor) else None for t in given]
    executor.run_pending()  # anything else pending: a program of its own, not the prompt's
    dec = _decoder(model, cfg, list(logits_processor or ()), list(stopping_criteria or ()), model_kwargs,
                   batch, replay)
    dec.begin(ids_h, mask_h)
    cur = torch.tensor([prompt], device=DEVICE)
    logits, pos = dec.prefill(ids_h, mask_h, pos_h, cur, cfg, model_kwargs)
    unfinished = torch.ones(batch, dtype=torch.long, device=DEVICE)
    token, unfinished, cur, done, scores, raw = dec.choose(logits, unfinished, cur)
    del logits
    executor.sync()
    kept_scores, kept_logits = [scores], [raw]
    dec.length += 1
    while dec.length < cfg.max_length and not (dec.has_eos and bool(done)):
        # a new decoder traces its first token before capturing: a compiled forward's first
        # call at a shape records what its later calls do not
        traced = not dec.replay or not dec.warm
        run = dec.step if traced else dec.run
        token, unfinished, cur, done, scores, raw, pos = run(token, pos, unfinished, cur)
        if traced:
            executor.sync()
            dec.warm = True
        kept_scores.append(scores)
        kept_logits.append(raw)
        dec.length += 1
    sequences = dec.seq[:, :dec.length]
    if not cfg.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=tuple(kept_scores) if dec.keep_scores else None,
                                     logits=tuple(kept_logits) if dec.keep_logits else None, cache=dec.cache)


class _Decoder:
    """One kind of generation's per-token step and what it works in: the sequence at its final
    length, the padding mask at the cache's length, and the cache. Kept per model for a later
    ``generate`` of the same kind (shapes, selection, cache layers; ``_kind``), whose tokens
    then replay the step captured before instead of capturing it again."""

    def __init__(self, model, cfg, processors, criteria, model_kwargs, batch, replay):
        self.model = model
        self.cache = cache = model_kwargs["cache"]
        self.processors = processors
        self.extra_criteria = [c for c in criteria if type(c).__name__ not in _OWN_CRITERIA]
        self.reads_sequence = bool(self.extra_criteria) or any(type(p).__name__ not in _STATIC_PROCESSORS
                                                               for p in processors)
        # a sliding-window layer decides on the host, from a Python count, where to write: a
        # replay would freeze that decision, so such a cache is traced per token
        plain_cache = _plain_cache(cache)
        self.replay = (not self.reads_sequence and plain_cache) if replay is None else bool(replay)
        # a plain static cache takes a prompt padded to its bucket (``prefill``); its length
        # (``_decoder``) and the sequence's are buckets too
        self.padded = _pads(cache, cfg)
        self.total = _total(cache, cfg)
        self.do_sample = cfg.do_sample
        eos = cfg._eos_token_tensor
        self.has_eos = eos is not None and any(type(c).__name__ == "EosTokenCriteria" for c in criteria)
        self.eos = eos.to(DEVICE) if self.has_eos else None
        self.pad_id = int(cfg._pad_token_tensor) if cfg._pad_token_tensor is not None else 0
        self.keep_scores = bool(cfg.return_dict_in_generate and cfg.output_scores)
        self.keep_logits = bool(cfg.return_dict_in_generate and cfg.output_logits)
        self.passed = {k: v for k, v in model_kwargs.items() if k not in _OWN_INPUTS}
        # made on the host and uploaded, so that every generate, this first one too, starts with
        # the buffers as device data and runs the same programs
        self.seq = torch.full((batch, self.total), self.pad_id, dtype=torch.long).to(DEVICE)
        self.mask = None
        if model_kwargs.get("attention_mask") is not None:  # at the cache's full length: one shape for every token
            kv_len = max(cache.get_mask_sizes(1, i)[0] for i in range(len(cache.layers)))
            self.mask = torch.ones((batch, kv_len), dtype=torch.long).to(DEVICE)
        self.length = 0  # tokens in ``seq`` so far (the sequence a processor or criterion reads)
        # the cache made now, not at the prompt's first write: every generate (this first one
        # too) then starts from an emptied cache of device data, and runs the same programs
        shape = model._get_static_cache_init_shape() if not cache.is_initialized else None
        if shape is not None:
            cache.early_initialization(batch_size=batch, num_heads=shape[0], head_dim=shape[1], dtype=model.dtype,
                                       device=DEVICE)
            executor.run_pending()  # its zeros as device data, as an emptied cache's are (not a step)
        self.run = self.step
        self.warm = False  # whether a token was traced before the step is captured
        if self.replay:
            from ..replay.compiled_step import compile as lazy_compile
            # captured at its first call (a decoder's first token was traced): every token ends
            # one step, traced, captured, checked or replayed, so a sampled generate draws the
            # same numbers after the same manual_seed
            self.run = lazy_compile(self.step, replay=True, warmup=0)

    def begin(self, ids, prompt_mask):
        """A new generation: the prompt (host tensors) into the buffers, in place (a replay binds
        them), each written whole from the host: one program for prompts of every length."""
        batch, prompt = ids.shape
        self.cache.reset()
        seq = torch.full((batch, self.total), self.pad_id, dtype=torch.long)
        seq[:, :prompt] = ids
        self.seq.copy_(seq.to(DEVICE))
        if self.mask is not None:
            mask = torch.ones(self.mask.shape, dtype=torch.long)
            mask[:, :prompt] = prompt_mask
            self.mask.copy_(mask.to(DEVICE))
        self.length = prompt

    def prefill(self, ids, prompt_mask, positions, cur, cfg, model_kwargs):
        """The prompt through the model as HF's ``_prefill`` runs it, from host tensors:
        the last prompt position's logits and the next token's positions. With a plain static
        cache the prompt is padded at its end to its bucket (``dynamic.bucket``), so prompts of
        every length up to the bucket run one program, exactly: the causal mask keeps each real
        position from the padding after it, the logits are taken at the real last position
        (``cur - 1``, data), and the layers' write position is set back to the real length, so
        the first generated token overwrites the padding's keys and values and no later token
        attends to what is left of them (the cache's mask ends at the current position)."""
        prompt = ids.shape[1]
        to = dynamic.bucket(prompt) if self.padded else prompt
        kw = dict(model_kwargs)
        if prompt_mask is not None:
            kw["attention_mask"] = F.pad(prompt_mask, (0, to - prompt), value=1).to(DEVICE)
        if positions is not None:
            kw["position_ids"] = F.pad(positions, (0, to - prompt), value=0).to(DEVICE)
        last = cur - 1
        if "logits_to_keep" in kw:  # HF's 1 (the last position) would be the padding's
            kw["logits_to_keep"] = last
        ids = F.pad(ids, (0, to - prompt), value=self.pad_id).to(DEVICE)
        if cfg.prefill_chunk_size is not None:  # HF's chunks, each at its own shape
            outputs = self.model._prefill(ids, cfg, kw)
        else:  # HF's ``_prefill`` in one piece, on the emptied cache: nothing to slice off the
            # prompt (``_prefill`` reads the cache's length, a device value, to find that out)
            inputs = self.model.prepare_inputs_for_generation(ids, next_sequence_length=None,
                                                              is_first_iteration=True, **kw)
            outputs = self.model(**inputs, return_dict=True)
        logits = outputs.logits
        logits = logits[:, -1, :] if logits.shape[1] == 1 else logits.index_select(1, last)[:, 0, :]
        if self.padded:
            for layer in self.cache.layers:
                layer.cumulative_length.copy_(cur[0])
        nxt = (positions[:, -1:] + 1).to(DEVICE) if positions is not None else None
        return logits, nxt

    def choose(self, logits, unfinished, cur):
        """The next token from the last position's logits, written into ``seq`` at ``cur``."""
        raw = logits.to(torch.float32)
        view = self.seq[:, :self.length] if self.reads_sequence else self.seq
        scores = raw
        for p in self.processors:
            scores = p(view, scores)
        if self.do_sample:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = torch.argmax(scores, dim=-1)
        if self.has_eos:
            token = token * unfinished + self.pad_id * (1 - unfinished)
            unfinished = unfinished & ~torch.isin(token, self.eos)
        self.seq.index_copy_(1, cur, token[:, None])
        for c in self.extra_criteria:
            unfinished = unfinished & ~c(self.seq[:, :self.length + 1], scores)
        return (token[:, None], unfinished, cur + 1, unfinished.max() == 0,
                scores if self.keep_scores else None, raw if self.keep_logits else None)

    def step(self, token, pos, unfinished, cur):
        """One token: the model on the last token, then ``choose``."""
        inputs = self.model.prepare_inputs_for_generation(token, next_sequence_length=1, cache=self.cache,
                                                          attention_mask=self.mask, position_ids=pos, use_cache=True,
                                                          **self.passed)
        out = self.model(**inputs, return_dict=True)
        return self.choose(out.logits[:, -1, :], unfinished, cur) + ((pos + 1) if pos is not None else None,)


_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {kind: _Decoder}


def _decoder(model, cfg, processors, criteria, model_kwargs, batch, replay) -> _Decoder:
    """The model's decoder for this kind of generation, or a new one. A kept decoder keeps its
    cache too: HF makes a new static cache for every ``generate``, and the step a replay binds
    must find the same tensors, so the kept cache, emptied (``reset``, in place), takes the new
    one's place. Only a replayed decoder is kept, and only when its kind can be said in plain
    values (the processors' settings, the model inputs passed on, the cache's layers)."""
    model_kwargs["cache"] = _bucketed(model, model_kwargs["cache"], cfg)
    kind = _kind(model, cfg, processors, criteria, model_kwargs, batch, replay)
    kept = _DECODERS.setdefault(model, {})
    old = kept.get(kind) if kind is not None else None
    if old is not None:
        model_kwargs["cache"] = old.cache  # emptied by ``begin``
        return old
    dec = _Decoder(model, cfg, processors, criteria, model_kwargs, batch, replay)
    if kind is not None and dec.replay:
        if len(kept) >= 8:
            kept.pop(next(iter(kept)))
        kept[kind] = dec
    return dec


def _plain_cache(cache) -> bool:
    """Whether every layer of the cache is a plain static layer, held on the device: one
    whose write position is a device tensor (a sliding window decides it on the host)."""
    return all(type(layer).__name__ == "StaticLayer" for layer in cache.layers) and not cache.offloading


def _pads(cache, cfg) -> bool:
    """Whether prompts are padded to their bucket: a plain static cache, dynamic shapes on
    (``LAZYXLA_DYNAMIC_BUCKETS`` not off), HF's prefill in one piece."""
    return _plain_cache(cache) and dynamic.enabled() and cfg.prefill_chunk_size is None


def _total(cache, cfg) -> int:
    """The length of the sequence's buffer and, when padded, of the cache: the generate's, or
    when padded the bucket of the longer of it and HF's cache (which keeps the longest length
    of earlier generates: ``_previous_max_cache_length``)."""
    if not _pads(cache, cfg):
        return cfg.max_length
    return dynamic.bucket(max(cfg.max_length, *(layer.max_cache_len for layer in cache.layers)))


def _bucketed(model, cache, cfg):
    """The static cache a decoder works in: a plain one at the bucket of HF's length
    (``dynamic.bucket``), so that generates whose prompts and lengths differ within the bucket
    share its cache and programs (the cache's mask ends at the current position: the longer
    cache changes no token); otherwise HF's own."""
    from transformers import StaticCache
    total = _total(cache, cfg)
    if not _pads(cache, cfg) or all(layer.max_cache_len == total for layer in cache.layers):
        return cache
    return StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=total)


def _plain(v) -> bool:
    return v is None or type(v) in (bool, int, float, str) or (type(v) is tuple and all(map(_plain, v)))


def _kind(model, cfg, processors, criteria, model_kwargs, batch, replay):
    """Everything a decoder's step depends on besides the tensors it binds, as a hashable key;
    None when that cannot be said in plain values."""
    procs = tuple((type(p).__name__, tuple(sorted(vars(p).items()))) for p in processors)
    crits = tuple(type(c).__name__ for c in criteria)
    passed = tuple(sorted((k, v) for k, v in model_kwargs.items() if k not in _OWN_INPUTS))
    layers = tuple((type(layer).__name__, getattr(layer, "max_cache_len", None)) for layer in model_kwargs["cache"].layers)
    if not all(_plain(v) for _, items in procs for _, v in items) or not all(_plain(v) for _, v in passed) \
            or any(c not in _OWN_CRITERIA for c in crits) or not all(_plain(v) for v in layers):
        return None
    eos = cfg._eos_token_tensor
    eos = tuple(eos.reshape(-1).tolist()) if eos is not None else None
    pad = int(cfg._pad_token_tensor) if cfg._pad_token_tensor is not None else None
    mask = model_kwargs.get("attention_mask")
    return (layers, str(model.dtype), batch, _total(model_kwargs["cache"], cfg), mask is not None, cfg.do_sample,
            procs, crits, passed, eos, pad, bool(cfg.return_dict_in_generate and cfg.output_scores),
            bool(cfg.return_dict_in_generate and cfg.output_logits), replay)


def _check(model, cfg, model_kwargs, synced_gpus, streamer):
    """What this loop cannot do, refused before anything runs, with the way that works."""
    from transformers import StaticCache
    where = "lazyxla.hf.generate"
    if model.config.is_encoder_decoder:
        raise LazyXlaError(f"{where}: decoder-only models only; {type(model).__name__} is an encoder-decoder. "
                           f"Call generate without custom_generate (its loop compiles a program per token here)")
    if cfg.num_beams != 1:
        raise LazyXlaError(f"{where}: greedy decoding and sampling only (num_beams=1), got num_beams={cfg.num_beams}")
    if synced_gpus or streamer is not None:
        raise LazyXlaError(f"{where}: synced_gpus and streamers are not supported (HF passes neither to a "
                           f"custom_generate method)")
    if cfg.output_attentions or cfg.output_hidden_states:
        raise LazyXlaError(f"{where}: output_attentions and output_hidden_states are not supported; "
                           f"scores and logits are")
    if not isinstance(model_kwargs.get("cache"), StaticCache):
        got = type(model_kwargs.get("cache")).__name__
        raise LazyXlaError(f"{where}: needs a static cache, got {got}: pass cache_implementation=\"static\" to "
                           f"generate (a growing cache makes a program per token)")
    if model_kwargs.get("inputs_embeds") is not None:
        raise LazyXlaError(f"{where}: input_ids only, not inputs_embeds")
    for k in ("token_type_ids", "mm_token_type_ids"):
        if model_kwargs.get(k) is not None:
            raise LazyXlaError(f"{where}: {k} is not supported")
