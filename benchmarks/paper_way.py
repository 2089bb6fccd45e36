"""The four stages done the way the paper's code does them, beside adjcap's, on the same models and inputs.

The paper's way (the pipeline done naively):

* one image at a time through every stage;
* BLIP ITM per (image, caption) pair, the image encoded again for every pair and the caption padded to
  35 tokens (LAVIS's ``padding="max_length"``): stage 2's L retrieved captions and stage 4's N candidates;
* IFCap's own beam search (``captioner.search = "reference"``: no KV cache, as IFCap's official code);
* open_clip's text tower over the full 77-token context for the candidates of stage 4.

Both ways run adjcap's own stage functions (:mod:`adjcap.engine.stages`), so what each stage writes is the same
code; only the computation differs: the paper's way hands them the adapters below. :func:`side_by_side`
runs each stage both ways on identical inputs (the states before the stage, copied), times both, compares
the outputs, and goes on from adjcap's. Used by ``benchmarks/realsize.py --mode side-by-side`` (real-size
architectures) and by tests/test_paper_way.py (the demo world's tiny models)."""

from __future__ import annotations

import copy
import gc
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from adjcap.engine import image_state, stages

STAGES = ("retrieve", "verify", "caption", "score")


class _Images:
    """What :class:`PairwiseITM` "encodes": nothing, the images are kept for every pair."""

    def __init__(self, images: Sequence[Any]):
        self.images = list(images)
        # stage 2 hands stage 4 an image encoding (one batched tensor, copied to the host once); the
        # paper's way has none to hand on: an empty row per image
        self.image_embeds = torch.zeros(len(self.images), 0)

    def __len__(self) -> int:
        return len(self.images)


class PairwiseITM:
    """A verifier with the interface :mod:`adjcap.engine.stages` calls, computing the paper's way: the whole
    ``BlipForImageTextRetrieval`` forward for every (image, caption) pair, captions padded to
    ``max_text_tokens``. Same weights, tokenizer and image processor as ``verifier``."""

    def __init__(self, verifier):
        self.v = verifier
        self.backend = getattr(verifier, "backend", "transformers")

    def encode_images(self, images) -> _Images:
        return _Images(images)

    @torch.inference_mode()
    def score(self, memo: _Images, texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        v, out = self.v, []
        for image, texts in zip(memo.images, texts_per_image, strict=True):
            probs = np.zeros(len(texts), dtype=np.float32)
            pixels = v.preprocess([image]).to(v.device, dtype=v.dtype)  # the vision encoder runs on it per pair
            for j, seq in enumerate(v.tokenize(list(texts))):
                ids = torch.full((1, v.max_text_tokens), v.pad_id, dtype=torch.long)
                mask = torch.zeros((1, v.max_text_tokens), dtype=torch.long)
                ids[0, : len(seq)] = torch.as_tensor(seq)
                mask[0, : len(seq)] = 1
                res = v.model(input_ids=ids.to(v.device), pixel_values=pixels, attention_mask=mask.to(v.device),
                              use_itm_head=True)
                probs[j] = float(res.itm_score.float().softmax(dim=-1)[0, 1])
            out.append(probs)
        return out


class Padded77:
    """An encoder whose text tower runs open_clip's own ``encode_text`` over the full context (77 tokens)
    instead of adjcap's trimmed, length-bucketed batches. Images as the wrapped encoder."""

    def __init__(self, encoder):
        self.e = encoder

    def encode_texts(self, texts: Sequence[str], normalize: bool = True) -> torch.Tensor:
        return self.e.encode_texts(texts, normalize=normalize, trim=False)

    def encode_images(self, images, normalize: bool = True) -> torch.Tensor:
        return self.e.encode_images(images, normalize=normalize)


def way(stage: Callable[..., Any], *args: Any, each: bool = False,
        prepare: Callable[[list], None] | None = None) -> Callable[[list], None]:
    """``stage(states, *args)`` on the whole list (the job's batch) or, with ``each``, one image's state
    at a time; ``prepare(states)`` first."""
    def run(states: list) -> None:
        if prepare is not None:
            prepare(states)
        for batch in ([s] for s in states) if each else [states]:
            stage(batch, *args)
    return run


def _forget_stage2_encoding(states: list) -> None:
    for s in states:
        s.verifier_memo = None  # the paper's way has no stage-2 image encoding to reuse


def both_ways(stage: str, models: Any, cfg, index, corpus_texts) -> tuple[Callable, Callable]:
    """(adjcap's way, the paper's way) of ``stage`` with its pool's ``models``."""
    if stage == "retrieve":
        args = (models, index, corpus_texts, cfg.retrieval.top_l)
        return way(stages.retrieve, *args), way(stages.retrieve, *args, each=True)
    if stage == "verify":
        keep = cfg.verifier.keep
        return way(stages.verify, models, keep), way(stages.verify, models and PairwiseITM(models), keep, each=True)
    if stage == "caption":
        c, reference = models, cfg.captioner.model_copy(update={"search": "reference"})
        return (way(stages.caption, c.captioner, c.clip, cfg.captioner, c.vocabulary),
                way(stages.caption, c.captioner, c.clip, reference, c.vocabulary, each=True))
    enc, ver = models
    return (way(stages.score, enc, ver),
            way(stages.score, Padded77(enc), ver and PairwiseITM(ver), each=True, prepare=_forget_stage2_encoding))


# ---- comparing what the two ways wrote -------------------------------------------------------------


def _max_diff(a: Sequence[float], b: Sequence[float]) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if not (math.isnan(x) and math.isnan(y))]
    return max((abs(x - y) for x, y in pairs), default=0.0)


