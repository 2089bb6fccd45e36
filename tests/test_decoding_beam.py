"""Decoding on the tiny IFCap (loaded through the real loader): the fast batched KV-cached beam search
returns the reference (official, no-cache, one image at a time) beams; greedy likewise; the scores mean
what spec 5.4 says (checked against teacher-forced log-probs)."""

from __future__ import annotations

import math

import pytest
import torch

from adjcap.models.decoding import (
    Beam,
    Candidate,
    beams_to_candidates,
    beam_search_fast,
    beam_search_reference,
    clean_up_tokenization,
    greedy_fast,
    greedy_reference,
)
from tiny_decoder import CLIP_DIM, make_inputs, tiny_captioner

MAX_LEN = 14


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    yield from tiny_captioner(tmp_path_factory.mktemp("tiny-decode"))


@pytest.fixture(scope="module")
def prompts(cap):
    x, r, ents = make_inputs(30, seed=3)
    return cap.prompt_embeddings(cap.soft_prompt(x, r), ents)


def assert_same_beams(ref, fast):
    """Same beams (token sequences, finished flags, sums and means within 1e-4), in the same order
    by mean log-prob; two beams whose means tie to ~1e-6 may come out in either order."""
    assert len(ref) == len(fast)
    for a_list, b_list in zip(ref, fast):
        a_by = {tuple(a.tokens): a for a in a_list}
        b_by = {tuple(b.tokens): b for b in b_list}
        assert a_by.keys() == b_by.keys()
        for key, a in a_by.items():
            b = b_by[key]
            assert a.finished == b.finished
            assert abs(a.score_sum - b.score_sum) < 1e-4
            assert abs(a.score_mean - b.score_mean) < 1e-4
        for a, b in zip(a_list, b_list):
            assert abs(a.score_mean - b.score_mean) < 1e-5 or a.tokens == b.tokens


@pytest.mark.parametrize("width, n_images", [(1, 30), (5, 30), (20, 30)])
def test_fast_beam_search_returns_the_reference_beams(cap, prompts, width, n_images):
    ps = prompts[:n_images]
    assert len({p.shape[0] for p in ps}) > 2  # prompts of different lengths share the batch
    ref = [beam_search_reference(cap.gpt, p, beam_width=width, max_len=MAX_LEN, stop_ids=cap.stop_ids) for p in ps]
    fast = beam_search_fast(cap.gpt, ps, beam_width=width, max_len=MAX_LEN, stop_ids=cap.stop_ids, batch_size=8)
    assert_same_beams(ref, fast)
    beams = [b for bs in ref for b in bs]
    assert all(len(bs) == width for bs in ref)
    # the case mix the comparison must cover: early stops and beams that ran to max_len
    assert any(b.finished and b.length < MAX_LEN for b in beams)
    if width > 1:
        assert any(not b.finished and b.length == MAX_LEN for b in beams)
        assert len({b.length for b in beams}) > 3
    if width == 5:
        assert any(all(b.finished for b in bs) and max(b.length for b in bs) < MAX_LEN for bs in ref)
    for bs in ref:
        means = [b.score_mean for b in bs]
        assert means == sorted(means, reverse=True)
        for b in bs:
            assert b.finished == (b.tokens[-1] in cap.stop_ids)
            assert all(t not in cap.stop_ids for t in b.tokens[:-1])


def test_fast_beam_search_does_not_depend_on_batching(cap, prompts):
    ps = prompts[:12]
    one = beam_search_fast(cap.gpt, ps, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids)
    small = beam_search_fast(cap.gpt, ps, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, batch_size=3)
    assert_same_beams(one, small)


