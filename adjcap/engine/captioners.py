"""The captioner families (``captioner.family``): one record each, the one list of them. Stage 3
(``caption`` in :mod:`adjcap.engine.stage_registry`) loads, sizes and runs the configured family through its
record, and its identity counts the family's own settings only (:func:`unread`), so IFCap runs keep the
identities they had before there were other families.

* ``ifcap``: IFCap + its CLIP (:func:`adjcap.models.roles.load_captioner`), beam over the verified pool;
* ``hf``: a transformers image-to-text model (:mod:`adjcap.models.hf_captioner`), its N-best beam;
* ``vlm``: a vision-language model (any ``AutoModelForImageTextToText``, :mod:`adjcap.models.vlm_captioner`)
  asked an instruction through its chat template, its N-best beam or N seeded samples;
* ``candidates``: a file of captions from any system (:mod:`adjcap.data.candidates`), judged by the
  file's log-probs or a text-only LM (:mod:`adjcap.models.text_lm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from adjcap.models import budget
from adjcap.registry import lookup

if TYPE_CHECKING:
    from adjcap.config import CaptionerCfg, Config

# settings of the captioner section read by one family only (dotted, under "captioner.")
IFCAP_ONLY = ("checkpoint", "clip", "tokenizer", "lm_config", "mapping_heads", "fusion_captions", "search",
              "rows", "compile", "compile_cache", "entities", "contrastive_lambda")
# shared by the beam families (ifcap, hf); a candidates file has its own candidates
BEAM = ("decoder", "beam_width", "max_len", "precision")


@dataclass(frozen=True)
class CaptionerFamily:
    """``load(cfg, device)`` the model; ``size(cfg, gpu)`` its (parameters, bytes) without loading it;
    ``run(states, model, cfg)`` stage 3's batch function; ``settings``: the captioner section's keys it
    reads (its identity when it is the configured family; ``family`` counts unless it is ``ifcap``);
    ``pixels(cfg)``: the image preprocessing its model wants, without loading it (:mod:`adjcap.engine.pixel_prep`;
    None: the decoded image itself; nothing: it reads no image)."""

    name: str
    load: Callable[["Config", str], Any]
    size: Callable[["Config", bool], tuple[int, int]]
    run: Callable[[list, Any, "Config"], Any]
    settings: tuple[str, ...]
    pixels: Callable[["Config"], tuple[Any, ...]] = lambda cfg: (None,)


def _bytes(p: str, gpu: bool) -> int:
    return budget.precision_bytes(p, gpu)


# ---- ifcap ---------------------------------------------------------------------------------------

def _load_ifcap(cfg: "Config", device: str):
    from adjcap.models.roles import load_captioner

    return load_captioner(cfg.captioner, device)


def _size_ifcap(cfg: "Config", gpu: bool) -> tuple[int, int]:
    cap = cfg.captioner
    clip = budget.encoder_params(cap.clip)
    own = budget.captioner_params(cap) - clip
    # IFCap's loader keeps fp32 at precision "auto" (adjcap.models.ifcap): counted as it loads
    lm = budget.precision_bytes(cap.precision, gpu, auto_half=False)
    return own + clip, own * lm + clip * _bytes(cap.clip.precision, gpu)


def _pixels_ifcap(cfg: "Config") -> tuple[Any, ...]:
    from adjcap.engine.pixel_memo import clip_pixels

    return (clip_pixels(cfg.captioner.clip, cfg.paths.cache_dir),)


def _run_ifcap(states, c, cfg: "Config"):
    from adjcap.engine import stages

    return stages.caption(states, c.captioner, c.clip, cfg.captioner, c.vocabulary, getattr(c, "nouns", None))


# ---- hf ------------------------------------------------------------------------------------------

def _load_hf(cfg: "Config", device: str):
    from adjcap.models.hf_captioner import load_hf_captioner

    return load_hf_captioner(cfg.captioner.hf.model, device=device, precision=cfg.captioner.precision)


def _size_hf(cfg: "Config", gpu: bool) -> tuple[int, int]:
    n = budget.hf_captioner_params(cfg.captioner.hf.model)
    return n, n * _bytes(cfg.captioner.precision, gpu)


def _run_hf(states, model, cfg: "Config"):
    from adjcap.engine import stages

    return stages.caption_hf(states, model, cfg.captioner)


# ---- vlm -----------------------------------------------------------------------------------------

def _load_vlm(cfg: "Config", device: str):
    from adjcap.models.vlm_captioner import load_vlm

    v = cfg.captioner.vlm
    return load_vlm(v.model, device=device, precision=v.precision, chat=v.chat_template)


def _size_vlm(cfg: "Config", gpu: bool) -> tuple[int, int]:
    n = budget.vlm_params(cfg.captioner.vlm.model)
    return n, n * _bytes(cfg.captioner.vlm.precision, gpu)


def _run_vlm(states, model, cfg: "Config"):
    from adjcap.engine import stages

    return stages.caption_vlm(states, model, cfg.captioner)


# ---- candidates ----------------------------------------------------------------------------------

@dataclass
class CandidatesModel:
    """A candidates file as stage 3 holds it: the file's table and the LM judge (None: not needed;
    a tokenizer-only judge when only token counts are missing)."""

    table: Any
    judge: Any


def candidates_table(c: "CaptionerCfg"):
    from adjcap.data.candidates import CandidatesError, CandidateTable, read_candidates

    if not c.candidates.file:
        raise CandidatesError("captioner.family=candidates needs captioner.candidates.file (or `adjcap caption DIR "
                              "--candidates FILE`)")
    return CandidateTable(read_candidates(c.candidates.file, c.candidates.max_chars), str(c.candidates.file))


def _load_candidates(cfg: "Config", device: str) -> CandidatesModel:
    from adjcap.models.text_lm import load_text_lm

    table = candidates_table(cfg.captioner)
    judge = None
    if table.needs_lm or table.needs_tokenizer:
        judge = load_text_lm(cfg.captioner.candidates.lm, device=device, tokenizer_only=not table.needs_lm)
    return CandidatesModel(table, judge)


def judge_needs(c: "CaptionerCfg") -> tuple[bool, bool]:
    """(the file leaves some candidates to the LM judge, it leaves some token counts to the judge's
    tokenizer), from one read of the file; (False, False) when it cannot be read: preflight says why."""
    try:
        table = candidates_table(c)
    except (ValueError, OSError):
        return False, False
    return table.needs_lm, table.needs_tokenizer


def judge_needed(c: "CaptionerCfg") -> bool:
    """The file leaves some candidates to the LM judge."""
    return judge_needs(c)[0]


def _size_candidates(cfg: "Config", gpu: bool) -> tuple[int, int]:
    if not judge_needed(cfg.captioner):  # a tokenizer alone takes no model memory
        return 0, 0
    n = budget.causal_lm_params(cfg.captioner.candidates.lm)
    return n, n * 4  # the judge runs in fp32


def _run_candidates(states, m: CandidatesModel, cfg: "Config"):
    from adjcap.engine import stages

    return stages.caption_candidates(states, m.table, m.judge, cfg.captioner)


FAMILIES: dict[str, CaptionerFamily] = {f.name: f for f in (
    CaptionerFamily("ifcap", _load_ifcap, _size_ifcap, _run_ifcap, (*IFCAP_ONLY, *BEAM, "batch_size"), _pixels_ifcap),
    CaptionerFamily("hf", _load_hf, _size_hf, _run_hf, ("family", "hf", *BEAM, "batch_size")),
    CaptionerFamily("vlm", _load_vlm, _size_vlm, _run_vlm, ("family", "vlm", "decoder", "beam_width")),
    CaptionerFamily("candidates", _load_candidates, _size_candidates, _run_candidates, ("family", "candidates"),
                    lambda cfg: ()),
)}


def family(name: str) -> CaptionerFamily:
    return lookup(FAMILIES, name, "captioner family", ValueError)


def unread(cfg: "Config") -> tuple[str, ...]:
    """The captioner section's keys the configured family does not read (left out of stage 3's identity)."""
    from adjcap.config import CaptionerCfg

    own = set(family(cfg.captioner.family).settings)
    return tuple(f"captioner.{k}" for k in CaptionerCfg.model_fields if k not in own)


def describe(cfg: "Config") -> str:
    """One line for a run's report on where its candidates came from (empty for IFCap, the default);
    for a candidates file, which LM judged the candidates that came without log-probs."""
    c = cfg.captioner
    if c.family == "hf":
        width = 1 if c.decoder == "greedy" else c.beam_width
        return f"Captioner: {c.hf.model} (hf family, N-best beam of {width}" + \
            (f", prompt '{c.hf.prompt}')" if c.hf.prompt else ")")
    if c.family == "vlm":
        from adjcap.models.vlm_captioner import instruction

        what = "greedy" if c.decoder == "greedy" else f"{c.vlm.search} of {c.beam_width}"
        return f"Captioner: {c.vlm.model} (vlm family, {what}, at most {c.vlm.max_new_tokens} new tokens, " \
            f"prompt '{instruction(c.vlm.prompt)}')"
    if c.family == "candidates":
        judge = f"LM judge {c.candidates.lm} (text only) for the candidates without log-probs" \
            if judge_needed(c) else "their log-probs from the file"
        return f"Captioner: candidates from {c.candidates.file}; {judge}"
    return ""
