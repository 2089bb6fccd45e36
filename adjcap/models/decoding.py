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

The fast search does the same arithmetic for many images x W beams at once, continuously batched:
every image's prompt runs through GPT-2 once (left-padded: attention mask + position ids that start at 0
on the first real position), then a fixed set of image slots (``captioner.rows`` / W, else
``captioner.batch_size``) steps one token per beam on preallocated, never-reordered buffers (a beam reads
its history through an ancestry table, :class:`_Rows`); before each step, slots whose image has
finished take the next images on the device (:func:`_refill`), so no image waits for another's longest
beam; when no image is left to start, the live slots move to fewer rows (:func:`_shrink`). The step (:func:`_gpt_step`: GPT-2, log-softmax, stopped-beam mask, length normalisation, top-W
over W x V, the gathers) has fixed shapes and reads nothing back to the host; the host asks once every
:data:`CHECK_EVERY` steps whether anything is left and reads the beams once per call. Being KV-cached and
padded it is mathematically identical to the reference but not bit-identical (differences ~1e-6), so a
near-tie can in rare cases flip a beam; which images share the rows changes nothing else.

The fast search's step may run under ``torch.compile`` (``captioner.compile``, :func:`beam_step`): the
caller holds the compiled step (the loaded captioner does), nothing is patched here; ``graphs`` replays it
as CUDA graphs (its buffers are static, kept per shape between calls); the compiled artifacts are kept
under ``captioner.compile_cache`` (:func:`use_compile_cache`).

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
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
        """The LM fields of a feature-table candidate (adjcap.engine.features.CANDIDATE)."""
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