def test_continuous_batching_keeps_each_images_beams_and_its_rows_full(cap, prompts):
    """Rows refilled as images finish (continuous batching): each image's beams (texts, order, mean
    log-probs within 1e-5) are those it gets decoded alone and in other company (reversed order, other slot
    counts, rows given as ``rows``); and the live share of the row-steps beats decoding the same images
    batch by batch, where every batch waits for its longest beam."""
    ps = prompts[:14]
    alone = [beam_search_fast(cap.gpt, [p], beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids)[0] for p in ps]
    stats: dict = {}
    three = beam_search_fast(cap.gpt, ps, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, rows=15, stats=stats)
    rev = beam_search_fast(cap.gpt, ps[::-1], beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, batch_size=4)[::-1]
    for got in (three, rev):
        assert [[b.tokens for b in bs] for bs in got] == [[b.tokens for b in bs] for bs in alone]
        # mean log-probs (the candidates' lm_logprob_mean) within 1e-5; sums over up to 14 float32 tokens 1e-4
        assert max(abs(a.score_mean - b.score_mean) for x, y in zip(alone, got) for a, b in zip(x, y)) <= 1e-5
        assert max(abs(a.score_sum - b.score_sum) for x, y in zip(alone, got) for a, b in zip(x, y)) <= 1e-4
    assert stats["slots"] == 3 and stats["rows"] == 15
    steps = [max(b.length for b in bs) - 1 for bs in alone]  # steps after the prompt pass's first token
    assert len(set(steps)) > 2  # images of different lengths share the rows
    batched = sum(steps) / sum(3 * max(steps[i : i + 3]) for i in range(0, len(steps), 3))
    assert stats["live_slot_steps"] == sum(steps)  # every live slot-step is one of an image's own steps
    assert stats["live_row_fraction"] > batched, (stats, batched)


def teacher_forced_logprob(cap, prompt, tokens):
    """Sum over generated tokens (stop token included) of log p(token | prompt, previous tokens)."""
    wte = cap.gpt.transformer.wte
    ids = torch.tensor(tokens)
    emb = torch.cat([prompt, wte(ids)], 0)[None]
    with torch.no_grad():
        logits = cap.gpt(inputs_embeds=emb, use_cache=False).logits[0]
    lp = logits.float().softmax(-1).log()
    start = prompt.shape[0] - 1
    return float(sum(lp[start + i, t] for i, t in enumerate(tokens)))


def test_beam_scores_are_sums_of_token_logprobs_including_the_stop(cap, prompts):
    p = prompts[4]
    beams = beam_search_fast(cap.gpt, [p], beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids)[0]
    for b in beams:
        assert abs(b.score_sum - teacher_forced_logprob(cap, p, b.tokens)) < 1e-4
        assert b.score_mean == pytest.approx(b.score_sum / len(b.tokens))


def test_greedy_fast_equals_reference_and_width_one_beam(cap, prompts):
    ref = [greedy_reference(cap.gpt, p, max_len=MAX_LEN, stop_ids=cap.stop_ids) for p in prompts]
    fast = greedy_fast(cap.gpt, prompts, max_len=MAX_LEN, stop_ids=cap.stop_ids, batch_size=7)
    assert [a.tokens for a in ref] == [b.tokens for b in fast]
    assert all(abs(a.score_sum - b.score_sum) < 1e-4 and a.finished == b.finished for a, b in zip(ref, fast))
    assert any(b.finished for b in ref) and any(not b.finished and b.length == MAX_LEN for b in ref)
    beam1 = beam_search_fast(cap.gpt, prompts, beam_width=1, max_len=MAX_LEN, stop_ids=cap.stop_ids)
    assert [b[0].tokens for b in beam1] == [a.tokens for a in ref]
    for p, a in list(zip(prompts, ref))[:5]:
        assert abs(a.score_sum - teacher_forced_logprob(cap, p, a.tokens)) < 1e-4


def test_generate_returns_candidates(cap):
    x, r, ents = make_inputs(6, seed=11)
    out = cap.generate(x, r, ents, decoder="beam", beam_width=4, max_len=MAX_LEN, search="fast")
    ref = cap.generate(x, r, ents, decoder="beam", beam_width=4, max_len=MAX_LEN, search="reference")
    assert len(out) == 6 and all(len(c) == 4 for c in out)
    assert [[c.text for c in cs] for cs in out] == [[c.text for c in cs] for cs in ref]
    for cs in out:
        assert [c.beam_rank for c in cs] == [0, 1, 2, 3]
        assert [c.lm_logprob_mean for c in cs] == sorted((c.lm_logprob_mean for c in cs), reverse=True)
        for c in cs:
            assert isinstance(c, Candidate)
            assert c.text == clean_up_tokenization(cap.tokenizer.decode(list(c.token_ids)))  # no strip
            assert c.n_tokens == len(c.token_ids)
            assert c.lm_logprob_mean == pytest.approx(c.lm_logprob_sum / c.n_tokens)
            assert c.finished == c.text.endswith(".")
            assert set(c.to_row()) == {"text", "lm_logprob_sum", "lm_logprob_mean", "n_tokens", "beam_rank"}
    greedy = cap.generate(x, r, ents, decoder="greedy", max_len=MAX_LEN)
    assert all(len(cs) == 1 and cs[0].beam_rank == 0 for cs in greedy)
    # k may differ per image
    per_image = cap.generate(x[:2], [r[0, :3], r[1]], ents[:2], beam_width=3, max_len=6)
    assert [c.text for c in per_image[1]] == [c.text for c in cap.generate(x[1:2], r[1:2], ents[1:2], beam_width=3, max_len=6)[0]]


