"""Decoding GPT-2 from prompt embeddings: IFCap's reference beam search and greedy search, and a
fast batched, KV-cached beam/greedy search over many images that returns the same beams.

Reference beam search (IFCap's official beam search), one prompt at a time, no KV cache (the full sequence is
recomputed every step):

* logp = log(softmax(logits / temperature)) at the last position;
* step 1: the top-W tokens of the prompt start the W beams (len = 1);
* later steps: rows of stopped beams become -inf except token 0 (log-prob 0); cand = score + logp;
  len += 1 for beams not stopped; avg = cand / len; top-W over all W x V entries of avg; the source
  beam is index // V and the token index % V; score = chosen avg * len (a sum again);
* a beam stops when its new token is in the stop set ("." and " ."); the loop ends when all beams are
  stopped or after ``max_len`` tokens;
* result: per beam the tokens up to its length, sum = score, mean = score / len; sorted by mean desc.

The fast search does the same arithmetic for B images x W beams at once: prompts of different lengths
are left-padded (attention mask + position ids that start at 0 on the first real position), GPT-2 runs
once on the prompts and then one token per step on a preallocated KV cache that is never reordered (a
beam reads its history through an ancestry table, :class:`_BeamCache`); the step reads nothing back
to the host: images whose beams have all stopped are frozen on the device, the host asks once every
:data:`CHECK_EVERY` steps whether to end or drop them, and reads the beams once per batch. Being
KV-cached and padded it is mathematically identical to the reference but not bit-identical
(differences ~1e-6), so a near-tie can in rare cases flip a beam.

The fast search's step may run under ``torch.compile`` (``captioner.compile``, :func:`beam_step`): the
caller holds the compiled step (the loaded captioner does), nothing is patched here.

Greedy (spec 5.2): argmax per step, stop on the stop set, max_len tokens, text includes the stop token.

Details that match the official code (run under transformers 4.19):

* the reference beam runs GPT-2's full forward and takes the last position's logits, as the official
  code does; asking GPT-2 for the last position only (``logits_to_keep=1``) changes the logits by up
  to ~1e-5, so the reference search would no longer be bitwise the official one;
* ``temperature <= 0`` falls back to 1.0 (the official ``temperature if temperature > 0 else 1.0``),
  instead of dividing by zero (NaN scores);
* decoded text gets transformers 4.19's ``clean_up_tokenization`` (:func:`clean_up_tokenization`:
  ``" ."`` -> ``"."``, ``" ,"``, ``" 's"``, ``" n't"``, ...), which ``decode()`` applied by default
  then and no longer does in transformers 5; released IFCap predictions never contain ``" ."``.
  Only the text changes: token ids, scores and lengths are of the raw beam;
* exact ties: beams are finally ordered by mean log-prob with a *stable* sort (equal means keep the
  search's beam order, i.e. the order ``topk`` returned them in); the official code orders with
  ``torch.argsort(descending=True)``, whose order among exactly equal values is unspecified. The two
  can differ only on an exact float tie of two beams' means (observed once in 1200 beam sets).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

__all__ = [
    "Beam",
    "Candidate",
    "beam_search_fast",
    "beam_search_reference",
    "beam_step",
    "beams_to_candidates",
    "clean_up_tokenization",
    "decode_prompts",
    "greedy_fast",
    "greedy_reference",
]


@dataclass
class Candidate:
    """One decoded caption. ``lm_logprob_sum``/``_mean`` are over the generated tokens including the
    stop token; ``beam_rank`` 0 is the search's own first choice (highest mean log-prob)."""

    text: str
    lm_logprob_sum: float
    lm_logprob_mean: float
    n_tokens: int
    beam_rank: int
    finished: bool
    token_ids: tuple[int, ...] = field(default=(), repr=False)

    def to_row(self) -> dict:
        """The LM fields of a feature-table candidate (adjcap.features.CANDIDATE)."""
        return {
            "text": self.text,
            "lm_logprob_sum": self.lm_logprob_sum,
            "lm_logprob_mean": self.lm_logprob_mean,
            "n_tokens": self.n_tokens,
            "beam_rank": self.beam_rank,
        }


@dataclass
class Beam:
    """A raw search result: generated ids (up to and including the stop token), summed log-prob."""

    tokens: list[int]
    score_sum: float
    finished: bool

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def score_mean(self) -> float:
        return self.score_sum / len(self.tokens)


