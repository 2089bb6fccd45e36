"""The ``vlm`` captioner family (adjcap.models.vlm_captioner) on tiny random vision-language models of
three classes (LLaVA, Qwen2-VL, Idefics3 / SmolVLM), built here and saved like a hub snapshot (config,
weights, processor with tokenizer and chat template), loaded through the family's loader: its candidates
equal the model's own ``generate`` called the way its documentation calls it (texts and order), and each
candidate's teacher-forced log-probs equal generate's scores within 1e-4 (the beam score; for greedy and
seeded samples, ``compute_transition_scores`` of its raw logits). Both call generate with the image placeholders
suppressed (a random model emits them; the family never generates them). Hostile settings are one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from adjcap.demo.tiny_vlm import CLASSES, KINDS, build_tiny_vlm
from adjcap.models.vlm_captioner import PROMPTS, VlmSettingError, check_image_text_to_text, load_vlm

# three tiny models built and decoded (~25 s on 2 cores): make test, not the everyday make test-fast
pytestmark = pytest.mark.slow

N, MAX_NEW = 3, 6
# the stop token's lift per class: each class's candidates both stop and run to the limit
EOS_BIAS = {"llava": 10.0, "qwen2_vl": 2.0, "idefics3": 5.0}
CORPUS = ["a red ball on the grass.", "two blue kites in the sky.", "a white clock on a table.",
          "a yellow star next to a green tree.", "three black cars on a street."]


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)) for i in range(2)]


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    d = build_tiny_vlm(tmp_path_factory.mktemp(request.param), request.param, CORPUS, seed=3,
                       eos_bias=EOS_BIAS[request.param])
    return request.param, load_vlm(str(d), device="cpu")


def _own(cap, image, prompt, **kw):
    """The model's own generate on one image, as its model card calls it."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = cap.processor.apply_chat_template(msgs, add_generation_prompt=True)
    enc = cap.processor(text=[text], images=[image], return_tensors="pt")
    out = cap.model.generate(**enc, max_new_tokens=MAX_NEW, output_scores=True, output_logits=True,
                             return_dict_in_generate=True,                             suppress_tokens=cap.placeholder_ids(), **kw)
    p = enc["input_ids"].shape[1]
    texts = [cap.processor.tokenizer.decode(s[p:], skip_special_tokens=True).strip() for s in out.sequences]
    return out, texts


def _check(c, finished_seen):
    assert math.isclose(c.lm_logprob_sum, c.lm_logprob_mean * c.n_tokens, rel_tol=1e-9)
    assert 1 <= c.n_tokens <= MAX_NEW and c.lm_logprob_sum < 0
    finished_seen.append(c.finished)


def test_beams_equal_generate(tiny, images):
    kind, cap = tiny
    assert type(cap.model).__name__ == CLASSES[kind]
    seen: list[bool] = []
    for prompt in ("detail", "short"):
        beams = cap.beams(images, prompt=prompt, n=N, max_new_tokens=MAX_NEW, search="beam")
        for image, beam in zip(images, beams):
            out, texts = _own(cap, image, PROMPTS[prompt], num_beams=N, num_return_sequences=N, do_sample=False)
            assert [c.text for c in beam] == texts
            assert [c.beam_rank for c in beam] == list(range(N))
            for c, s in zip(beam, out.sequences_scores.tolist()):
                assert abs(c.lm_logprob_mean - s) < 1e-4, (kind, prompt, c, s)
                _check(c, seen)
    assert any(seen) and not all(seen), "the stop token and the limit must both be exercised"


def test_greedy_and_seeded_samples_equal_generate(tiny, images):
    kind, cap = tiny
    image = images[0]
    (greedy,) = cap.candidates(image, prompt="detail", n=N, max_new_tokens=MAX_NEW, search="greedy")
    out, texts = _own(cap, image, PROMPTS["detail"], do_sample=False, num_beams=1)
    assert greedy.text == texts[0]
    own = cap.model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)[0]
    assert abs(greedy.lm_logprob_sum - float(own[: greedy.n_tokens].sum())) < 1e-4

    samples = cap.candidates(image, prompt="detail", n=N, max_new_tokens=MAX_NEW, search="sample", seed=11)
    torch.manual_seed(11)
    out, texts = _own(cap, image, PROMPTS["detail"], do_sample=True, num_return_sequences=N, top_k=0, top_p=1.0,
                      temperature=1.0)
    assert [c.text for c in samples] == texts
    own = cap.model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)
    for c, row in zip(samples, own):
        assert abs(c.lm_logprob_sum - float(row[: c.n_tokens].sum())) < 1e-4, (kind, c)
    again = cap.candidates(image, prompt="detail", n=N, max_new_tokens=MAX_NEW, search="sample", seed=11)
    assert [c.text for c in again] == [c.text for c in samples]
    other = cap.candidates(image, prompt="detail", n=N, max_new_tokens=MAX_NEW, search="sample", seed=12)
    assert [c.token_ids for c in other] != [c.token_ids for c in samples]


def test_hostile_settings_are_one_line(tiny):
    kind, cap = tiny
    cap.check_prompt("detail")  # the chat template puts the image in
    cap.chat = False
    try:
        with pytest.raises(VlmSettingError) as e:
            cap.check_prompt("Describe the picture.")  # a raw prompt without the image token
        assert cap.image_token() in str(e.value) and "captioner.vlm.prompt" in str(e.value)
        assert "\n" not in str(e.value)
    finally:
        cap.chat = True
    from transformers import GPT2Config

    with pytest.raises(VlmSettingError) as e:
        check_image_text_to_text(GPT2Config())
    assert "gpt2" in str(e.value) and "\n" not in str(e.value)


def test_the_caption_stage_runs_the_family_and_samples_do_not_depend_on_the_batch(tiny, images, tmp_path):
    """Stage 3 through the family record (adjcap.engine.captioners): each image's candidates as rows, the
    instruction as its prompt, and sampled candidates equal whether an image is captioned alone or with
    another (its seed comes from its id)."""
    from adjcap.engine import captioners
    from adjcap.config import load_config
    from adjcap.engine.image_state import ImageState

    kind, cap = tiny
    if kind != "qwen2_vl":  # one class is enough for the wiring
        return
    cfg = load_config("headline", ["captioner.family=vlm", "captioner.vlm.search=sample", "captioner.beam_width=3",
                                   f"captioner.vlm.max_new_tokens={MAX_NEW}", "captioner.vlm.prompt=short"])
    fam = captioners.family("vlm")
    both = [ImageState(image_id=f"img{i}", benchmark="demo", split="test", image=im) for i, im in enumerate(images)]
    alone = [ImageState(image_id="img1", benchmark="demo", split="test", image=images[1])]
    fam.run(both, cap, cfg)
    fam.run(alone, cap, cfg)
    assert all(s.ok and len(s.candidates) == 3 and s.prompt == PROMPTS["short"] for s in both)
    assert [c["text"] for c in both[1].candidates] == [c["text"] for c in alone[0].candidates]
    assert [c["lm_logprob_sum"] for c in both[1].candidates] == [c["lm_logprob_sum"] for c in alone[0].candidates]
    assert {"captioner.vlm.search", "captioner.beam_width"} & set(captioners.unread(cfg)) == set()
    assert "captioner.hf" in captioners.unread(cfg) and "captioner.vlm" not in captioners.unread(cfg)