def test_decoding_errors(cap, prompts):
    with pytest.raises(ValueError, match="positions"):
        beam_search_fast(cap.gpt, prompts[:2], beam_width=2, max_len=200, stop_ids=cap.stop_ids)
    with pytest.raises(ValueError, match="vocabulary size"):
        beam_search_reference(cap.gpt, prompts[0], beam_width=10_000, max_len=3, stop_ids=cap.stop_ids)
    x, r, ents = make_inputs(2, seed=1)
    with pytest.raises(ValueError, match="decoder"):
        cap.generate(x, r, ents, decoder="nucleus")
    with pytest.raises(ValueError, match="entity lists"):
        cap.generate(x, r, ents[:1])
    assert beam_search_fast(cap.gpt, [], beam_width=2, stop_ids=cap.stop_ids) == []


def test_bf16_fast_search_runs(cap, tmp_path):
    import copy

    from adjcap.models.ifcap import IFCapCaptioner

    half = IFCapCaptioner(copy.deepcopy(cap.model).to(torch.bfloat16), cap.tokenizer, device="cpu")
    x, r, ents = make_inputs(3, seed=5)
    out = half.generate(x, r, ents, beam_width=3, max_len=5)
    assert all(len(cs) == 3 and all(c.n_tokens >= 1 for c in cs) for cs in out)


@pytest.mark.parametrize("lam", [0.3, 1.0])
def test_contrastive_fast_matches_contrastive_reference(cap, lam):
    x, r, ents = make_inputs(12, seed=21)
    neg_r = torch.randn(12, 4, CLIP_DIM, generator=torch.Generator().manual_seed(2))
    pos = cap.prompt_embeddings(cap.soft_prompt(x, r), ents)
    neg = cap.prompt_embeddings(cap.soft_prompt(x, neg_r), ents)
    ref = [
        beam_search_reference(cap.gpt, p, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, neg_prompt=n, contrastive_lambda=lam)
        for p, n in zip(pos, neg)
    ]
    fast = beam_search_fast(
        cap.gpt, pos, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, neg_prompts=neg, contrastive_lambda=lam, batch_size=5
    )
    assert_same_beams(ref, fast)
    plain = beam_search_fast(cap.gpt, pos, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids)
    assert [[b.tokens for b in bs] for bs in plain] != [[b.tokens for b in bs] for bs in fast]
    # the contrastive score of a beam: sum over tokens of (1+lam) l_pos - lam l_neg
    b = fast[0][0]
    want = (1 + lam) * teacher_forced_logprob(cap, pos[0], b.tokens) - lam * teacher_forced_logprob(cap, neg[0], b.tokens)
    assert abs(b.score_sum - want) < 1e-4
    # lambda 0 is plain beam search; the captioner API builds the negative prompt itself
    zero = beam_search_fast(cap.gpt, pos, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids, neg_prompts=neg, contrastive_lambda=0.0)
    assert [[b.tokens for b in bs] for bs in zero] == [[b.tokens for b in bs] for bs in plain]
    api = cap.generate(x, r, ents, beam_width=5, max_len=MAX_LEN, negative_retrieved_feats=neg_r, contrastive_lambda=lam)
    assert [[c.token_ids for c in cs] for cs in api] == [[tuple(b.tokens) for b in bs] for bs in fast]
    with pytest.raises(ValueError, match="beam decoder only"):
        cap.generate(x, r, ents, decoder="greedy", negative_retrieved_feats=neg_r, contrastive_lambda=lam)


def test_clean_up_tokenization_is_transformers_4_19s():
    raw = "a man 's dog , running on a beach . is n't it ? yes ! i 'm sure we 've seen they 're ' fine '"
    assert clean_up_tokenization(raw) == (
        "a man's dog, running on a beach. isn't it? yes! i'm sure we've seen they're'fine '")
    assert clean_up_tokenization(" a cat .") == " a cat."  # no strip
    assert clean_up_tokenization("plain text") == "plain text"


