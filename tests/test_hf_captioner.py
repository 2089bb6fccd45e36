"""The ``hf`` captioner family (adjcap.models.hf_captioner) on tiny random models of each class it
loads, built and saved here: its N-best beam, batched over images, equals the model's own
``generate(num_beams=N, num_return_sequences=N)`` on each image alone (texts and order), and each
candidate's teacher-forced mean log-prob equals generate's beam score (within 1e-4); with a prompt too.
A missing model is one line naming the setting. The edges: a decoder start id of 0, a pad emitted at
max_len, a checkpoint whose saved generation config would change the beams (overridden, said once)."""

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


# ---- the family's edges (issue 47) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One tiny GIT (no stop-token lift: beams run to max_len) and one ViT+GPT-2, built once."""
    root = tmp_path_factory.mktemp("hf-edges")
    return {k: build_tiny_hf_captioner(root / k, k, CORPUS, seed=3) for k in ("git", "vision-encoder-decoder")}


def _resaved(src, dst, edit):
    """The model of ``src`` with ``edit(model, tokenizer)`` applied, saved as ``dst`` (tokenizer and
    image processor alongside)."""
    import shutil

    import transformers

    from adjcap.models.hf_captioner import CLASSES, model_kind

    shutil.copytree(src, dst)
    config = transformers.AutoConfig.from_pretrained(dst)
    net = getattr(transformers, CLASSES[model_kind(config)]).from_pretrained(dst)
    edit(net, transformers.AutoTokenizer.from_pretrained(dst))
    net.save_pretrained(dst)
    return dst


def _same_as_generate(cap, images, reference=None):
    """Each image's beam equals ``reference``'s own generate (default: the model's): texts, order, scores."""
    reference = reference or cap
    beams = cap.beams(images, beam_width=N, max_len=MAX_LEN)
    for image, beam in zip(images, beams):
        texts, scores = _own_generate(reference, image, None)
        assert [c.text for c in beam] == texts
        for c, s in zip(beam, scores):
            assert abs(c.lm_logprob_mean - s) < 1e-4, (c, s)
            assert math.isclose(c.lm_logprob_sum, c.lm_logprob_mean * c.n_tokens, rel_tol=1e-9)
    return beams


@pytest.mark.slow  # ~10 s each on 2 cores: make test, not test-fast
def test_a_decoder_start_token_id_of_0_is_a_start_id(built, images, tmp_path):
    """RoBERTa / TrOCR-style: the decoder starts with <s> = 0 and its config has no decoder_start_token_id."""
    def start_at_0(net, tok):
        if hasattr(net.config.decoder, "decoder_start_token_id"):
            delattr(net.config.decoder, "decoder_start_token_id")
        net.config.decoder_start_token_id = 0
        net.generation_config.decoder_start_token_id = 0

    d = _resaved(built["vision-encoder-decoder"], tmp_path / "ved0", start_at_0)
    cap = load_hf_captioner(str(d), device="cpu")
    assert not hasattr(cap.model.config.decoder, "decoder_start_token_id")
    assert cap.start_ids(None) == [0] and cap.start_ids("a red")[0] == 0
    _same_as_generate(cap, images)


@pytest.mark.slow  # ~10 s each on 2 cores: make test, not test-fast
def test_a_pad_emitted_at_the_length_limit_counts_as_in_generate(built, images, tmp_path):
    """A beam that emits the pad token as a real token at max_len: generate scores it over every token,
    so does adjcap (stripping it made the mean disagree with the beam score and refused the image)."""
    def lift_pad(net, tok):
        with torch.no_grad():
            net.get_output_embeddings().bias[tok.pad_token_id] += 5.0

    d = _resaved(built["git"], tmp_path / "git-pad", lift_pad)
    cap = load_hf_captioner(str(d), device="cpu")
    pad = cap.pad_id()
    beams = _same_as_generate(cap, images)
    ending = [c for b in beams for c in b if not c.finished and c.token_ids[-1] == pad]
    assert ending, "no beam ended on the pad token: the case is untested"
    assert all(c.n_tokens == MAX_LEN and len(c.token_ids) == MAX_LEN for c in ending)


@pytest.mark.slow  # ~10 s each on 2 cores: make test, not test-fast
def test_a_saved_generation_config_is_overridden_in_one_line(built, images, tmp_path, caplog):
    """The checkpoint's own length penalty, early stopping, n-gram block and suppressed tokens would
    change the beams or their scores: overridden, one log line naming each; the beams are those of the
    same model with a default generation config."""
    def opinionated(net, tok):
        g = net.generation_config
        g.length_penalty, g.early_stopping, g.no_repeat_ngram_size = 0.5, True, 2
        g.suppress_tokens = [tok.convert_tokens_to_ids("red")]
        g.num_beams, g.max_length = 3, 20

    d = _resaved(built["git"], tmp_path / "git-opinions", opinionated)
    with caplog.at_level("WARNING", logger="adjcap.models.hf_captioner"):
        cap = load_hf_captioner(str(d), device="cpu")
    lines = [r.getMessage() for r in caplog.records if r.name == "adjcap.models.hf_captioner"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    for said in ("length_penalty=0.5 -> 1.0", "early_stopping=True -> False", "no_repeat_ngram_size=2 -> 0",
                 "suppress_tokens=["):
        assert said in lines[0], lines[0]
    plain = load_hf_captioner(str(built["git"]), device="cpu")
    _same_as_generate(cap, images, reference=plain)
    caplog.clear()
    with caplog.at_level("WARNING", logger="adjcap.models.hf_captioner"):
        load_hf_captioner(str(built["git"]), device="cpu")
    assert not [r for r in caplog.records if r.name == "adjcap.models.hf_captioner"]  # nothing to say