# transformers 4.19 PreTrainedTokenizerBase.clean_up_tokenization, in its order
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """The space clean-up transformers 4.19's ``decode()`` applied (``" ."`` -> ``"."``, ``" ,"`` ->
    ``","``, ``" 's"`` -> ``"'s"``, ``" n't"`` -> ``"n't"``, ...); no strip."""
    for old, new in _CLEAN_UP:
        text = text.replace(old, new)
    return text


def effective_temperature(temperature: float) -> float:
    """The official fallback: a temperature <= 0 means 1.0."""
    return float(temperature) if temperature > 0 else 1.0


def _logp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # log(softmax) rather than log_softmax: this is what the official search computes
    return (logits.float() / effective_temperature(temperature)).softmax(dim=-1).log()


def _check(gpt, prompts: Sequence[torch.Tensor], beam_width: int, max_len: int) -> None:
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {beam_width}")
    v = gpt.config.vocab_size
    if beam_width > v:
        raise ValueError(f"beam_width {beam_width} exceeds the vocabulary size {v}")
    n_pos = gpt.config.n_positions
    for i, p in enumerate(prompts):
        if p.dim() != 2 or p.shape[1] != gpt.config.n_embd:
            raise ValueError(f"prompt {i} must be [T, {gpt.config.n_embd}], got {tuple(p.shape)}")
        if p.shape[0] + max_len > n_pos:
            raise ValueError(
                f"prompt {i} has {p.shape[0]} positions; with max_len={max_len} it exceeds the language "
                f"model's {n_pos} positions"
            )


def _sorted_beams(tokens: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor) -> list[Beam]:
    """Beams cut to their lengths, sorted by mean (scores / lengths) descending (stable)."""
    means = (scores / lengths).tolist()
    order = sorted(range(len(means)), key=lambda b: -means[b])
    toks = tokens.tolist()
    lens = lengths.tolist()
    sums = scores.tolist()
    fin = stopped.tolist()
    return [Beam(tokens=toks[b][: int(lens[b])], score_sum=float(sums[b]), finished=bool(fin[b])) for b in order]


# --------------------------------------------------------------------------------------------
# Reference (official procedure, one image at a time)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def beam_search_reference(
    gpt,
    prompt: torch.Tensor,
    *,
    beam_width: int = 5,
    max_len: int = 64,
    stop_ids: Sequence[int],
    temperature: float = 1.0,
    neg_prompt: torch.Tensor | None = None,
    contrastive_lambda: float = 0.0,
) -> list[Beam]:
    """IFCap's ``search.beam_search`` for one prompt [T, D] (no KV cache). Returns W beams sorted
    by mean log-prob descending.

    Contrastive option (not in IFCap; a negative result kept as an option): with ``neg_prompt`` and
    ``contrastive_lambda`` > 0 the per-token score is (1+lambda) logp(.|prompt) - lambda logp(.|neg_prompt)
    for the same generated prefix, and the beam's sums/means are of that score."""
    _check(gpt, [prompt] if neg_prompt is None else [prompt, neg_prompt], beam_width, max_len)
    lam = float(contrastive_lambda)
    use_neg = neg_prompt is not None and lam != 0.0
    wte = gpt.transformer.wte
    dev = prompt.device
    stop = torch.tensor(list(stop_ids), device=dev)
    emb = prompt[None]
    neg = neg_prompt[None] if use_neg else None
    w = beam_width
    tokens = scores = None
    lengths = torch.ones(w, device=dev)
    stopped = torch.zeros(w, dtype=torch.bool, device=dev)
    for _ in range(max_len):
        # the full forward, as the official code (logits_to_keep=1 would change the logits by ~1e-5)
        logits = gpt(inputs_embeds=emb, use_cache=False).logits[:, -1, :]
        logp = _logp(logits, temperature)
        if use_neg:
            neg_logp = _logp(gpt(inputs_embeds=neg, use_cache=False).logits[:, -1, :], temperature)
            logp = (1.0 + lam) * logp - lam * neg_logp
        if scores is None:
            scores, nxt = logp[0].topk(w)
            emb = emb.expand(w, -1, -1)
            if use_neg:
                neg = neg.expand(w, -1, -1)
            tokens = nxt[:, None]
        else:
            vocab = logp.shape[1]
            logp[stopped] = float("-inf")
            logp[stopped, 0] = 0.0
            cand = scores[:, None] + logp
            lengths[~stopped] += 1
            avg = cand / lengths[:, None]
            top, idx = avg.view(-1).topk(w)
            src = idx // vocab
            nxt = idx % vocab
            lengths = lengths[src]
            tokens = torch.cat([tokens[src], nxt[:, None]], dim=1)
            emb = emb[src]
            if use_neg:
                neg = neg[src]
            scores = top * lengths
            stopped = stopped[src]
        new = wte(nxt)[:, None].to(emb.dtype)
        emb = torch.cat([emb, new], dim=1)
        if use_neg:
            neg = torch.cat([neg, new], dim=1)
        stopped = stopped | torch.isin(nxt, stop)
        if bool(stopped.all()):
            break
    return _sorted_beams(tokens, scores, lengths, stopped)