def _left_pad(prompts: Sequence[torch.Tensor], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lens = [p.shape[0] for p in prompts]
    t = max(lens) if width is None else width
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
"""Called with all of the fast beam search's KV-cache tensors each time it allocates them (once per
call, or once per shape when the rows are kept, :class:`_Rows`); :mod:`adjcap.models.dispatch_audit` listens here."""

CHECK_EVERY = 4
"""The fast beam search asks the device whether anything is left to decode once every this many
steps (one host read); refilling finished images' rows needs no host read (:func:`_refill`)."""

REFILL_LANES = 8
"""At most ``ceil(slots / REFILL_LANES)`` image slots are refilled per step (a fixed-size refill, no
host read); more finished at once wait a step."""


def _is_stop(tok: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
    """tok in the stop set, elementwise, without a host read (``isin`` may sort on some devices)."""
    return (tok[..., None] == stop).any(-1)


def _check_fast_lm(gpt) -> None:
    cfg = gpt.config
    for flag in ("add_cross_attention", "reorder_and_upcast_attn"):
        if getattr(cfg, flag, False):
            raise ValueError(f"the fast beam search does not implement GPT-2's {flag}=True; use search='reference'")


def slots_for(rows: int | None, batch_size: int | None, beam_width: int, n_images: int, streams: int = 1) -> int:
    """Image slots the fast beam search keeps on the device: ``rows // (beam_width x streams)`` when
    ``rows`` (``captioner.rows``) is set, else ``batch_size`` images (None: all), at most the images."""
    s = max(1, rows // (beam_width * streams)) if rows else (batch_size or n_images)
    return max(1, min(s, n_images))


class _Rows:
    """The fast beam search's device state: S image slots x W beams, every buffer allocated once at a
    fixed shape (static addresses: a CUDA graph may record them) and written in place.

    * prompt keys/values per layer ``[streams*S, H, Tp, Dh]`` (an image's W beams share its prompt;
      left-padded prompts, ``pmask`` the additive padding mask, ``plen`` the real length);
    * generated keys/values per layer ``[streams*S, H, Lg, W, Dh]``, Lg = max_len - 1, position-major:
      position g of beam slot w is written once (``scatter_`` at the slot's position ``gpos``), by the
      beam that holds slot w at step g; a beam reads its history through the ancestry table
      ``anc [S, W, Lg]`` (the slot that held its ancestor at each position), so the cache is never
      reordered; positions after ``gpos`` are masked (the attention always spans the fixed Lg);
    * the beams: ``tokens [S, W, max_len]``, ``scores`` (sums), ``lengths``, ``stopped``; ``live`` (the
      slot holds an image still being searched), ``occ`` (it holds an image not yet copied out), ``img``.

    Zero-filled once: a masked position must hold a finite value (0 x NaN would be NaN)."""

    def __init__(self, gpt, slots: int, width: int, max_len: int, tp: int, streams: int, dtype, device):
        cfg = gpt.config
        h = cfg.n_head
        dh = cfg.n_embd // h
        r, lg = streams * slots, max(1, max_len - 1)
        z = functools.partial(torch.zeros, device=device)
        # the prompt buffers have one spare row (index r): the refill's idle lanes write there
        self.kp_all = [z(r + 1, h, tp, dh, dtype=dtype) for _ in range(cfg.n_layer)]
        self.vp_all = [z(r + 1, h, tp, dh, dtype=dtype) for _ in range(cfg.n_layer)]
        self.kp = [t[:r] for t in self.kp_all]
        self.vp = [t[:r] for t in self.vp_all]
        self.kg = [z(r, h, lg, width, dh, dtype=dtype) for _ in range(cfg.n_layer)]
        self.vg = [z(r, h, lg, width, dh, dtype=dtype) for _ in range(cfg.n_layer)]
        self.pmask_all = z(r + 1, tp, dtype=dtype)
        self.plen_all = z(r + 1, dtype=torch.long)
        self.pmask, self.plen = self.pmask_all[:r], self.plen_all[:r]
        self.gpos = z(slots, dtype=torch.long)
        self.tokens = z(slots, width, max_len, dtype=torch.long)
        self.scores = z(slots, width)
        self.lengths = torch.ones(slots, width, device=device)
        self.stopped = z(slots, width, dtype=torch.bool)
        self.anc = z(slots, width, lg, dtype=torch.long)
        self.live = z(slots, dtype=torch.bool)
        self.occ = z(slots, dtype=torch.bool)
        self.img = z(slots, dtype=torch.long)
        self.max_gen = max_len - 1  # steps after the first token

    def tensors(self) -> list[torch.Tensor]:
        return [*self.kp_all, *self.vp_all, *self.kg, *self.vg, self.pmask_all, self.plen_all, self.gpos, self.tokens, self.scores,
                self.lengths, self.stopped, self.anc, self.live, self.occ, self.img]

    def announce(self) -> None:
        for hook in KV_HOOKS:
            hook([*self.kp_all, *self.vp_all, *self.kg, *self.vg])

    def reset(self) -> None:
        """A new call: no slot holds an image (buffers keep their addresses)."""
        self.live.zero_()
        self.occ.zero_()


_KEPT_ROWS: dict[tuple, _Rows] = {}
"""The rows of compiled steps, kept between calls per shape (a captured CUDA graph replays on the
addresses it recorded); the eager step allocates its rows per call."""


def _rows(step, gpt, slots, width, max_len, tp, streams, dtype, device) -> _Rows:
    if step is _gpt_step:
        rows = _Rows(gpt, slots, width, max_len, tp, streams, dtype, device)
        rows.announce()
        return rows
    key = (id(gpt), slots, width, max_len, tp, streams, dtype, str(device))
    rows = _KEPT_ROWS.get(key)
    if rows is None:
        rows = _KEPT_ROWS[key] = _Rows(gpt, slots, width, max_len, tp, streams, dtype, device)
        for t in rows.tensors():
            torch._dynamo.mark_static_address(t)
    rows.announce()
    rows.reset()
    return rows


def _attend(gpt, st: _Rows, x: torch.Tensor, gw: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """GPT-2 on one new token per beam row (transformers' own modules for everything but the attention
    core): x [R*W, D] token + position embeddings, gw [R] each row's generated position, anc [R, W, Lg]
    ancestry (the row's own slot at gw already set) -> logits [R*W, V]. Writes position gw of the
    generated cache (``scatter_``). Attention of beam b over generated position p reads slot anc[b, p]:
    the scores of all W slots are computed over the fixed Lg (one matmul per row and head), the
    ancestor's picked by ``gather``, later positions masked; values weighted through the one-hot of
    anc. Every shape depends only on (rows, W, Tp, Lg): no dynamic shape, no host read."""
    tr = gpt.transformer
    kg0 = st.kg[0]
    r, h, lg, w, dh = kg0.shape
    tp = st.pmask.shape[-1]
    ar = torch.arange(lg, device=x.device)
    gmask = torch.zeros(r, lg, dtype=x.dtype, device=x.device).masked_fill(ar > gw[:, None], float("-inf"))
    gmask = gmask[:, None, None]  # [R, 1, 1, Lg]
    pmask = st.pmask[:, None, None]
    pick = anc[:, None, :, :, None].expand(r, h, w, lg, 1)
    # one_hot() would check the range of ``anc`` on the host; a comparison does not
    onehot = (anc[..., None] == torch.arange(w, device=x.device)).to(x.dtype)[:, None]  # [R, 1, W, Lg, W]
    widx = gw[:, None, None, None, None].expand(r, h, 1, w, dh)
    for layer, blk in enumerate(tr.h):
        attn = blk.attn
        q, k, v = attn.c_attn(blk.ln_1(x)).split(attn.split_size, dim=-1)
        q = q.view(r, w, h, dh).transpose(1, 2)  # [R, H, W, Dh]
        kg, vg = st.kg[layer], st.vg[layer]
        kg.scatter_(2, widx, k.view(r, w, h, dh).transpose(1, 2)[:, :, None])
        vg.scatter_(2, widx, v.view(r, w, h, dh).transpose(1, 2)[:, :, None])
        kgn = kg.view(r, h, lg * w, dh)
        vgn = vg.view(r, h, lg * w, dh)
        sp = torch.matmul(q, st.kp[layer].transpose(-1, -2)) * attn.scaling + pmask
        sg = (torch.matmul(q, kgn.transpose(-1, -2)) * attn.scaling).view(r, h, w, lg, w)
        sg = sg.gather(-1, pick).squeeze(-1) + gmask  # [R, H, W, Lg]: the ancestor's key at each position
        p = torch.cat([sp, sg], dim=-1).softmax(dim=-1).to(v.dtype)
        pp, pg = p.split([tp, lg], dim=-1)
        o = torch.matmul(pp, st.vp[layer]) + torch.matmul((pg[..., None] * onehot).view(r, h, w, lg * w), vgn)
        x = attn.c_proj(o.transpose(1, 2).reshape(r * w, h * dh)) + x
        x = x + blk.mlp(blk.ln_2(x))
    return gpt.lm_head(tr.ln_f(x))


def _gpt_step(gpt, st: _Rows, stop: torch.Tensor, temperature: float, lam: float) -> None:
    """One step of every slot, in place on ``st``: GPT-2 on each live beam's last token (:func:`_attend`),
    then the vocabulary-wide step of the reference search on the device: log-softmax (divided by the
    temperature only when it is not 1), stopped beams' rows -inf but token 0 (log-prob 0), length
    normalisation, top-W over W x V per image, the chosen beams' tokens / ancestry / sums / lengths
    gathered. Slots not live are frozen (their beams do not change). No host read, fixed shapes:
    ``torch.compile(fullgraph=True)`` captures it whole, CUDA graphs can replay it (the buffers it
    writes are the static :class:`_Rows`)."""
    tr = gpt.transformer
    s, w, lmax = st.tokens.shape
    lg = st.anc.shape[-1]
    streams = st.plen.shape[0] // s
    gw = st.gpos.clamp(max=lg - 1)  # the position written this step (a frozen slot's is harmless)
    st.anc.scatter_(2, gw[:, None, None].expand(s, w, 1), torch.arange(w, device=gw.device)[None, :, None].expand(s, w, 1))
    nxt = st.tokens.gather(2, gw[:, None, None].expand(s, w, 1))[..., 0]  # each beam's last token
    gwr = gw.repeat(streams)
    x = tr.wte(nxt.reshape(-1).repeat(streams)).to(st.kp[0].dtype) + tr.wpe((st.plen + gwr).repeat_interleave(w))
    logits = _attend(gpt, st, x, gwr, st.anc.repeat(streams, 1, 1) if streams > 1 else st.anc).float()
    t = effective_temperature(temperature)
    lp = (logits if t == 1.0 else logits / t).log_softmax(dim=-1)
    if streams > 1:
        lp = (1.0 + lam) * lp[: s * w] - lam * lp[s * w :]
    vocab = lp.shape[-1]
    stopped = st.stopped
    tok0 = torch.arange(vocab, device=lp.device) == 0
    logp = lp.view(s, w, vocab).masked_fill(stopped[..., None], float("-inf"))
    logp = logp.masked_fill(stopped[..., None] & tok0, 0.0)
    new_len = st.lengths + (~stopped).to(st.lengths.dtype)
    avg = (st.scores[..., None] + logp) / new_len[..., None]
    top, idx = avg.view(s, w * vocab).topk(w, dim=-1)
    src = idx // vocab
    tok = idx % vocab
    new_len = new_len.gather(1, src)
    new_tokens = st.tokens.gather(1, src[..., None].expand(s, w, lmax))
    new_tokens = new_tokens.scatter(2, (gw + 1)[:, None, None].expand(s, w, 1), tok[..., None])
    new_anc = st.anc.gather(1, src[..., None].expand(s, w, lg))
    new_stopped = stopped.gather(1, src) | _is_stop(tok, stop)
    live = st.live
    f = live[:, None]
    st.tokens.copy_(torch.where(f[..., None], new_tokens, st.tokens))
    st.anc.copy_(torch.where(f[..., None], new_anc, st.anc))
    st.scores.copy_(torch.where(f, top * new_len, st.scores))
    st.lengths.copy_(torch.where(f, new_len, st.lengths))
    st.stopped.copy_(torch.where(f, new_stopped, st.stopped))
    gpos = st.gpos + live.to(st.gpos.dtype)
    st.gpos.copy_(gpos)
    st.live.copy_(live & ~(st.stopped.all(dim=1) | (gpos >= st.max_gen)))


Step = Callable[..., None]
"""A beam step: :func:`_gpt_step`, or the same function under ``torch.compile`` (:func:`beam_step`)."""

COMPILE_BACKEND = "inductor"
"""torch.compile's backend for ``captioner.compile`` (:func:`beam_step`). Inductor generates kernels (Triton
on a GPU, C++ through a C compiler on a CPU); tests set ``"aot_eager"`` (the same captured graph, run by
PyTorch's own kernels, no compiler) to check the compiled step's beams on a CPU."""

COMPILE_MODES = {"default": "default", "graphs": "reduce-overhead"}
"""``captioner.compile`` -> torch.compile's mode: ``graphs`` also replays the step as a CUDA graph (its
buffers are static, :class:`_Rows`)."""


@functools.cache
def compiled_step(backend: str, mode: str = "default") -> Step:
    """:func:`_gpt_step` under ``torch.compile(fullgraph=True)``, made once per process, backend and mode:
    its graph compiles on the first call (minutes with inductor on a GPU, once per process; with the
    compile cache, :func:`use_compile_cache`, once per cache) and serves every later call of the same
    rows shape. Every shape in the step is fixed by (slots, W, Tp, max_len)."""
    return torch.compile(_gpt_step, fullgraph=True, dynamic=False, backend=backend, mode=mode)


def use_compile_cache(cache_dir: str | os.PathLike | None) -> None:
    """Keep torch.compile's artifacts (inductor's FX-graph and kernel caches, Triton's) under
    ``cache_dir`` (``captioner.compile_cache``, in the adjcap cache: a shared volume on a cluster), so
    a second process, or a later job, loads the compiled step instead of compiling it again. Inductor
    keys its entries by the graph, torch version and device itself. Set before the first compile;
    an explicit TORCHINDUCTOR_CACHE_DIR in the environment wins."""
    if not cache_dir:
        return
    root = Path(cache_dir).expanduser()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True


@functools.cache
def _say_ignored_on_cpu() -> None:
    log.warning("captioner.compile is ignored on a CPU (torch.compile's kernels need a C compiler there and "
                "gain nothing on this step); the beam step runs eagerly")


def beam_step(mode: str, device: torch.device | str, cache_dir: str | os.PathLike | None = None) -> Step:
    """The step the fast beam search runs for ``captioner.compile = mode``: the eager :func:`_gpt_step`
    when ``"off"``, and on a CPU with inductor (said once per process); else :func:`compiled_step` of
    :data:`COMPILE_BACKEND` in the mode of :data:`COMPILE_MODES`, its artifacts kept under ``cache_dir``.
    Nothing global changes: ``_gpt_step`` itself stays the eager function."""
    if mode == "off":
        return _gpt_step
    if mode not in COMPILE_MODES:
        raise ValueError(f"captioner.compile must be 'off' or one of {sorted(COMPILE_MODES)}, got {mode!r}")
    if torch.device(device).type == "cpu" and COMPILE_BACKEND == "inductor":
        _say_ignored_on_cpu()
        return _gpt_step
    use_compile_cache(cache_dir)
    return compiled_step(COMPILE_BACKEND, COMPILE_MODES[mode] if torch.device(device).type == "cuda" else "default")


def _collect(tokens: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor,
             stopped: torch.Tensor) -> list[list[Beam]]:
    """The beams of every image, read from the device once: tokens [N, W, L], scores, lengths,
    stopped [N, W]; each image's beams sorted by mean (float32, as the reference orders them; stable)."""
    means = scores / lengths
    packed = torch.cat([tokens.double(), scores.double()[..., None], means.double()[..., None],
                        lengths.double()[..., None], stopped.double()[..., None]], dim=-1).tolist()
    out = []
    for rows in packed:
        order = sorted(range(len(rows)), key=lambda b: -rows[b][-3])
        out.append([
            Beam(tokens=[int(t) for t in rows[b][: int(rows[b][-2])]], score_sum=rows[b][-4], finished=bool(rows[b][-1]))
            for b in order
        ])
    return out


def _prefill(gpt, emb: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor):
    """The prompt pass (transformers' forward; its mask code reads the host once or twice per call)."""
    return gpt(inputs_embeds=emb, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)


PER_BATCH_SITES = ("_prefill", "_collect")
"""The functions of the fast beam search that read the host once per call (the prompt pass: once per
chunk of ``slots`` images), not per step (the audit files their reads per batch)."""


@dataclass
class _Queue:
    """The images of one call on the device: their prompts' keys/values ([streams*N, ...] per layer),
    masks, lengths, first beams (the prompt pass's top-W), the output beams ([N+1, ...]: row N takes
    the writes of refill lanes that carry no finished image), and the next image to start (``head``)."""

    kp: list[torch.Tensor]
    vp: list[torch.Tensor]
    pmask: torch.Tensor
    plen: torch.Tensor
    first: torch.Tensor  # [N, W] the first tokens
    first_scores: torch.Tensor  # [N, W]
    out_tokens: torch.Tensor
    out_scores: torch.Tensor
    out_lengths: torch.Tensor
    out_stopped: torch.Tensor
    head: torch.Tensor  # [] long

    @property
    def n(self) -> int:
        return self.first.shape[0]


def _queue(gpt, prompts, neg_prompts, w: int, max_len: int, temperature: float, lam: float, tp: int,
           chunk: int) -> _Queue:
    """The prompt pass of every image (``chunk`` images per forward), left-padded to ``tp``."""
    streams = 1 if neg_prompts is None else 2
    all_prompts = list(prompts) + (list(neg_prompts) if neg_prompts is not None else [])
    emb, mask, pos = _left_pad(all_prompts, tp)
    n = len(prompts)
    kp: list[torch.Tensor] = []
    vp: list[torch.Tensor] = []
    lps = []
    for a in range(0, streams * n, chunk):
        out = _prefill(gpt, emb[a : a + chunk], mask[a : a + chunk], pos[a : a + chunk])
        for layer, c in enumerate(out.past_key_values.layers):
            if not a:  # the prompts' keys/values of every image, written chunk by chunk
                kp.append(c.keys.new_empty(streams * n, *c.keys.shape[1:]))
                vp.append(c.values.new_empty(streams * n, *c.values.shape[1:]))
            kp[layer][a : a + chunk].copy_(c.keys)
            vp[layer][a : a + chunk].copy_(c.values)
        lps.append(out.logits[:, -1, :].float())
        del out
    t = effective_temperature(temperature)
    lp = torch.cat(lps)
    lp = (lp if t == 1.0 else lp / t).log_softmax(dim=-1)
    if streams > 1:
        lp = (1.0 + lam) * lp[:n] - lam * lp[n:]
    scores, first = lp.topk(w, dim=-1)
    dev = emb.device
    pmask = torch.zeros(mask.shape, dtype=emb.dtype, device=dev).masked_fill(mask == 0, float("-inf"))
    plen = torch.tensor([p.shape[0] for p in all_prompts], device=dev)
    return _Queue(
        kp=kp, vp=vp, pmask=pmask, plen=plen, first=first,
        first_scores=scores, out_tokens=torch.zeros(n + 1, w, max_len, dtype=torch.long, device=dev),
        out_scores=torch.zeros(n + 1, w, device=dev), out_lengths=torch.ones(n + 1, w, device=dev),
        out_stopped=torch.zeros(n + 1, w, dtype=torch.bool, device=dev),
        head=torch.zeros((), dtype=torch.long, device=dev),
    )


def _copy_out(st: _Rows, q: _Queue, slots: torch.Tensor, leave: torch.Tensor) -> None:
    """The beams of ``slots`` whose ``leave`` is set into the outputs (others into the spare row N)."""
    dest = torch.where(leave, st.img[slots], q.n)
    q.out_tokens.index_copy_(0, dest, st.tokens[slots])
    q.out_scores.index_copy_(0, dest, st.scores[slots])
    q.out_lengths.index_copy_(0, dest, st.lengths[slots])
    q.out_stopped.index_copy_(0, dest, st.stopped[slots])


def _refill(st: _Rows, q: _Queue, lanes: int, stop: torch.Tensor) -> None:
    """Up to ``lanes`` slots that hold no live image take the next images of the queue, on the device (no
    host read, fixed shapes): the free slots are found by a stable sort of ``live``; a lane with no free
    slot or no image left writes each buffer's own content back. The finished image a slot held is
    copied out first."""
    s = st.live.shape[0]
    slots = torch.argsort(st.live.to(torch.uint8), stable=True)[:lanes]  # free slots first
    cand = q.head + torch.arange(lanes, device=slots.device)
    valid = ~st.live[slots] & (cand < q.n)
    img = cand.clamp(max=q.n - 1)
    _copy_out(st, q, slots, valid & st.occ[slots])

    def put(buf: torch.Tensor, rows: torch.Tensor, new: torch.Tensor, ok: torch.Tensor) -> None:
        keep = buf.index_select(0, rows)
        buf.index_copy_(0, rows, torch.where(ok.view(-1, *[1] * (new.dim() - 1)), new, keep))

    r = st.plen.shape[0]
    streams = r // s
    # a prompt row is written once per image it takes: idle lanes write the spare row r
    rows = torch.cat([torch.where(valid, slots + j * s, r) for j in range(streams)])
    src = torch.cat([img + j * q.n for j in range(streams)])
    for layer in range(len(st.kp)):
        st.kp_all[layer].index_copy_(0, rows, q.kp[layer].index_select(0, src))
        st.vp_all[layer].index_copy_(0, rows, q.vp[layer].index_select(0, src))
    st.pmask_all.index_copy_(0, rows, q.pmask.index_select(0, src))
    st.plen_all.index_copy_(0, rows, q.plen.index_select(0, src))
    first = q.first.index_select(0, img)
    tokens = torch.zeros(lanes, *st.tokens.shape[1:], dtype=torch.long, device=first.device)
    tokens[:, :, 0] = first
    stopped = _is_stop(first, stop)
    put(st.tokens, slots, tokens, valid)
    put(st.scores, slots, q.first_scores.index_select(0, img), valid)
    put(st.lengths, slots, torch.ones_like(st.lengths[:lanes]), valid)
    put(st.stopped, slots, stopped, valid)
    put(st.gpos, slots, torch.zeros_like(st.gpos[:lanes]), valid)
    put(st.img, slots, img, valid)
    put(st.occ, slots, valid, valid)
    put(st.live, slots, ~stopped.all(dim=1) & (st.max_gen > 0), valid)
    q.head.add_(valid.sum())


def _shrink(st: _Rows, q: _Queue, step: Step, gpt, live: int) -> _Rows:
    """The queue is empty and at most half the slots are live: the live slots move to rows of the next
    power-of-two count that holds them (a few shapes, so a few compiled graphs), copied once; finished
    images still in the rows are copied out first. The tail of a call then computes no dead rows."""
    s = st.live.shape[0]
    small = s
    while small > 1 and live <= small // 2:
        small //= 2
    dev = st.live.device
    _copy_out(st, q, torch.arange(s, device=dev), st.occ & ~st.live)
    keep = torch.argsort((~st.live).to(torch.uint8), stable=True)[:small]  # live slots first
    w, lmax = st.tokens.shape[1:]
    new = _rows(step, gpt, small, w, lmax, st.pmask.shape[-1], st.plen.shape[0] // s, st.kp[0].dtype, dev)
    rows = torch.cat([keep + j * s for j in range(st.plen.shape[0] // s)])
    for a, b in zip([*new.kp, *new.vp, *new.kg, *new.vg, new.pmask, new.plen],
                    [*st.kp, *st.vp, *st.kg, *st.vg, st.pmask, st.plen]):
        a.copy_(b.index_select(0, rows))
    for name in ("gpos", "tokens", "scores", "lengths", "stopped", "anc", "img", "live"):
        getattr(new, name).copy_(getattr(st, name).index_select(0, keep))
    new.occ.copy_(new.live)
    return new


@torch.no_grad()
def _beam_rows(
    gpt,
    prompts: Sequence[torch.Tensor],
    w: int,
    max_len: int,
    stop: torch.Tensor,
    temperature: float,
    slots: int,
    neg_prompts: Sequence[torch.Tensor] | None = None,
    lam: float = 0.0,
    step: Step = _gpt_step,
    stats: dict | None = None,
) -> list[list[Beam]]:
    """Beam search of all images through ``slots`` image slots (continuous batching): every step runs
    ``step`` on all slots (fixed shapes, :class:`_Rows`); before each step, slots whose image has
    finished take the next images (:func:`_refill`), so rows wait for no other image's longest beam.
    Rows (cache, logits) are laid out [stream][slot][beam]; stream 1 (contrastive negatives) exists
    only with ``neg_prompts`` and follows stream 0's choices. The host asks whether anything is left
    once every :data:`CHECK_EVERY` steps and reads the beams once, at the end (:func:`_collect`).
    ``stats`` (a dict) receives steps, slot-steps and the fraction of row-steps that were live."""
    dev = prompts[0].device
    n = len(prompts)
    streams = 1 if neg_prompts is None else 2
    tp = max(p.shape[0] for p in [*prompts, *(neg_prompts or [])])
    tp = -(-tp // 8) * 8  # a few prompt widths, not one per call (the kept rows are per shape)
    q = _queue(gpt, prompts, neg_prompts, w, max_len, temperature, lam, tp, chunk=max(slots, 1) * streams)
    st = _rows(step, gpt, slots, w, max_len, tp, streams, q.kp[0].dtype, dev)
    _refill(st, q, slots, stop)  # the first images, every slot at once
    lanes = -(-slots // REFILL_LANES)
    live_steps = torch.zeros((), dtype=torch.long, device=dev)
    steps = slot_steps = 0
    queued = True
    while True:
        if steps and steps % CHECK_EVERY == 0:
            # the one host read of CHECK_EVERY steps (before the first step the slots have just been filled)
            live, head = torch.stack([st.live.sum(), q.head]).tolist()
            queued = head < n
            if not live and not queued:
                break
            if not queued and live <= st.live.shape[0] // 2:
                st = _shrink(st, q, step, gpt, live)
        if steps and queued:
            _refill(st, q, lanes, stop)
        live_steps += st.live.sum()
        step(gpt, st, stop, temperature, lam)
        steps += 1
        slot_steps += st.live.shape[0]
    _copy_out(st, q, torch.arange(st.live.shape[0], device=dev), st.occ.clone())
    if stats is not None:
        live = int(live_steps)
        stats.update(steps=steps, slots=slots, rows=slots * w * streams, slot_steps=slot_steps,
                     live_slot_steps=live, live_row_fraction=live / max(1, slot_steps))
    return _collect(q.out_tokens[:n], q.out_scores[:n], q.out_lengths[:n], q.out_stopped[:n])


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
    rows: int | None = None,
    neg_prompts: Sequence[torch.Tensor] | None = None,
    contrastive_lambda: float = 0.0,
    step: Step | None = None,
    stats: dict | None = None,
) -> list[list[Beam]]:
    """The reference beam search for many prompts ([T_i, D] each) at once, KV-cached, continuously
    batched (:func:`_beam_rows`): ``rows`` beam rows on the device (``captioner.rows``), else
    ``batch_size`` image slots (None: all images). Returns, per prompt, W beams sorted by mean log-prob
    descending; an image's beams do not depend on which images share the rows. ``neg_prompts`` (one per
    prompt) + ``contrastive_lambda`` > 0: the contrastive score of :func:`beam_search_reference`.
    ``step``: the step (None: the eager :func:`_gpt_step`; :func:`beam_step` gives the compiled one)."""
    if not prompts:
        return []
    use_neg = neg_prompts is not None and float(contrastive_lambda) != 0.0
    if use_neg and len(neg_prompts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(neg_prompts)} negative prompts")
    _check(gpt, list(prompts) + (list(neg_prompts) if use_neg else []), beam_width, max_len)
    _check_fast_lm(gpt)
    stop = torch.tensor(list(stop_ids), device=prompts[0].device)
    slots = slots_for(rows, batch_size, beam_width, len(prompts), 2 if use_neg else 1)
    return _beam_rows(gpt, list(prompts), beam_width, max_len, stop, temperature, slots,
                      list(neg_prompts) if use_neg else None, float(contrastive_lambda), step or _gpt_step, stats)


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
    rows: int | None = None,
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
            temperature=temperature, batch_size=batch_size, rows=rows,
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
