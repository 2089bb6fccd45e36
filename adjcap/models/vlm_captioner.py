"""A vision-language model as a captioner (``captioner.family = vlm``): any transformers
``AutoModelForImageTextToText`` checkpoint (LLaVA, Qwen2-VL / Qwen2.5-VL, Idefics3 / SmolVLM, ...) with its
processor and chat template, asked one instruction per image; its N candidates come from beam search
(``num_beams = num_return_sequences = N``), greedy decoding (one) or seeded sampling (N samples), each
with its log-prob sum, mean and token count from a teacher-forced forward of the same model over the
prompt and the candidate, checked against ``generate``'s own scores (the beam score; the step logits of
greedy and sampled candidates).

``generate`` runs under a generation config of the checkpoint's stop, pad and start tokens only: the
checkpoint's own sampling settings (temperature, top-k / top-p, repetition penalty, forced lengths) are
left out, so a beam's score is its mean log-prob (length penalty 1) and samples come from the model's
distribution. Each image is decoded alone (its beams or samples one batch), so a candidate does not depend
on which images share a Ray batch, and a sampled image's seed is ``seed`` + a hash of its id. Log-probs
count the generated tokens and the stop token, not the prompt.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from adjcap.models.decoding import Candidate
from adjcap.models.hf_captioner import SCORE_TOLERANCE, BeamScoreMismatch
from adjcap.models.precision import pick_device, pick_dtype
from adjcap.models.sources import ModelUnavailableError, hub_or_dir

# the protocol's two instructions (OPERA / VCD: "describe in detail"; LLaVA-1.5's COCO caption prompt)
PROMPTS = {"detail": "Please describe this image in detail.",
           "short": "Provide a one-sentence caption for the provided image."}
SEARCHES = ("beam", "greedy", "sample")


class VlmSettingError(ValueError):
    """A vlm setting the model cannot run with (refused before Ray starts)."""


def instruction(prompt: str) -> str:
    """A prompt setting as the instruction asked: a name of :data:`PROMPTS` or the text itself."""
    return PROMPTS.get(prompt, prompt)


def image_seed(seed: int, image_id: str) -> int:
    """The sampling seed of one image: stable across runs, batches and machines."""
    return (seed + int.from_bytes(hashlib.sha256(str(image_id).encode()).digest()[:6], "big")) % (2 ** 63)


@dataclass
class VlmCaptioner:
    model: Any
    processor: Any
    model_id: str
    device: torch.device
    dtype: torch.dtype
    chat: bool = True  # the prompt goes through the processor's chat template

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def image_token(self) -> str | None:
        return getattr(self.processor, "image_token", None)

    def prompt_text(self, prompt: str) -> str:
        """The text the processor tokenizes: the instruction in the chat template's user turn after the
        image, with the assistant's turn opened (``chat``), or the prompt as given (it must then hold the
        processor's image token)."""
        if not self.chat:
            return prompt
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction(prompt)}]}]
        return self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def check_prompt(self, prompt: str, key: str = "captioner.vlm.prompt") -> None:
        """Refuse a prompt whose text holds no image placeholder of the processor (one line)."""
        if not self.chat and prompt in PROMPTS:
            raise VlmSettingError(f"{key} = '{prompt}' names a protocol instruction but captioner.vlm.chat_template "
                                  "is false: write the whole prompt with its image token, or set chat_template=true")
        token = self.image_token()
        if token and token not in self.prompt_text(prompt):
            where = "the chat template renders no image" if self.chat else "the prompt"
            raise VlmSettingError(f"{key}: {where} holds no '{token}', the image placeholder {self.model_id}'s "
                                  f"processor needs; put '{token}' in the prompt or use its chat template")

    def inputs(self, image: Any, prompt: str) -> dict[str, torch.Tensor]:
        enc = self.processor(text=[self.prompt_text(prompt)], images=[image], return_tensors="pt")
        return {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in enc.items() if isinstance(v, torch.Tensor)}

    def generation_config(self, **kw: Any):
        from transformers import GenerationConfig

        own = self.model.generation_config
        pad = own.pad_token_id if own.pad_token_id is not None else self.tokenizer.pad_token_id
        return GenerationConfig(bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id, pad_token_id=pad,
                                suppress_tokens=self.placeholder_ids() or None, output_scores=True,
                                output_logits=True, return_dict_in_generate=True, **kw)

    def placeholder_ids(self) -> list[int]:
        """The processor's image / video placeholder tokens: never generated (a candidate holding one could
        not be fed back to the model, which counts placeholders against image features); a beam's score and
        the teacher-forced log-probs are unchanged by it (beam search sums log-probs taken before it)."""
        toks = [getattr(self.processor, a, None) for a in ("image_token", "video_token")]
        ids = [self.tokenizer.convert_tokens_to_ids(t) for t in toks if isinstance(t, str)]
        return sorted({i for i in ids if i is not None and i != self.tokenizer.unk_token_id})

    def eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    # ---- one image's candidates ------------------------------------------------------------------
    def generate(self, enc: dict, search: str, n: int, max_new_tokens: int, seed: int | None = None):
        """``generate``'s output for one image's inputs: N beams, one greedy sequence or N samples."""
        if search == "beam":
            gc = self.generation_config(num_beams=n, num_return_sequences=n, do_sample=False, length_penalty=1.0,
                                        early_stopping=False, max_new_tokens=max_new_tokens)
        elif search == "greedy":
            gc = self.generation_config(num_beams=1, do_sample=False, max_new_tokens=max_new_tokens)
        else:
            gc = self.generation_config(num_beams=1, do_sample=True, num_return_sequences=n, temperature=1.0,
                                        top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if seed is not None:
                torch.manual_seed(seed)
            return self.model.generate(**enc, generation_config=gc)

    def token_logprobs(self, enc: dict, sequences: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: log p(token t | image, prompt, tokens < t) of every generated position ([R, G]);
        ``enc`` is one image's inputs, repeated here once per sequence."""
        r, p = sequences.shape[0], enc["input_ids"].shape[1]
        fed: dict[str, torch.Tensor] = {}
        for k, v in enc.items():
            if k == "input_ids":
                continue
            v = v.repeat(r, *[1] * (v.dim() - 1))
            if v.dim() == 2 and v.shape[1] == p and k != "attention_mask":  # per-token side inputs (token types)
                v = torch.cat([v, v.new_zeros(r, sequences.shape[1] - p)], dim=1)
            fed[k] = v
        # every generated position attends (what follows a stop token is never read: the model is causal)
        fed["attention_mask"] = torch.cat([fed.get("attention_mask", torch.ones_like(sequences[:, :p])),
                                           torch.ones_like(sequences[:, p:])], dim=1)
        g = sequences.shape[1] - p  # logits of the generated positions only (not the prompt's hundreds)
        logits = self.model(input_ids=sequences, logits_to_keep=g + 1, **fed).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, p:, None]).squeeze(-1)

    def candidates(self, image: Any, *, prompt: str, n: int, max_new_tokens: int, search: str = "beam",
                   seed: int | None = None) -> list[Candidate]:
        """One image's candidates in the search's order (beams best first; samples as drawn)."""
        if search not in SEARCHES:
            raise VlmSettingError(f"captioner.vlm.search = '{search}' is not one of {', '.join(SEARCHES)}")
        n = 1 if search == "greedy" else n
        eos = self.eos_ids()
        with torch.inference_mode():
            enc = self.inputs(image, prompt)
            out = self.generate(enc, search, n, max_new_tokens, seed if search == "sample" else None)
            seqs = out.sequences
            logp = self.token_logprobs(enc, seqs)
            steps = None
            if search != "beam":  # generate's own log-probs of its tokens, step by step
                steps = torch.stack([torch.log_softmax(x.float(), -1) for x in out.logits], dim=1)
                steps = steps.gather(-1, seqs[:, enc["input_ids"].shape[1]:, None]).squeeze(-1)
        p = enc["input_ids"].shape[1]
        beam: list[Candidate] = []
        for r in range(seqs.shape[0]):
            gen = seqs[r, p:].tolist()
            length = next((j + 1 for j, tok in enumerate(gen) if tok in eos), None)
            finished = length is not None
            if length is None:
                length = len(gen)
            total = float(logp[r, :length].double().sum())
            mean = total / max(length, 1)
            own = float(out.sequences_scores[r]) if steps is None else float(steps[r, :length].double().sum()) / length
            tol = SCORE_TOLERANCE.get(self.dtype, 3e-2) * max(1.0, abs(mean))
            if abs(own - mean) > tol:
                raise BeamScoreMismatch(
                    f"{self.model_id}: the teacher-forced mean log-prob {mean:.5f} of candidate {r} differs from "
                    f"generate's {own:.5f}; the model scores its {search} with something this module does not know")
            words = gen[: length - 1] if finished else gen[:length]
            text = self.tokenizer.decode(words, skip_special_tokens=True).strip()
            beam.append(Candidate(text=text, lm_logprob_sum=total, lm_logprob_mean=mean, n_tokens=length,
                                  beam_rank=r, finished=finished, token_ids=tuple(words)))
        return beam

    def beams(self, images: Sequence[Any], *, prompt: str, n: int, max_new_tokens: int, search: str = "beam",
              seeds: Sequence[int] | None = None) -> list[list[Candidate]]:
        """Each image's candidates (``seeds``: one per image, for sampling)."""
        return [self.candidates(im, prompt=prompt, n=n, max_new_tokens=max_new_tokens, search=search,
                                seed=None if seeds is None else seeds[i]) for i, im in enumerate(images)]


