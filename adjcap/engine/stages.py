"""The four frozen stages as pure batch functions over per-image states.

Each stage takes a list of :class:`ImageState` plus the models it needs and fills in its part. A stage
never raises for one bad image: the batch is retried image by image and the failing image gets its
``error`` set (its row is still written, so reports count it). Images whose ``error`` is already set
are passed through untouched. Out of GPU memory a batch is retried in halves (the halved size carries
to the stage's next batches in the process: :class:`HalvedSizes`); a GPU failure is never an image's
error but the job's end (:mod:`adjcap.engine.gpu_errors`).

    retrieve  : retrieval-encoder image tower + caption index   -> retrieved (L), retrieval image embedding
    verify    : BLIP ITM on the L retrieved                     -> verified (k), verifier image memo
    caption   : IFCap (CLIP ViT-B/32 + mapping net + GPT-2)     -> entities, prompt, beam of N candidates
    score     : output-scorer encoder + BLIP ITM (+ CLIPScore encoder) -> per-candidate retrieval cosine,
                verifier, CLIPScore cosine

Each is a stage's batch function in the stage registry (:mod:`adjcap.engine.stage_registry`), through which
the pool actor (``actors/pool.py``) and :func:`adjcap.engine.pipeline.run_pipeline` call exactly these functions.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import traceback
from typing import Callable, Sequence

import numpy as np
import torch

from adjcap.models import entities as ent
from adjcap.engine import gpu_errors
from adjcap.machine import numerics
from adjcap.config import CaptionerCfg
from adjcap.engine.image_state import ImageState
from adjcap.models.judge_window import judge
from adjcap.models.pixels import Pixels, stacked

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# error isolation
# --------------------------------------------------------------------------------------------


def _guarded(stage: str, fn: Callable[[list[ImageState]], None], states: list[ImageState], *,
             completes: bool = True) -> list[ImageState]:
    """Run ``fn`` on the ok states that do not hold the stage's output yet (filled from the stage
    cache: ``done``), the whole batch at once or, with portable numerics, one image at a time
    (:func:`adjcap.machine.numerics.per_image`); out of GPU memory, in halves (:func:`run_batch`). If the batch
    fails otherwise, retry one image at a time. A GPU failure (:mod:`adjcap.engine.gpu_errors`) is never an
    image's error: it ends the job. Marks the stage done/computed unless ``fn`` is only part of the
    stage (``completes=False``: a later pool finishes it)."""
    live = [s for s in states if s.ok and stage not in s.done]
    if not live:
        return states
    try:
        if numerics.per_image():  # portable numerics: an image's outputs do not depend on its batch
            for s in live:
                run_batch(stage, fn, [s])
        else:
            run_batch(stage, fn, live)
    except gpu_errors.GpuFailure:
        raise
    except Exception:  # noqa: BLE001 - isolate the failing image(s), keep the others
        if len(live) == 1:
            live[0].error = f"{stage}: {traceback.format_exc(limit=3).strip().splitlines()[-1]}"
        else:
            for s in live:
                try:
                    run_batch(stage, fn, [s])
                except gpu_errors.GpuFailure:
                    raise
                except Exception as e:  # noqa: BLE001
                    s.error = f"{stage}: {type(e).__name__}: {e}"
    for s in live if completes else ():
        if s.ok:
            s.done.add(stage)
            s.computed.add(stage)
    return states


class HalvedSizes:
    """Per stage, the batch size an out-of-memory halved a batch to, carried to the next batches of the
    process that holds it (a pool actor, for its whole life; :func:`adjcap.engine.pipeline.run_pipeline`, for
    its call): without it every next batch would fail once again at full size, each failure costing a
    forward pass and an allocator flush. A carried size never grows back: what ran out of memory once
    (long prompts, a full beam) can come again in any later batch, and a job restarts at full size."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def cap(self, stage: str, n: int) -> int:
        """The size the next batch of ``n`` images of ``stage`` starts at."""
        return min(n, self.sizes.get(stage, n))

    def halved(self, stage: str, size: int) -> None:
        """``stage`` runs out of memory above ``size`` images: carry it (logged when it changes)."""
        if size < self.sizes.get(stage, size + 1):
            self.sizes[stage] = size
            log.warning("stage %s ran out of GPU memory: its next batches in this process start at %d image(s)",
                        stage, size)


_CARRIED: contextvars.ContextVar[HalvedSizes | None] = contextvars.ContextVar("adjcap_halved_sizes", default=None)


