"""The ``hf`` captioner family (adjcap.models.hf_captioner) on tiny random models of each class it
loads, built and saved here: its N-best beam, batched over images, equals the model's own
``generate(num_beams=N, num_return_sequences=N)`` on each image alone (texts and order), and each
candidate's teacher-forced mean log-prob equals generate's beam score (within 1e-4); with a prompt too.
A missing model is one line naming the setting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from adjcap.demo.tiny_hf_captioner import KINDS, build_tiny_hf_captioner
from adjcap.models.hf_captioner import load_hf_captioner
from adjcap.models.sources import ModelUnavailableError

N, MAX_LEN = 4, 8
CORPUS = ["a red ball on the grass.", "two blue kites in the sky.", "a white clock on a table.",
          "a yellow star next to a green tree.", "three black cars on a street."]


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)) for i in range(3)]


def _own_generate(cap, image, prompt):
    """The model's own beam search on one image, the way its documentation calls it."""
    px = cap.pixels([image])
    start = torch.tensor([cap.start_ids(prompt)])
    kw = dict(num_beams=N, num_return_sequences=N, max_new_tokens=MAX_LEN, output_scores=True,
              return_dict_in_generate=True)
    if cap.kind == "blip":  # BLIP's processor output: [CLS] prompt [SEP]; its generate swaps in [DEC] and drops [SEP]
        ids = cap.tokenizer(prompt, return_tensors="pt").input_ids if prompt else None
        out = cap.model.generate(pixel_values=px, input_ids=ids, **kw)
    elif cap.kind == "git":
        out = cap.model.generate(pixel_values=px, input_ids=start, **kw)
    else:
        out = cap.model.generate(pixel_values=px, decoder_input_ids=start, **kw)
    p = start.shape[1]
    texts = [cap.tokenizer.decode(s[p:], skip_special_tokens=True).strip() for s in out.sequences]
    return texts, out.sequences_scores.tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_beams_equal_the_models_own_generate(kind, images, tmp_path):
    d = build_tiny_hf_captioner(tmp_path / kind, kind, CORPUS, seed=3, eos_bias=4.0)
    cap = load_hf_captioner(str(d), device="cpu")
    assert type(cap.model).__name__ == {"blip": "BlipForConditionalGeneration", "git": "GitForCausalLM",
                                        "vision-encoder-decoder": "VisionEncoderDecoderModel"}[kind]
    finished = 0
    for prompt in (None, "a red"):
        beams = cap.beams(images, beam_width=N, max_len=MAX_LEN, prompt=prompt)  # one batch of 3 images
        assert [len(b) for b in beams] == [N] * len(images)
        for image, beam in zip(images, beams):
            texts, scores = _own_generate(cap, image, prompt)
            assert [c.text for c in beam] == texts
            assert [c.beam_rank for c in beam] == list(range(N))
            for c, s in zip(beam, scores):
                assert abs(c.lm_logprob_mean - s) < 1e-4, (kind, prompt, c, s)
                assert math.isclose(c.lm_logprob_sum, c.lm_logprob_mean * c.n_tokens, rel_tol=1e-9)
                assert 1 <= c.n_tokens <= MAX_LEN and c.lm_logprob_sum < 0
                finished += c.finished
    if kind != "vision-encoder-decoder":  # its GPT-2 head has no bias to lift the stop token with
        assert finished, "no beam reached the stop token: the stop token's count is untested"


def test_a_missing_model_is_one_line(tmp_path):
    with pytest.raises(ModelUnavailableError) as e:
        load_hf_captioner(str(tmp_path / "nowhere"), device="cpu")
    assert "captioner.hf.model" in str(e.value) and "\n" not in str(e.value)
