"""A transformers image-to-text model as a captioner (``captioner.family = hf``): its N-best beam, each
candidate with its log-prob sum, mean and token count under the model, from a teacher-forced forward
of the same model over the beam's tokens, checked against the beam search's own scores.

Three classes (their model type in ``config.json``): ``BlipForConditionalGeneration`` ("blip"),
``GitForCausalLM`` ("git") and ``VisionEncoderDecoderModel`` ("vision-encoder-decoder"). The beam is
``generate(num_beams=N, num_return_sequences=N, length_penalty=1)`` with the model's logits processors
off (:data:`NEUTRAL`: no repetition penalty, no forced or suppressed tokens, no forced lengths), so a
beam's score is its mean log-prob, as IFCap's, and the N candidates come in the model's own order
(``beam_rank`` 0 = highest mean). A checkpoint whose saved generation config sets any of these
otherwise (BLIP's hub checkpoints save ``num_beams``/``max_length``; others a length penalty, early
stopping, ``no_repeat_ngram_size``) has them overridden, said in one log line at load; the beam's width
and length are ``captioner.beam_width`` / ``captioner.max_len``. Log-probs count the generated tokens
and the stop token, not the start nor the prompt; a beam that reaches ``max_len`` counts every token it
emitted, a pad token too (as ``generate``'s score does).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from adjcap.models.decoding import Candidate
from adjcap.models.precision import pick_device, pick_dtype
from adjcap.models.sources import ModelUnavailableError, hub_or_dir

log = logging.getLogger(__name__)

# model type (config.json) -> transformers class name
CLASSES = {"blip": "BlipForConditionalGeneration", "git": "GitForCausalLM",
           "vision-encoder-decoder": "VisionEncoderDecoderModel"}
# the beam search's mean log-prob against the teacher-forced one: more apart is a model whose generate
# scores something else (a logits processor this module does not know): refused, not reported wrong
SCORE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 3e-2}  # relative, by precision
# generation settings that change which beams come out or how they are scored, at the values that make
# a beam's score its mean log-prob under the model: given to every generate call, whatever the checkpoint saved
NEUTRAL: dict[str, Any] = dict(
    length_penalty=1.0, early_stopping=False, do_sample=False, repetition_penalty=1.0, no_repeat_ngram_size=0,
    encoder_repetition_penalty=1.0, encoder_no_repeat_ngram_size=0, min_length=0, min_new_tokens=None,
    bad_words_ids=None, force_words_ids=None, forced_bos_token_id=None, forced_eos_token_id=None,
    suppress_tokens=None, begin_suppress_tokens=None, sequence_bias=None, num_beam_groups=1, diversity_penalty=0.0,
    exponential_decay_length_penalty=None, renormalize_logits=False)


class BeamScoreMismatch(RuntimeError):
    """The teacher-forced log-probs do not reproduce the beam search's scores."""