def check_image_text_to_text(config: Any, key: str = "captioner.vlm.model") -> None:
    """Refuse a checkpoint whose class is not an image-text-to-text model (one line)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    kind = getattr(config, "model_type", None)
    if kind not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise VlmSettingError(f"{key}: model type '{kind}' is not an image-text-to-text model "
                              "(AutoModelForImageTextToText); give a vision-language checkpoint such as "
                              "llava-hf/llava-1.5-7b-hf, or captioner.family=hf for a plain captioner")


def _source(spec: str | os.PathLike, cache_dir: str | None):
    return hub_or_dir(spec, what="vision-language captioner", config_key="captioner.vlm.model", cache_dir=cache_dir)


def load_vlm_processor(spec: str | os.PathLike, cache_dir: str | None = None):
    """The checkpoint's config and processor only (cheap: the preflight's checks), or None where the
    checkpoint is a hub id not yet downloaded."""
    from transformers import AutoConfig, AutoProcessor

    src = _source(spec, cache_dir)
    kw = dict(cache_dir=cache_dir, local_files_only=src.local_only)
    config = AutoConfig.from_pretrained(src.source, **kw)
    check_image_text_to_text(config)
    return config, AutoProcessor.from_pretrained(src.source, **kw), src


def load_vlm(spec: str | os.PathLike, *, device: str | torch.device = "auto", precision: str = "auto",
             chat: bool = True, cache_dir: str | None = None) -> VlmCaptioner:
    """An image-text-to-text model with its processor from a hub id or a ``save_pretrained`` directory."""
    from transformers import AutoModelForImageTextToText

    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)
    try:
        config, proc, src = load_vlm_processor(spec, cache_dir)
        net = AutoModelForImageTextToText.from_pretrained(src.source, dtype=dtype, cache_dir=cache_dir,
                                                          local_files_only=src.local_only)
    except OSError as e:
        if os.path.isdir(os.path.expanduser(str(spec))):
            raise FileNotFoundError(f"{spec}: incomplete vision-language checkpoint ({str(e).splitlines()[0]})") from e
        raise ModelUnavailableError(
            f"vision-language captioner '{spec}' could not be loaded ({str(e).splitlines()[0]}): download it with "
            f"`adjcap prepare --for {spec}` or `huggingface-cli download {spec} --local-dir DIR` and set "
            "captioner.vlm.model=DIR") from e
    net.to(dev).eval()
    return VlmCaptioner(net, proc, src.model_id, dev, dtype, chat)


def settings_problem(v: Any) -> str | None:
    """Why the ``captioner.vlm`` settings ``v`` cannot run (one line), checked on the checkpoint's config
    and processor alone (no weights loaded): not an image-text-to-text model, a prompt whose text holds
    no image placeholder of the processor; None when they can (or when the checkpoint is not here yet:
    the missing-needs check says that)."""
    try:
        config, proc, src = load_vlm_processor(v.model)
    except VlmSettingError as e:
        return str(e)
    except (OSError, ValueError):
        return None
    cap = VlmCaptioner(None, proc, src.model_id, torch.device("cpu"), torch.float32, v.chat_template)
    try:
        cap.check_prompt(v.prompt)
    except VlmSettingError as e:
        return str(e)
    return None