def test_decoded_candidates_are_cleaned_up(cap):
    ids = cap.tokenizer.encode(" a man 's dog on a beach , with a kite .")
    assert cap.tokenizer.decode(ids) == " a man 's dog on a beach , with a kite ."  # transformers 5: raw
    (c,) = beams_to_candidates([Beam(tokens=ids, score_sum=-3.0, finished=True)], cap.tokenizer)
    assert c.text == " a man's dog on a beach, with a kite."
    assert c.token_ids == tuple(ids) and c.n_tokens == len(ids)  # only the text changes
    x, r, ents = make_inputs(8, seed=13)
    out = cap.generate(x, r, ents, beam_width=5, max_len=MAX_LEN)
    assert all(c.text == clean_up_tokenization(cap.tokenizer.decode(list(c.token_ids))) for cs in out for c in cs)


@torch.no_grad()
def official_beam(gpt, prompt, beam_width, max_len, stop_ids):
    """The official procedure written out independently (IFCap's official beam search): full forward each step,
    last position's logits, log(softmax), ordered by ``argsort(descending=True)`` at the end."""
    wte = gpt.transformer.wte
    stop = torch.tensor(list(stop_ids))
    gen = prompt[None]
    scores = tokens = None
    seq_lengths = torch.ones(beam_width)
    is_stopped = torch.zeros(beam_width, dtype=torch.bool)
    for _ in range(max_len):
        logits = gpt(inputs_embeds=gen).logits[:, -1, :]
        logits = logits.softmax(-1).log()
        if scores is None:
            scores, next_tokens = logits.topk(beam_width, -1)
            gen = gen.expand(beam_width, *gen.shape[1:])
            next_tokens, scores = next_tokens.permute(1, 0), scores.squeeze(0)
            tokens = next_tokens
        else:
            logits[is_stopped] = -float("inf")
            logits[is_stopped, 0] = 0
            scores_sum = scores[:, None] + logits
            seq_lengths[~is_stopped] += 1
            avg = scores_sum / seq_lengths[:, None]
            avg, next_tokens = avg.view(-1).topk(beam_width, -1)
            source = next_tokens // scores_sum.shape[1]
            seq_lengths = seq_lengths[source]
            next_tokens = (next_tokens % scores_sum.shape[1]).unsqueeze(1)
            tokens = torch.cat((tokens[source], next_tokens), dim=1)
            gen = gen[source]
            scores = avg * seq_lengths
            is_stopped = is_stopped[source]
        gen = torch.cat((gen, wte(next_tokens.squeeze()).view(gen.shape[0], 1, -1)), dim=1)
        is_stopped = is_stopped | torch.isin(next_tokens.squeeze(), stop)
        if is_stopped.all():
            break
    order = (scores / seq_lengths).argsort(descending=True)
    return [(tokens[i][: int(seq_lengths[i])].tolist(), float(scores[i])) for i in order]


def test_reference_beam_is_bitwise_the_official_full_forward(cap, prompts):
    for p in prompts[:8]:
        ours = beam_search_reference(cap.gpt, p, beam_width=5, max_len=MAX_LEN, stop_ids=cap.stop_ids)
        theirs = official_beam(cap.gpt, p, 5, MAX_LEN, cap.stop_ids)
        assert [(b.tokens, b.score_sum) for b in ours] == theirs  # bitwise: == on the float sums


@pytest.mark.parametrize("t", [0.0, -2.0])
def test_temperature_at_or_below_zero_falls_back_to_one(cap, prompts, t):
    p = prompts[1]
    want = beam_search_reference(cap.gpt, p, beam_width=3, max_len=6, stop_ids=cap.stop_ids, temperature=1.0)
    got = beam_search_reference(cap.gpt, p, beam_width=3, max_len=6, stop_ids=cap.stop_ids, temperature=t)
    fast = beam_search_fast(cap.gpt, [p], beam_width=3, max_len=6, stop_ids=cap.stop_ids, temperature=t)[0]
    greedy = greedy_reference(cap.gpt, p, max_len=6, stop_ids=cap.stop_ids, temperature=t)
    assert [(b.tokens, b.score_sum) for b in got] == [(b.tokens, b.score_sum) for b in want]
    assert all(math.isfinite(b.score_sum) for b in [*got, *fast, greedy])
    hot = beam_search_reference(cap.gpt, p, beam_width=3, max_len=6, stop_ids=cap.stop_ids, temperature=2.0)
    assert [b.score_sum for b in hot] != [b.score_sum for b in want]  # a real temperature still matters