@dataclass
class HfCaptioner:
    model: Any
    kind: str  # a key of CLASSES
    tokenizer: Any
    image_processor: Any
    model_id: str
    device: torch.device
    dtype: torch.dtype

    # ---- the decoder's start -----------------------------------------------------------------
    def start_ids(self, prompt: str | None) -> list[int]:
        """The tokens every sequence starts with (the start token, then the prompt's), as generate sees them."""
        words = self.tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
        if self.kind == "blip":
            return [self.model.config.text_config.bos_token_id, *words]
        if self.kind == "git":
            return [self.model.config.bos_token_id, *words]
        return [decoder_start_id(self.model), *words]

    def eos_ids(self) -> set[int]:
        if self.kind == "blip":
            return {self.model.config.text_config.sep_token_id}
        eos = self.model.generation_config.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def pad_id(self) -> int | None:
        if self.kind == "blip":
            return self.model.config.text_config.pad_token_id
        return self.model.generation_config.pad_token_id

    def pixels(self, images: Sequence[Any]) -> torch.Tensor:
        px = self.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        return px.to(self.device, self.dtype)

    # ---- the beam and its teacher-forced scores -------------------------------------------------
    def generate(self, pixel_values: torch.Tensor, prompt: str | None, beam_width: int, max_len: int):
        """``generate``'s sequences and scores (B*N rows) for these images; the sequences start with
        :meth:`start_ids`."""
        start = self.start_ids(prompt)
        b = pixel_values.shape[0]
        ids = torch.tensor([start] * b, dtype=torch.long, device=self.device)
        kw: dict[str, Any] = dict(num_beams=beam_width, num_return_sequences=beam_width, max_new_tokens=max_len,
                                  output_scores=True, return_dict_in_generate=True,
                                  **{k: v for k, v in NEUTRAL.items() if hasattr(self.model.generation_config, k)})
        if self.kind == "blip":  # its generate puts its start token first and drops the last token
            ids = torch.cat([ids, ids[:, :1]], dim=1)
            out = self.model.generate(pixel_values=pixel_values, input_ids=ids, **kw)
        elif self.kind == "git":
            out = self.model.generate(pixel_values=pixel_values, input_ids=ids, **kw)
        else:
            out = self.model.generate(pixel_values=pixel_values, decoder_input_ids=ids, **kw)
        if beam_width == 1:  # greedy: no beam score; the teacher-forced mean stands in its place
            return out.sequences, None
        return out.sequences, out.sequences_scores

    def token_logprobs(self, pixel_values: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: log p(sequences[:, t+1] | image, sequences[:, :t+1]) for every t ([R, T-1]);
        ``pixel_values`` has one row per sequence."""
        if self.kind == "vision-encoder-decoder":
            logits = self.model(pixel_values=pixel_values, decoder_input_ids=sequences).logits
        else:
            logits = self.model(pixel_values=pixel_values, input_ids=sequences).logits
        t = sequences.shape[1]
        logits = logits[:, -t:, :].float()  # GIT puts the image tokens first
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        return logp.gather(-1, sequences[:, 1:, None]).squeeze(-1)

    def beams(self, images: Sequence[Any], *, beam_width: int, max_len: int, prompt: str | None = None,
              decoder: str = "beam") -> list[list[Candidate]]:
        """Each image's N candidates in beam order (greedy: one)."""
        n = 1 if decoder == "greedy" else beam_width
        with torch.inference_mode():
            px = self.pixels(images)
            seqs, scores = self.generate(px, prompt, n, max_len)
            rows = px.repeat_interleave(n, dim=0)
            logp = self.token_logprobs(rows, seqs)
        p = len(self.start_ids(prompt))
        eos = self.eos_ids()
        out: list[list[Candidate]] = []
        for i in range(len(images)):
            beam = []
            for r in range(n):
                k = i * n + r
                gen = seqs[k, p:].tolist()
                length = next((j + 1 for j, tok in enumerate(gen) if tok in eos), None)
                finished = length is not None
                if length is None:  # ran to max_len: every token it emitted counts, a pad too (as in generate)
                    length = len(gen)
                total = float(logp[k, p - 1 : p - 1 + length].double().sum())
                mean = total / max(length, 1)
                tol = SCORE_TOLERANCE.get(self.dtype, 3e-2) * max(1.0, abs(mean))
                if scores is not None and abs(float(scores[k]) - mean) > tol:
                    raise BeamScoreMismatch(
                        f"{self.model_id}: the teacher-forced mean log-prob {mean:.5f} of beam {r} differs from "
                        f"the beam search's score {float(scores[k]):.5f}; its generation config scores beams "
                        "with something else (a logits processor)")
                words = gen[: length - 1] if finished else gen[:length]
                text = self.tokenizer.decode(words, skip_special_tokens=True).strip()
                beam.append(Candidate(text=text, lm_logprob_sum=total, lm_logprob_mean=mean, n_tokens=length,
                                      beam_rank=r, finished=finished, token_ids=tuple(words)))
            out.append(beam)
        return out


def decoder_start_id(model: Any) -> int:
    """A VisionEncoderDecoder's decoder start token: the generation config's, else the model config's,
    else its decoder's; id 0 is a start id like any other (RoBERTa / TrOCR decoders start with ``<s>`` = 0)."""
    for where in (model.generation_config, model.config, model.config.decoder):
        v = getattr(where, "decoder_start_token_id", None)
        if v is not None:
            return int(v)
    raise ValueError(f"{getattr(model.config, 'name_or_path', 'captioner.hf.model')}: no decoder_start_token_id in "
                     "its generation config, config or decoder config; set one in its generation_config.json")


def overridden_settings(generation_config: Any) -> dict[str, tuple[Any, Any]]:
    """The checkpoint's saved generation settings that adjcap's beam overrides: name -> (saved, used)."""
    default = type(generation_config)()
    out = {}
    for k, v in NEUTRAL.items():
        saved = getattr(generation_config, k, None)
        if saved != getattr(default, k, None) and saved != v:
            out[k] = (saved, v)
    return out


def describe_overrides(model_id: str, generation_config: Any) -> str | None:
    """One line saying which of the checkpoint's generation settings are overridden, or None."""
    over = overridden_settings(generation_config)
    if not over:
        return None
    shown = ", ".join(f"{k}={a!r} -> {b!r}" for k, (a, b) in over.items())
    return (f"captioner {model_id}: its saved generation config is overridden ({shown}) so that each beam's score "
            "is its mean log-prob; beams differ from the checkpoint's own generate() defaults (width and length: "
            "captioner.beam_width / captioner.max_len)")


def model_kind(config: Any) -> str:
    kind = getattr(config, "model_type", None)
    if kind not in CLASSES:
        raise ValueError(f"captioner.hf.model: model type '{kind}' is not one of {', '.join(CLASSES)} "
                         f"({', '.join(CLASSES.values())})")
    return kind


def load_hf_captioner(spec: str | os.PathLike, *, device: str | torch.device = "auto", precision: str = "fp32",
                      cache_dir: str | None = None) -> HfCaptioner:
    """A BLIP / GIT / VisionEncoderDecoder captioner from a hub id or a ``save_pretrained`` directory
    (with its tokenizer and image processor)."""
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

    src = hub_or_dir(spec, what="captioner", config_key="captioner.hf.model", cache_dir=cache_dir)
    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)
    kw = dict(cache_dir=cache_dir, local_files_only=src.local_only)
    try:
        config = AutoConfig.from_pretrained(src.source, **kw)
        kind = model_kind(config)
        net = getattr(transformers, CLASSES[kind]).from_pretrained(src.source, dtype=dtype, **kw)
        tok = AutoTokenizer.from_pretrained(src.source, **kw)
        proc = AutoImageProcessor.from_pretrained(src.source, **kw)
    except OSError as e:
        if src.is_dir:
            raise FileNotFoundError(f"{src.source}: incomplete captioner directory ({str(e).splitlines()[0]})") from e
        raise ModelUnavailableError(
            f"captioner '{src.source}' could not be loaded ({str(e).splitlines()[0]}): download it with "
            f"`huggingface-cli download {src.source} --local-dir DIR` and set captioner.hf.model=DIR") from e
    net.to(dev).eval()
    note = describe_overrides(src.model_id, net.generation_config)
    if note:
        log.warning(note)
    return HfCaptioner(net, kind, tok, proc, src.model_id, dev, dtype)