def compare(stage: str, ours: Sequence[image_state.ImageState], paper: Sequence[image_state.ImageState]) -> dict[str, Any]:
    """How far the paper's way's output of ``stage`` is from adjcap's, image by image."""
    out: dict[str, Any] = {"images": len(ours), "errors": [s.error for s in (*ours, *paper) if s.error]}
    if stage == "retrieve":
        out["same_ids"] = sum([r["corpus_id"] for r in a.retrieved] == [r["corpus_id"] for r in b.retrieved]
                              for a, b in zip(ours, paper))
        out["max_abs_diff"] = max(_max_diff([r["cosine"] for r in a.retrieved], [r["cosine"] for r in b.retrieved])
                                  for a, b in zip(ours, paper))
    elif stage == "verify":
        out["same_kept"] = sum([r["corpus_id"] for r in a.verified] == [r["corpus_id"] for r in b.verified]
                               for a, b in zip(ours, paper))
        out["max_abs_diff"] = max(_max_diff([r["verifier"] for r in a.retrieved],
                                            [r["verifier"] for r in b.retrieved]) for a, b in zip(ours, paper))
    elif stage == "caption":
        out["same_beams"] = sum([c["text"] for c in a.candidates] == [c["text"] for c in b.candidates]
                                for a, b in zip(ours, paper))
        out["max_abs_diff"] = max(_max_diff([c["lm_logprob_sum"] for c in a.candidates],
                                            [c["lm_logprob_sum"] for c in b.candidates]) for a, b in zip(ours, paper))
    else:
        keys = ("retrieval_cosine", "verifier")
        out["same_top"] = sum(all(_top(a, k) == _top(b, k) for k in keys) for a, b in zip(ours, paper))
        out["max_abs_diff"] = max(_max_diff([c[k] for c in a.candidates for k in keys],
                                            [c[k] for c in b.candidates for k in keys]) for a, b in zip(ours, paper))
    return out


def _top(s: image_state.ImageState, key: str) -> int:
    vals = [c[key] for c in s.candidates]
    return int(np.nanargmax(vals)) if vals and not all(math.isnan(v) for v in vals) else -1


def equal(stage: str, c: dict[str, Any]) -> bool:
    """The stage's decisions agree on every image (ids, kept captions, beams, the top candidate)."""
    key = {"retrieve": "same_ids", "verify": "same_kept", "caption": "same_beams", "score": "same_top"}[stage]
    return not c["errors"] and c[key] == c["images"]


# ---- the side by side --------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t, c = time.perf_counter(), time.process_time()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t, time.process_time() - c


def side_by_side(cfg, states: list[image_state.ImageState], load: Callable[[str], Any], index, corpus_texts,
                 echo=print) -> dict[str, Any]:
    """Each stage both ways on copies of the same states; ``load(pool)`` gives the pool's models
    ("retriever": image encoder, "verifier", "captioner": CaptionerRole, "scorer": (text encoder,
    verifier)), loaded one pool at a time and dropped after. adjcap's way runs the stage on the whole
    list at once (the job's batch); returns per stage the seconds and CPU seconds per image of each way
    and the comparison, and ``states`` holds adjcap's outputs of all four stages."""
    n = len(states)
    out: dict[str, Any] = {"images": n, "stages": {}}
    for stage in STAGES:
        models = load(stage_pool(stage))
        ours, paper = both_ways(stage, models, cfg, index, corpus_texts)
        before = copy.deepcopy(states)
        wall, cpu = _timed(lambda: ours(states))
        p_wall, p_cpu = _timed(lambda: paper(before))
        c = compare(stage, states, before)
        out["stages"][stage] = {"adjcap_s_per_image": wall / n, "adjcap_cpu_s_per_image": cpu / n,
                                "paper_s_per_image": p_wall / n, "paper_cpu_s_per_image": p_cpu / n,
                                "equal": equal(stage, c), "compare": c}
        echo(f"  {stage:9s} adjcap {cpu / n:8.2f} CPU-s/image   paper's way {p_cpu / n:8.2f} CPU-s/image   "
             f"x{p_cpu / max(cpu, 1e-9):6.1f}   outputs {'equal' if equal(stage, c) else 'DIFFER'} "
             f"(max |diff| {c['max_abs_diff']:.2e})")
        del models, ours, paper, before
    ours_total = sum(v["adjcap_cpu_s_per_image"] for v in out["stages"].values())
    paper_total = sum(v["paper_cpu_s_per_image"] for v in out["stages"].values())
    out.update(adjcap_cpu_s_per_image=ours_total, paper_cpu_s_per_image=paper_total,
               ratio=paper_total / max(ours_total, 1e-9), equal=all(v["equal"] for v in out["stages"].values()))
    echo(f"  {'total':9s} adjcap {ours_total:8.2f} CPU-s/image   paper's way {paper_total:8.2f} CPU-s/image   "
         f"x{out['ratio']:6.1f}   outputs {'equal' if out['equal'] else 'DIFFER'}")
    return out


def stage_pool(stage: str) -> str:
    return {"retrieve": "retriever", "verify": "verifier", "caption": "captioner", "score": "scorer"}[stage]