@contextlib.contextmanager
def carrying(sizes: HalvedSizes):
    """Within the block, :func:`run_batch` starts each stage's batches at the size ``sizes`` carries and
    carries the sizes it halves to; outside any such block a halved size holds for its batch only."""
    token = _CARRIED.set(sizes)
    try:
        yield sizes
    finally:
        _CARRIED.reset(token)


def run_batch(stage: str, fn: Callable[[list[ImageState]], None], batch: list[ImageState]) -> None:
    """``fn(batch)``; out of GPU memory, the rest of the batch again in halves, down to one image; the
    halved size holds for the rest of this batch and, inside :func:`carrying`, for the next batches of
    the stage (they start at it). One image that still does not fit, or any other GPU error, raises
    :class:`adjcap.engine.gpu_errors.GpuFailure`. Other errors pass through."""
    carried = _CARRIED.get()
    size, i = (carried.cap(stage, len(batch)) if carried is not None else len(batch)), 0
    while i < len(batch):
        part = batch[i : i + size]
        try:
            fn(part)
        except Exception as e:  # noqa: BLE001 - sorted below: out of memory, a GPU failure, the rest
            if gpu_errors.is_oom(e):
                del e  # its traceback holds the frames (and tensors) that filled the memory
                if len(part) == 1:
                    raise gpu_errors.oom_failure(stage, len(batch)) from None
                size = max(1, len(part) // 2)
                if carried is not None:
                    carried.halved(stage, size)
                _free_gpu_cache()
                continue
            if gpu_errors.is_accelerator_error(e):
                raise gpu_errors.accelerator_failure(stage, len(part), e) from e
            raise
        i += len(part)


def _free_gpu_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _images(states: Sequence[ImageState], model) -> list | Pixels:
    """What ``model.encode_images`` takes for these images: the pixels the decode tasks prepared for its
    geometry (:mod:`adjcap.engine.pixel_prep`; normalised on its device), else the decoded images."""
    prep = getattr(model, "pixel_prep", None)
    if prep is not None and states and all(prep.key in s.pixels for s in states):
        return Pixels(stacked([s.pixels[prep.key] for s in states]), prep.key)
    missing = [s.image_id for s in states if s.image is None and s.encoded is None]
    if missing:
        have = sorted({k for s in states for k in s.pixels})
        raise ValueError(f"{getattr(model, 'model_id', type(model).__name__)} needs pixels "
                         f"'{prep.key if prep else 'the decoded image'}', the decode tasks prepared {have} "
                         f"and no image bytes ({missing[0]}): set ray.prepare_pixels=false")
    return [s.pil() for s in states]


# --------------------------------------------------------------------------------------------
# Stage 1: retrieval
# --------------------------------------------------------------------------------------------


def retrieve(states: list[ImageState], encoder, index, corpus_texts: Sequence[str], top_l: int) -> list[ImageState]:
    """Top-L corpus captions by cosine of L2-normalised embeddings (paper Eq. stage1)."""

    def run(batch: list[ImageState]) -> None:
        with torch.inference_mode():
            emb = encoder.encode_images(_images(batch, encoder), normalize=True)
        scores, ids = index.search(emb, top_l)
        scores = _np(scores)
        ids = _np(ids)
        emb_np = _np(emb).astype(np.float32)
        for i, s in enumerate(batch):
            s.retrieval_embedding = emb_np[i]
            s.retrieved = [
                {"corpus_id": int(c), "text": corpus_texts[int(c)], "cosine": float(v), "verifier": math.nan}
                for c, v in zip(ids[i], scores[i])
            ]

    return _guarded("retrieve", run, states)


# --------------------------------------------------------------------------------------------
# Stage 2: verification
# --------------------------------------------------------------------------------------------


def verify(states: list[ImageState], verifier, keep: int) -> list[ImageState]:
    """BLIP ITM match probability on the L retrieved; keep the top k (paper Eq. stage2).

    With ``verifier=None`` (IFCap and ablation rows without a verifier) the first k retrieved are
    kept in retrieval order and their verifier score is NaN."""

    def run(batch: list[ImageState]) -> None:
        if verifier is None:
            for s in batch:
                s.verified = [
                    {"corpus_id": r["corpus_id"], "text": r["text"], "verifier": math.nan, "retrieval_rank": j}
                    for j, r in enumerate(s.retrieved[:keep])
                ]
            return
        with torch.inference_mode():
            memo = verifier.encode_images(_images(batch, verifier))
            probs = verifier.score(memo, [[r["text"] for r in s.retrieved] for s in batch])
            # only the vision-encoder output travels to stage 4; cross-attention K/V are recomputed
            # there from it (cheap), which keeps the per-image state small between Ray pools. One copy
            # to the host for the batch (a read per image would stall a GPU once per image)
            embeds = memo.image_embeds.detach().cpu()
        for i, s in enumerate(batch):
            p = np.asarray(probs[i], dtype=np.float64)
            for r, v in zip(s.retrieved, p):
                r["verifier"] = float(v)
            # stable sort: equal scores keep retrieval order
            order = np.argsort(-p, kind="stable")[:keep]
            s.verified = [
                {
                    "corpus_id": s.retrieved[j]["corpus_id"],
                    "text": s.retrieved[j]["text"],
                    "verifier": float(p[j]),
                    "retrieval_rank": int(j),
                }
                for j in order
            ]
            s.verifier_memo = embeds[i].clone()  # its own storage: a state pickles only its image's
            s.verifier_backend = getattr(verifier, "backend", "transformers")

    return _guarded("verify", run, states)


# --------------------------------------------------------------------------------------------
# Stage 3: IFCap captioning
# --------------------------------------------------------------------------------------------


def entity_pool(state: ImageState, pool: str) -> list[str]:
    """The captions the frequency filter counts nouns over: the k verified or all L retrieved."""
    src = state.verified if pool == "verified" else state.retrieved
    return [c["text"] for c in src]


def caption(
    states: list[ImageState],
    captioner,
    clip,
    ccfg: CaptionerCfg,
    vocabulary: tuple[list[str], torch.Tensor] | None = None,
    nouns=None,
) -> list[ImageState]:
    """Run the unchanged IFCap captioner on the verified pool; emit a beam of N candidates.
    ``ccfg`` is the resolved captioner section; ``nouns``: the corpus captions' noun lemmas tagged
    once (:class:`adjcap.index.nouns.CorpusNouns`), counted by corpus id (None: tag each image's)."""
    ecfg = ccfg.entities

    def run(batch: list[ImageState]) -> None:
        with torch.inference_mode():
            img = clip.encode_images(_images(batch, clip), normalize=True)
            k = ccfg.fusion_captions
            fusion_texts = [[c["text"] for c in s.verified[:k]] for s in batch]
            if any(len(t) == 0 for t in fusion_texts):
                raise ValueError("no retrieved captions to fuse")
            flat = [t for ts in fusion_texts for t in ts]
            txt = clip.encode_texts(flat, normalize=False)
            feats, start = [], 0
            for ts in fusion_texts:
                feats.append(txt[start : start + len(ts)])
                start += len(ts)
            entity_lists = []
            if ecfg.mode == "frequency" and nouns is not None:
                for s in batch:
                    src = s.verified if ecfg.pool == "verified" else s.retrieved
                    entity_lists.append(ent.filter_entities(nouns.counts([c["corpus_id"] for c in src]),
                                                            ecfg.threshold))
            elif ecfg.mode == "frequency":
                tagger, lemmatize = _tagger(ecfg.tagger)
                for s in batch:
                    counts = ent.count_nouns(entity_pool(s, ecfg.pool), tagger=tagger, lemmatize=lemmatize)
                    entity_lists.append(ent.filter_entities(counts, ecfg.threshold))
            elif ecfg.mode == "clip_classifier":
                if vocabulary is None:
                    raise ValueError("captioner.entities.mode=clip_classifier needs captioner.entities.vocabulary")
                names, vocab_emb = vocabulary
                entity_lists = ent.clip_classifier_entities(
                    img, vocab_emb, names, top_k=ecfg.classifier_top_k,
                    threshold=ecfg.classifier_threshold, temperature=ecfg.classifier_temperature,
                )
            else:
                entity_lists = [[] for _ in batch]
            negatives = None
            if ccfg.contrastive_lambda > 0:
                negatives = [clip.encode_texts(t, normalize=False).float() for t in _bottom_captions(batch, 4)]
            beams = captioner.generate(
                img.float(), [f.float() for f in feats], entity_lists,
                decoder=ccfg.decoder, beam_width=ccfg.beam_width, max_len=ccfg.max_len, search=ccfg.search,
                batch_size=ccfg.batch_size, rows=ccfg.rows,
                negative_retrieved_feats=negatives, contrastive_lambda=ccfg.contrastive_lambda,
            )
        for s, ents, beam in zip(batch, entity_lists, beams):
            s.entities = list(ents)
            s.prompt = ent.hard_prompt(ents)
            s.candidates = _candidate_rows(beam)

    return _guarded("caption", run, states)


def _candidate_rows(beam) -> list[dict]:
    """Stage 3's fields of each candidate (the scores stage 4 fills are NaN)."""
    return [{"text": c.text, "lm_logprob_sum": float(c.lm_logprob_sum), "lm_logprob_mean": float(c.lm_logprob_mean),
             "n_tokens": int(c.n_tokens), "beam_rank": int(c.beam_rank), "retrieval_cosine": math.nan,
             "verifier": math.nan, "clipscore_cosine": math.nan} for c in beam]


def caption_hf(states: list[ImageState], captioner, ccfg: CaptionerCfg) -> list[ImageState]:
    """A transformers captioner's N-best beam (:mod:`adjcap.models.hf_captioner`), ``ccfg.batch_size``
    images per ``generate``; no entities, the prompt is ``captioner.hf.prompt``."""

    def run(batch: list[ImageState]) -> None:
        for start in range(0, len(batch), ccfg.batch_size):
            part = batch[start : start + ccfg.batch_size]
            beams = captioner.beams(_images(part, captioner), beam_width=ccfg.beam_width, max_len=ccfg.max_len,
                                    prompt=ccfg.hf.prompt, decoder=ccfg.decoder)
            for s, beam in zip(part, beams):
                s.entities, s.prompt, s.candidates = [], ccfg.hf.prompt, _candidate_rows(beam)

    return _guarded("caption", run, states)


def caption_vlm(states: list[ImageState], captioner, ccfg: CaptionerCfg) -> list[ImageState]:
    """A vision-language model's candidates (:mod:`adjcap.models.vlm_captioner`): ``captioner.beam_width``
    beams or seeded samples of each image (greedy: one), asked ``captioner.vlm.prompt``; no entities."""
    from adjcap.models.vlm_captioner import image_seed, instruction

    v = ccfg.vlm
    search = "greedy" if ccfg.decoder == "greedy" else v.search

    def run(batch: list[ImageState]) -> None:
        seeds = [image_seed(v.sample_seed, s.image_id) for s in batch]
        beams = captioner.beams(_images(batch, captioner), prompt=v.prompt, n=ccfg.beam_width,
                                max_new_tokens=v.max_new_tokens, search=search, seeds=seeds)
        for s, beam in zip(batch, beams):
            s.entities, s.prompt, s.candidates = [], instruction(v.prompt), _candidate_rows(beam)

    return _guarded("caption", run, states)


def caption_candidates(states: list[ImageState], table, judge, ccfg: CaptionerCfg) -> list[ImageState]:
    """Each image's candidates from a file (:class:`adjcap.data.candidates.CandidateTable`) in the file's
    order; log-prob sum, token count and mean from the file where it gives them, else from the LM judge
    (``judge``, :class:`adjcap.models.text_lm.TextLM`; its tokenizer alone counts tokens). An image's
    error names the file and line its candidates came from."""
    from adjcap.models.decoding import Candidate

    def run(batch: list[ImageState]) -> None:
        try:
            from_file(batch)
        except Exception as e:  # noqa: BLE001 - one image (the batch was split): its line says what to fix
            got = table.get(batch[0].image_id) if len(batch) == 1 else None
            if got is None or gpu_errors.is_oom(e) or gpu_errors.is_accelerator_error(e):
                raise
            raise ValueError(f"{table.source}:{got.line}: image '{batch[0].image_id}': {type(e).__name__}: {e}") from e

    def from_file(batch: list[ImageState]) -> None:
        sets = []
        for s in batch:
            got = table.get(s.image_id)
            if got is None:
                raise ValueError(f"no candidates for image '{s.image_id}' in {table.source} (captioner.candidates."
                                 "allow_missing)")
            sets.append(got)
        judged = [t for c in sets if c.logprobs is None for t in c.texts]
        scores = iter(judge.score(judged, ccfg.candidates.lm_batch_size) if judged else [])
        for s, c in zip(batch, sets):
            if c.logprobs is None:
                sums, counts = zip(*(next(scores) for _ in c.texts))
            else:
                sums = c.logprobs
                counts = c.n_tokens or judge.count(c.texts)
            means = c.logprob_means or tuple(x / n for x, n in zip(sums, counts))
            beam = [Candidate(t, x, m, n, j, True) for j, (t, x, m, n) in enumerate(zip(c.texts, sums, means, counts))]
            s.entities, s.prompt, s.candidates = [], None, _candidate_rows(beam)

    return _guarded("caption", run, states)


def _bottom_captions(batch: list[ImageState], n: int) -> list[list[str]]:
    """The contrastive-decoding negatives (DESIGN 4, a negative result kept as an option): the
    verifier's bottom n of the L retrieved (retrieval order's last n without a verifier)."""
    out = []
    for s in batch:
        scored = [(r.get("verifier"), j, r["text"]) for j, r in enumerate(s.retrieved)]
        if all(v is not None and not math.isnan(v) for v, _, _ in scored):
            scored.sort(key=lambda t: (t[0], -t[1]))
            out.append([t for _, _, t in scored[:n]])
        else:
            out.append([r["text"] for r in s.retrieved[-n:]])
    return out


@functools.lru_cache(maxsize=4)
def _tagger(spec: str):
    return ent.load_tagger(spec)


# --------------------------------------------------------------------------------------------
# Stage 4: beam scoring
# --------------------------------------------------------------------------------------------


def score(states: list[ImageState], encoder, verifier, clipscore_encoder=None, *,
          reuse_image_embedding: bool = True, long_captions: str = "whole") -> list[ImageState]:
    """Per candidate: the output scorer's cosine with the image (``encoder``; with
    ``reuse_image_embedding`` it is the retrieval encoder and the stage-1 image embedding is reused),
    the verifier score (reusing the stage-2 image encoding when present; the text read as
    ``long_captions`` says), and the CLIPScore encoder's cosine (``clipscore_encoder``; None: it is the
    output scorer, whose cosine is reused)."""

    def cosines(enc, batch: list[ImageState], flat: list[str], reuse: bool) -> list[np.ndarray]:
        temb = _np(enc.encode_texts(flat, normalize=True)).astype(np.float32) if flat else None
        if reuse:
            missing = [s for s in batch if s.retrieval_embedding is None]
            if missing:
                emb = _np(enc.encode_images(_images(missing, enc), normalize=True)).astype(np.float32)
                for s, e in zip(missing, emb):
                    s.retrieval_embedding = e
            img = [s.retrieval_embedding for s in batch]
        else:
            img = list(_np(enc.encode_images(_images(batch, enc), normalize=True)).astype(np.float32))
        out, start = [], 0
        for s, e in zip(batch, img):
            n = len(s.candidates)
            out.append(temb[start : start + n] @ e if n else np.zeros(0, np.float32))
            start += n
        return out

    def run(batch: list[ImageState]) -> None:
        with torch.inference_mode():
            texts = [[c["text"] for c in s.candidates] for s in batch]
            flat = [t for ts in texts for t in ts]
            cos = cosines(encoder, batch, flat, reuse_image_embedding)
            cs = cos if clipscore_encoder is None else cosines(clipscore_encoder, batch, flat, False)
            probs = None
            if verifier is not None:
                memo = _memo_for(verifier, batch)
                probs = judge(verifier, memo, texts, long_captions)
        for i, s in enumerate(batch):
            for j, c in enumerate(s.candidates):
                c["retrieval_cosine"] = float(cos[i][j])
                c["clipscore_cosine"] = float(cs[i][j])
                # without a verifier here, keep a score an earlier pool set (the lavis backend's scorer)
                c["verifier"] = float(probs[i][j]) if probs is not None else c.get("verifier", math.nan)

    return _guarded("score", run, states)


def score_verifier(states: list[ImageState], verifier, long_captions: str = "whole") -> list[ImageState]:
    """The verifier half of stage 4 alone (the ``lavis`` backend's own pool): every candidate's verifier
    score, reusing the stage-2 image encoding when present."""

    def run(batch: list[ImageState]) -> None:
        with torch.inference_mode():
            probs = judge(verifier, _memo_for(verifier, batch), [[c["text"] for c in s.candidates] for s in batch],
                          long_captions)
        for s, p in zip(batch, probs):
            for c, v in zip(s.candidates, p):
                c["verifier"] = float(v)
            s.verifier_backend = getattr(verifier, "backend", "transformers")

    # the cosines are still to come (the scorer pool after this one): stage 4 is not done yet
    return _guarded("score", run, states, completes=False)


def _memo_for(verifier, batch: list[ImageState]):
    """The verifier's image encoding of the batch: stage 2's where an image carries it, encoded here for
    the images without it (only those: a pool's output drops the pixels of an image that carries it)."""
    missing = [s for s in batch if s.verifier_memo is None]
    if not missing:
        return verifier.memo_from_image_embeds(torch.stack([s.verifier_memo for s in batch]))
    if len(missing) == len(batch):
        return verifier.encode_images(_images(batch, verifier))
    fresh = iter(verifier.encode_images(_images(missing, verifier)).image_embeds.detach().cpu())
    return verifier.memo_from_image_embeds(torch.stack([s.verifier_memo if s.verifier_memo is not None
                                                        else next(fresh) for s in batch]))


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)