@torch.no_grad()
def greedy_reference(
    gpt, prompt: torch.Tensor, *, max_len: int = 64, stop_ids: Sequence[int], temperature: float = 1.0
) -> Beam:
    """IFCap's ``search.greedy_search`` for one prompt (batch size 1, KV cache, stop on the stop set)."""
    _check(gpt, [prompt], 1, max_len)
    wte = gpt.transformer.wte
    stop = set(int(s) for s in stop_ids)
    out = gpt(inputs_embeds=prompt[None], use_cache=True, logits_to_keep=1)
    toks: list[int] = []
    total = 0.0
    finished = False
    for step in range(max_len):
        if step:
            inp = wte(torch.tensor([[toks[-1]]], device=prompt.device)).to(prompt.dtype)
            out = gpt(inputs_embeds=inp, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
        tok = int(logits.argmax())
        total += float(_logp(logits, temperature)[tok])
        toks.append(tok)
        if tok in stop:
            finished = True
            break
    return Beam(tokens=toks, score_sum=total, finished=finished)


# --------------------------------------------------------------------------------------------
# Fast batched search
# --------------------------------------------------------------------------------------------


def _left_pad(prompts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lens = [p.shape[0] for p in prompts]
    t = max(lens)
    b = len(prompts)
    d = prompts[0].shape[1]
    dev, dt = prompts[0].device, prompts[0].dtype
    emb = torch.zeros(b, t, d, device=dev, dtype=dt)
    mask = torch.zeros(b, t, device=dev, dtype=torch.long)
    for i, p in enumerate(prompts):
        emb[i, t - lens[i] :] = p
        mask[i, t - lens[i] :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return emb, mask, pos


def _chunks(prompts: Sequence[torch.Tensor], batch_size: int | None) -> list[list[int]]:
    """Image indices grouped into batches of similar prompt length (less padding)."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].shape[0])
    bs = batch_size or max(1, len(prompts))
    return [order[i : i + bs] for i in range(0, len(order), bs)]


KV_HOOKS: list[Callable[[Sequence[torch.Tensor]], None]] = []
"""Called with all of the fast beam search's KV-cache tensors each time it allocates them (at the
start of a batch and when finished images leave it); :mod:`adjcap.dispatch_audit` listens here."""

CHECK_EVERY = 4
"""The fast beam search asks the device whether images have finished once every this many steps
(one host read); in between, finished images are frozen on the device."""

COMPACT_FRACTION = 0.25
"""At a check, finished images leave the batch (their cache rows are copied out, once) when they
are at least this fraction of it; fewer stay frozen in it until the batch ends."""


def _is_stop(tok: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
    """tok in the stop set, elementwise, without a host read (``isin`` may sort on some devices)."""
    return (tok[..., None] == stop).any(-1)


def _check_fast_lm(gpt) -> None:
    cfg = gpt.config
    for flag in ("add_cross_attention", "reorder_and_upcast_attn"):
        if getattr(cfg, flag, False):
            raise ValueError(f"the fast beam search does not implement GPT-2's {flag}=True; use search='reference'")


class _BeamCache:
    """The KV cache of one fast beam batch, allocated once and never reordered (nothing is copied
    when beams are chosen; see :func:`_beam_batch`).

    * prompt keys/values per layer ``[rows, H, Tp, Dh]``, one row per image and stream: the W beams
      of an image share its prompt, so it is stored once (transformers' prefill cache, kept);
    * generated keys/values per layer ``[rows, H, Lg, W, Dh]``, position-major: position g of
      slot w is written once, by the beam that holds slot w at step g; positions [:n] of all slots
      are one contiguous block per (row, head), so attention reads them as a view;
    * a beam's own history is found through the ancestry table ``anc [B, W, Lg]``: the slot that
      held its ancestor at each generated position.
    """

    def __init__(self, prompt_cache, rows: int, width: int, max_gen: int):
        self.kp = [layer.keys.contiguous() for layer in prompt_cache.layers]
        self.vp = [layer.values.contiguous() for layer in prompt_cache.layers]
        _, h, _, dh = self.kp[0].shape
        like = self.kp[0]
        # torch.empty: positions are written before they are read; on a CPU untouched pages cost nothing
        self.kg = [like.new_empty(rows, h, max_gen, width, dh) for _ in self.kp]
        self.vg = [like.new_empty(rows, h, max_gen, width, dh) for _ in self.kp]
        self._announce()

    def _announce(self) -> None:
        for hook in KV_HOOKS:
            hook([*self.kp, *self.vp, *self.kg, *self.vg])

    def keep_rows(self, rows: torch.Tensor, filled: int) -> None:
        """Only ``rows`` stay (finished images leave); positions [:filled] are copied, once."""
        self.kp = [t.index_select(0, rows) for t in self.kp]
        self.vp = [t.index_select(0, rows) for t in self.vp]

        def keep(t: torch.Tensor) -> torch.Tensor:
            new = t.new_empty(len(rows), *t.shape[1:])
            torch.index_select(t[:, :, :filled], 0, rows, out=new[:, :, :filled])  # one pass, filled part only
            return new

        self.kg = [keep(t) for t in self.kg]
        self.vg = [keep(t) for t in self.vg]
        self._announce()


def _gpt_step(gpt, cache: _BeamCache, x: torch.Tensor, g: int, pmask: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """GPT-2 on one new token per beam slot (transformers' own modules for everything but the
    attention core): x [rows*W, D] token + position embeddings of generated position g, pmask
    [rows, 1, 1, Tp] additive prompt padding mask, anc [rows, W, >g] ancestry (slot w's own
    entry at g already set) -> logits [rows*W, V]. Writes position g of the generated cache.

    Attention of beam b over generated position p reads slot anc[b, p]: the scores of all W slots
    are computed (one matmul per row and head over the contiguous [:n, :W] block) and the
    ancestor's picked by ``gather``; the values are weighted through the one-hot of anc. No cache
    copy, no host read; the shapes depend only on (rows, W, n = g + 1), so ``torch.compile``
    (dynamic shapes) can capture the step whole."""
    tr = gpt.transformer
    rows, w, n = pmask.shape[0], anc.shape[1], g + 1
    tp = pmask.shape[-1]
    a = anc[:, :, :n]
    pick = a[:, None, :, :, None].expand(rows, cache.kg[0].shape[1], w, n, 1)
    # one_hot() would check the range of ``a`` on the host; a comparison does not
    onehot = (a[..., None] == torch.arange(w, device=a.device)).to(x.dtype)[:, None]  # [rows, 1, W, n, W]
    for layer, blk in enumerate(tr.h):
        attn = blk.attn
        h, dh = attn.num_heads, attn.head_dim
        q, k, v = attn.c_attn(blk.ln_1(x)).split(attn.split_size, dim=-1)
        q = q.view(rows, w, h, dh).transpose(1, 2)  # [rows, H, W, Dh]
        kg, vg = cache.kg[layer], cache.vg[layer]
        # a slice, not kg[:, :, g]: torch.compile keeps the position symbolic (no graph per position)
        kg[:, :, g:n].copy_(k.view(rows, 1, w, h, dh).permute(0, 3, 1, 2, 4))
        vg[:, :, g:n].copy_(v.view(rows, 1, w, h, dh).permute(0, 3, 1, 2, 4))
        kgn = kg[:, :, :n].reshape(rows, h, n * w, dh)  # a view
        vgn = vg[:, :, :n].reshape(rows, h, n * w, dh)
        sp = torch.matmul(q, cache.kp[layer].transpose(-1, -2)) * attn.scaling + pmask
        sg = (torch.matmul(q, kgn.transpose(-1, -2)) * attn.scaling).view(rows, h, w, n, w)
        sg = sg.gather(-1, pick).squeeze(-1)  # [rows, H, W, n]: the ancestor's key at each position
        p = torch.cat([sp, sg], dim=-1).softmax(dim=-1).to(v.dtype)
        pp, pg = p.split([tp, n], dim=-1)
        o = torch.matmul(pp, cache.vp[layer]) + torch.matmul((pg[..., None] * onehot).view(rows, h, w, n * w), vgn)
        x = attn.c_proj(o.transpose(1, 2).reshape(rows * w, h * dh)) + x
        x = x + blk.mlp(blk.ln_2(x))
    return gpt.lm_head(tr.ln_f(x))


Step = Callable[..., torch.Tensor]
"""A beam step: :func:`_gpt_step`, or the same function under ``torch.compile`` (:func:`beam_step`)."""

COMPILE_BACKEND = "inductor"
"""torch.compile's backend for ``captioner.compile`` (:func:`beam_step`). Inductor generates kernels (Triton
on a GPU, C++ through a C compiler on a CPU); tests set ``"aot_eager"`` (the same captured graph, run by
PyTorch's own kernels, no compiler) to check the compiled step's beams on a CPU."""


@functools.cache
def compiled_step(backend: str) -> Step:
    """:func:`_gpt_step` under ``torch.compile(fullgraph=True, dynamic=True)``, made once per process and
    backend: its graphs compile on the first batch (about 4.5 minutes with inductor on an H100) and serve
    every later batch and captioner of the process (symbolic shapes: no graph per batch size or position).
    CUDA graphs (``mode="reduce-overhead"``) are refused: the step writes its KV cache in place."""
    return torch.compile(_gpt_step, fullgraph=True, dynamic=True, backend=backend)


@functools.cache
def _say_ignored_on_cpu() -> None:
    log.warning("captioner.compile is ignored on a CPU (torch.compile's kernels need a C compiler there and "
                "gain nothing on this step); the beam step runs eagerly")


def beam_step(mode: str, device: torch.device | str) -> Step:
    """The step the fast beam search runs for ``captioner.compile = mode``: the eager :func:`_gpt_step`
    when ``"off"``, and on a CPU with inductor (said once per process); else :func:`compiled_step` of
    :data:`COMPILE_BACKEND`. Nothing global changes: ``_gpt_step`` itself stays the eager function."""
    if mode == "off":
        return _gpt_step
    if mode != "default":
        raise ValueError(f"captioner.compile must be 'off' or 'default', got {mode!r}")
    if torch.device(device).type == "cpu" and COMPILE_BACKEND == "inductor":
        _say_ignored_on_cpu()
        return _gpt_step
    return compiled_step(COMPILE_BACKEND)


def _collect(parts: list[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[int, list[Beam]]:
    """The beams of a batch, read from the device once: parts of (image ids, tokens [n, W, L],
    scores, lengths, stopped [n, W])."""
    ids = [i for p in parts for i in p[0]]
    tokens = torch.cat([p[1] for p in parts])
    scores = torch.cat([p[2] for p in parts])
    lengths = torch.cat([p[3] for p in parts])
    stopped = torch.cat([p[4] for p in parts])
    means = scores / lengths  # float32, as the reference orders them
    packed = torch.cat([tokens.double(), scores.double()[..., None], means.double()[..., None],
                        lengths.double()[..., None], stopped.double()[..., None]], dim=-1).tolist()
    out = {}
    for i, rows in zip(ids, packed):
        order = sorted(range(len(rows)), key=lambda b: -rows[b][-3])
        out[i] = [
            Beam(tokens=[int(t) for t in rows[b][: int(rows[b][-2])]], score_sum=rows[b][-4], finished=bool(rows[b][-1]))
            for b in order
        ]
    return out


def _prefill(gpt, emb: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor):
    """The prompt pass of a batch (transformers' forward; its mask code reads the host once or
    twice, per batch)."""
    return gpt(inputs_embeds=emb, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)


PER_BATCH_SITES = ("_prefill", "_collect")
"""The functions of the fast beam search that run once per batch, not per step (the audit files
their host reads per batch)."""


@torch.no_grad()
def _beam_batch(
    gpt,
    prompts: Sequence[torch.Tensor],
    w: int,
    max_len: int,
    stop: torch.Tensor,
    temperature: float,
    neg_prompts: Sequence[torch.Tensor] | None = None,
    lam: float = 0.0,
    step: Step = _gpt_step,
) -> list[list[Beam]]:
    """Beam search for b images at once; rows (cache, logits) are laid out [stream][image][beam];
    stream 1 (contrastive negatives) exists only when ``neg_prompts`` is given and follows stream
    0's choices. The prompt pass is transformers' forward; each later step is ``step``
    (:func:`_gpt_step`, maybe compiled: :func:`beam_step`) on the preallocated :class:`_BeamCache`.
    Beams are chosen on the device (the ancestry table and the token table are gathered, the cache
    is not); an image whose beams have all stopped is
    frozen on the device (its state no longer changes, as if it had left the batch); the host
    asks which images are done once every :data:`CHECK_EVERY` steps and reads the beams once, at
    the end (:func:`_collect`)."""
    wte, wpe = gpt.transformer.wte, gpt.transformer.wpe
    dev = prompts[0].device
    b = len(prompts)
    streams = 1 if neg_prompts is None else 2
    all_prompts = list(prompts) + (list(neg_prompts) if neg_prompts is not None else [])
    emb, mask, pos = _left_pad(all_prompts)
    out = _prefill(gpt, emb, mask, pos)

    def combine(logits: torch.Tensor, n: int) -> torch.Tensor:
        """(streams*n, V) last-position logits -> (n, V) per-token scores."""
        lp = _logp(logits, temperature)
        if streams == 1:
            return lp
        return (1.0 + lam) * lp[:n] - lam * lp[n:]

    logp = combine(out.logits[:, -1, :], b)
    vocab = logp.shape[1]
    scores, nxt = logp.topk(w, dim=-1)  # (B, W)
    max_gen = max_len - 1
    tokens = torch.zeros(b, w, max_len, dtype=torch.long, device=dev)
    tokens[:, :, 0] = nxt
    lengths = torch.ones(b, w, device=dev)
    stopped = _is_stop(nxt, stop)
    done = stopped.all(dim=1)
    anc = torch.zeros(b, w, max_gen, dtype=torch.long, device=dev)
    own = torch.arange(w, device=dev).expand(b, w)
    cache = _BeamCache(out.past_key_values, streams * b, w, max_gen)
    del out
    pmask = torch.zeros(mask.shape, dtype=emb.dtype, device=dev).masked_fill(mask == 0, float("-inf"))[:, None, None]
    plen = torch.tensor([p.shape[0] for p in all_prompts], device=dev)
    alive = list(range(b))  # batch position -> image index (within this batch)
    finished: list = []
    for g in range(max_gen):
        if g and g % CHECK_EVERY == 0:
            d = done.tolist()  # the one host read of these CHECK_EVERY steps
            if all(d):
                break
            n_done = sum(d)
            if n_done and n_done >= COMPACT_FRACTION * len(alive):
                gone = torch.tensor([j for j in range(len(alive)) if d[j]], device=dev)
                keep = torch.tensor([j for j in range(len(alive)) if not d[j]], device=dev)
                finished.append(([alive[j] for j in range(len(alive)) if d[j]], tokens[gone], scores[gone],
                                 lengths[gone], stopped[gone]))
                alive = [alive[j] for j in range(len(alive)) if not d[j]]
                rows = torch.cat([keep + s * len(d) for s in range(streams)])
                cache.keep_rows(rows, g)
                pmask, plen = pmask[rows], plen[rows]
                tokens, scores, lengths, stopped, nxt = tokens[keep], scores[keep], lengths[keep], stopped[keep], nxt[keep]
                anc, done, own = anc[keep], done[keep], own[keep]
        nb = len(alive)
        anc[:, :, g] = own
        tok = nxt.reshape(-1).repeat(streams)
        x = wte(tok).to(emb.dtype) + wpe((plen + g).repeat_interleave(w, output_size=streams * nb * w))
        logits = step(gpt, cache, x, g, pmask, anc.repeat(streams, 1, 1) if streams > 1 else anc)
        logp = combine(logits, nb * w).view(nb, w, vocab)
        logp = logp.masked_fill(stopped[..., None], float("-inf"))
        logp[..., 0] = logp[..., 0].masked_fill(stopped, 0.0)
        cand = scores[..., None] + logp
        new_len = lengths + (~stopped).to(lengths.dtype)
        avg = cand / new_len[..., None]
        top, idx = avg.view(nb, w * vocab).topk(w, dim=-1)
        src = idx // vocab
        tok = idx % vocab
        new_len = new_len.gather(1, src)
        new_tokens = tokens.gather(1, src[..., None].expand(-1, -1, max_len))
        new_tokens[:, :, g + 1] = tok
        frozen = done[:, None]
        tokens = torch.where(frozen[..., None], tokens, new_tokens)
        anc = torch.where(frozen[..., None], anc, anc.gather(1, src[..., None].expand(-1, -1, max_gen)))
        stopped = torch.where(frozen, stopped, stopped.gather(1, src) | _is_stop(tok, stop))
        scores = torch.where(frozen, scores, top * new_len)
        lengths = torch.where(frozen, lengths, new_len)
        nxt = tok
        done = stopped.all(dim=1)
    finished.append((alive, tokens, scores, lengths, stopped))
    results = _collect(finished)
    return [results[i] for i in range(b)]


@torch.no_grad()
def beam_search_fast(
    gpt,
    prompts: Sequence[torch.Tensor],
    *,
    beam_width: int = 5,
    max_len: int = 64,
    stop_ids: Sequence[int],
    temperature: float = 1.0,
    batch_size: int | None = None,
    neg_prompts: Sequence[torch.Tensor] | None = None,
    contrastive_lambda: float = 0.0,
    step: Step | None = None,
) -> list[list[Beam]]:
    """The reference beam search for many prompts ([T_i, D] each) at once, KV-cached.
    ``batch_size`` images are decoded together (None: all). Returns, per prompt, W beams sorted by
    mean log-prob descending. ``neg_prompts`` (one per prompt) + ``contrastive_lambda`` > 0: the
    contrastive score of :func:`beam_search_reference`. ``step``: the GPT-2 step (None: the eager
    :func:`_gpt_step`; :func:`beam_step` gives the compiled one)."""
    if not prompts:
        return []
    use_neg = neg_prompts is not None and float(contrastive_lambda) != 0.0
    if use_neg and len(neg_prompts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(neg_prompts)} negative prompts")
    _check(gpt, list(prompts) + (list(neg_prompts) if use_neg else []), beam_width, max_len)
    _check_fast_lm(gpt)
    stop = torch.tensor(list(stop_ids), device=prompts[0].device)
    out: list[list[Beam] | None] = [None] * len(prompts)
    for idx in _chunks(prompts, batch_size):
        res = _beam_batch(
            gpt,
            [prompts[i] for i in idx],
            beam_width,
            max_len,
            stop,
            temperature,
            [neg_prompts[i] for i in idx] if use_neg else None,
            float(contrastive_lambda),
            step or _gpt_step,
        )
        for i, r in zip(idx, res):
            out[i] = r
    return out  # type: ignore[return-value]


@torch.no_grad()
def greedy_fast(
    gpt,
    prompts: Sequence[torch.Tensor],
    *,
    max_len: int = 64,
    stop_ids: Sequence[int],
    temperature: float = 1.0,
    batch_size: int | None = None,
) -> list[Beam]:
    """Greedy decoding of many prompts at once (left-padded, KV cache); each image stops at its own
    first stop token."""
    if not prompts:
        return []
    _check(gpt, prompts, 1, max_len)
    wte = gpt.transformer.wte
    dev = prompts[0].device
    stop = torch.tensor(list(stop_ids), device=dev)
    results: list[Beam | None] = [None] * len(prompts)
    for idx in _chunks(prompts, batch_size):
        emb, mask, pos = _left_pad([prompts[i] for i in idx])
        out = gpt(inputs_embeds=emb, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        next_pos = torch.tensor([prompts[i].shape[0] for i in idx], device=dev)
        n = len(idx)
        toks = torch.zeros(n, 0, dtype=torch.long, device=dev)
        sums = torch.zeros(n, device=dev)
        lengths = torch.zeros(n, dtype=torch.long, device=dev)
        stopped = torch.zeros(n, dtype=torch.bool, device=dev)
        for step in range(max_len):
            if step:
                mask = torch.cat([mask, torch.ones(n, 1, device=dev, dtype=mask.dtype)], dim=1)
                out = gpt(
                    inputs_embeds=wte(toks[:, -1])[:, None].to(emb.dtype),
                    attention_mask=mask,
                    position_ids=next_pos[:, None],
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
                next_pos = next_pos + 1
            logits = out.logits[:, -1, :]
            tok = logits.argmax(dim=-1)
            lp = _logp(logits, temperature).gather(1, tok[:, None])[:, 0]
            active = ~stopped
            sums = sums + torch.where(active, lp, torch.zeros_like(lp))
            lengths = lengths + active.long()
            toks = torch.cat([toks, tok[:, None]], dim=1)
            stopped = stopped | (active & torch.isin(tok, stop))
            if step % CHECK_EVERY == CHECK_EVERY - 1 and bool(stopped.all()):  # one host read per CHECK_EVERY steps
                break
        tl, sl, ll, fl = toks.tolist(), sums.tolist(), lengths.tolist(), stopped.tolist()
        for j, i in enumerate(idx):
            results[i] = Beam(tokens=tl[j][: ll[j]], score_sum=float(sl[j]), finished=bool(fl[j]))
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------


def beams_to_candidates(beams: Sequence[Beam], tokenizer) -> list[Candidate]:
    """Decoded texts (ids up to and including the stop token, transformers 4.19's clean-up, no
    strip) + scores, in beam order."""
    out = []
    for rank, b in enumerate(beams):
        out.append(
            Candidate(
                text=clean_up_tokenization(tokenizer.decode(b.tokens)),
                lm_logprob_sum=float(b.score_sum),
                lm_logprob_mean=float(b.score_mean),
                n_tokens=b.length,
                beam_rank=rank,
                finished=b.finished,
                token_ids=tuple(b.tokens),
            )
        )
    return out


@torch.no_grad()
def decode_prompts(
    gpt,
    tokenizer,
    prompts: Sequence[torch.Tensor],
    *,
    decoder: str = "beam",
    search: str = "fast",
    beam_width: int = 20,
    max_len: int = 64,
    stop_ids: Sequence[int],
    batch_size: int | None = None,
    temperature: float = 1.0,
    neg_prompts: Sequence[torch.Tensor] | None = None,
    contrastive_lambda: float = 0.0,
    step: Step | None = None,
) -> list[list[Candidate]]:
    """Decode prompt embeddings into candidates: ``decoder`` beam|greedy, ``search`` fast|reference.
    ``neg_prompts`` + ``contrastive_lambda`` > 0 turn on contrastive beam search (beam decoder only).
    ``step``: the fast beam search's GPT-2 step (:func:`beam_step`; None: eager); the greedy and the
    reference searches run transformers' forward and ignore it."""
    use_neg = neg_prompts is not None and float(contrastive_lambda) != 0.0
    if neg_prompts is None and float(contrastive_lambda) != 0.0:
        raise ValueError("contrastive_lambda > 0 needs negative prompts (captioner.contrastive_lambda)")
    if use_neg and decoder != "beam":
        raise ValueError("contrastive decoding is implemented for the beam decoder only")
    if use_neg and len(neg_prompts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(neg_prompts)} negative prompts")
    if decoder not in ("beam", "greedy"):
        raise ValueError(f"decoder must be 'beam' or 'greedy', got {decoder!r}")
    if search not in ("fast", "reference"):
        raise ValueError(f"search must be 'fast' or 'reference', got {search!r}")
    gpt.eval()
    if decoder == "greedy":
        if search == "fast":
            beams = greedy_fast(gpt, prompts, max_len=max_len, stop_ids=stop_ids, temperature=temperature, batch_size=batch_size)
        else:
            beams = [greedy_reference(gpt, p, max_len=max_len, stop_ids=stop_ids, temperature=temperature) for p in prompts]
        return [beams_to_candidates([b], tokenizer) for b in beams]
    if search == "fast":
        all_beams = beam_search_fast(
            gpt, prompts, beam_width=beam_width, max_len=max_len, stop_ids=stop_ids,
            temperature=temperature, batch_size=batch_size,
            neg_prompts=neg_prompts if use_neg else None, contrastive_lambda=contrastive_lambda, step=step,
        )
    else:
        all_beams = [
            beam_search_reference(
                gpt, p, beam_width=beam_width, max_len=max_len, stop_ids=stop_ids, temperature=temperature,
                neg_prompt=neg_prompts[i] if use_neg else None, contrastive_lambda=contrastive_lambda,
            )
            for i, p in enumerate(prompts)
        ]
    return [beams_to_candidates(b, tokenizer) for b in all_beams]
