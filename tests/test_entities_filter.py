"""Entity side of IFCap: hard-prompt template (spec 1.4), frequency filter counting/order/threshold
(spec 4.1-4.2) on given POS tags, the NLTK path, and the CLIP zero-shot classifier (spec 4.3)."""

from __future__ import annotations

import pytest
import torch

from adjcap.models.entities import (
    ENSEMBLE_TEMPLATES,
    NLTK_DOWNLOAD_COMMAND,
    NLTKResourceError,
    clip_classifier_entities,
    count_nouns,
    count_tagged,
    ensemble_embeddings,
    filter_entities,
    frequency_entities,
    hard_prompt,
    missing_nltk_resources,
    nltk_lemmatizer,
    nltk_tagger,
)


def test_hard_prompt_template():
    assert hard_prompt([]) == "There are something in image."
    assert hard_prompt(["dog"]) == "There are dog in image."
    assert hard_prompt(["man", "surfboard", "wave"]) == "There are man, surfboard, wave in image."
    assert hard_prompt(["traffic light", "car"]) == "There are traffic light, car in image."
    with pytest.raises(TypeError):
        hard_prompt("dog")


# Captions as NLTK tags them (word_tokenize + pos_tag), written out so the logic is tested without
# the tagger: NN/NNS only, not NNP/VBG/JJ; repeats inside a caption count.
TAGGED = [
    [("A", "DT"), ("man", "NN"), ("riding", "VBG"), ("a", "DT"), ("wave", "NN"), ("on", "IN"),
     ("top", "NN"), ("of", "IN"), ("a", "DT"), ("surfboard", "NN"), (".", ".")],
    [("Men", "NNS"), ("surfing", "VBG"), ("waves", "NNS"), ("near", "IN"), ("Hawaii", "NNP"), (".", ".")],
    [("A", "DT"), ("surfer", "NN"), ("rides", "VBZ"), ("a", "DT"), ("wave", "NN"), ("and", "CC"),
     ("another", "DT"), ("wave", "NN"), (".", ".")],
    [("The", "DT"), ("man", "NN"), ("is", "VBZ"), ("on", "IN"), ("a", "DT"), ("surfboard", "NN"),
     ("in", "IN"), ("the", "DT"), ("ocean", "NN"), (" Top ", "NN"), (".", ".")],
]
LEMMAS = {"waves": "wave", "men": "men", "surfboards": "surfboard"}


def lemmatize(w: str) -> str:
    return LEMMAS.get(w, w)


def test_count_tagged_counts_every_noun_occurrence():
    counts = count_tagged(TAGGED, lemmatize=lemmatize)
    assert counts == [
        (4, "wave"),  # 1 + "waves" + 2 in one caption
        (2, "top"),  # "top" and " Top " (lower + strip)
        (2, "surfboard"),
        (2, "man"),
        (1, "surfer"),
        (1, "ocean"),
        (1, "men"),  # WordNet keeps "men"; NNP "Hawaii" is not counted
    ]


def test_ties_are_reverse_alphabetical_and_threshold_is_inclusive():
    counts = count_tagged(TAGGED, lemmatize=lemmatize)
    assert filter_entities(counts, 2) == ["wave", "top", "surfboard", "man"]
    assert filter_entities(counts, 3) == ["wave"]
    assert filter_entities(counts, 5) == []
    assert filter_entities(counts, 0) == [w for _, w in counts]
    # released retrieved_entity JSONs hold [count, lemma] lists
    assert filter_entities([[5, "zebra"], [5, "giraffe"], [4, "tree"]], 5) == ["zebra", "giraffe"]
    assert hard_prompt(filter_entities(counts, 5)) == "There are something in image."


def test_count_tagged_without_lemmatizer_and_empty():
    assert count_tagged([]) == []
    assert count_tagged([[("Dogs", "NNS"), ("dogs", "NNS"), ("dog", "NN")]]) == [(2, "dogs"), (1, "dog")]


def test_count_nouns_with_given_tagger_and_lemmatizer():
    tags = {" ".join(w for w, _ in t): t for t in TAGGED}
    got = frequency_entities(list(tags), 2, tagger=lambda c: tags[c], lemmatize=lemmatize)
    assert got == ["wave", "top", "surfboard", "man"]


_MISSING = missing_nltk_resources()


def test_missing_nltk_data_raises_the_install_command(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.delenv("ADJCAP_NLTK_DATA", raising=False)
    monkeypatch.delenv("NLTK_DATA", raising=False)
    with pytest.raises(NLTKResourceError) as e:
        nltk_tagger()
    assert "punkt_tab" in str(e.value) and NLTK_DOWNLOAD_COMMAND in str(e.value)
    with pytest.raises(NLTKResourceError, match="wordnet"):
        nltk_lemmatizer()
    with pytest.raises(LookupError, match="python -m nltk.downloader"):
        count_nouns(["A dog."])
    assert NLTK_DOWNLOAD_COMMAND == "python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng wordnet"


def test_adjcap_nltk_data_dir_is_searched(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [])
    (tmp_path / "corpora" / "wordnet").mkdir(parents=True)
    monkeypatch.setenv("ADJCAP_NLTK_DATA", str(tmp_path))
    assert "wordnet" not in missing_nltk_resources(["wordnet"])
    assert str(tmp_path) in nltk.data.path


@pytest.mark.skipif(
    bool(_MISSING),
    reason=f"NLTK data not installed ({', '.join(_MISSING)}); no PyPI package this project uses ships it. "
    f"Install with `{NLTK_DOWNLOAD_COMMAND}` (or set ADJCAP_NLTK_DATA) to run this test",
)
def test_nltk_path_on_real_captions():
    caps = [
        "A man riding a wave on top of a surfboard.",
        "A surfer riding a large wave in the ocean.",
        "Men surfing waves near the beach.",
    ]
    counts = count_nouns(caps)
    assert counts[0] == (4, "wave")
    assert (1, "men") in counts and (1, "man") in counts
    assert frequency_entities(caps, 2) == ["wave"]


def test_clip_classifier_entities():
    vocab = ["cat", "dog", "pizza", "zebra"]
    t = torch.eye(4, 8)
    t[3, 1] = 0.99  # zebra is close to dog
    x = torch.stack([
        3.0 * t[1] + 0.01 * t[3],  # dog, then zebra (close), then the rest far below
        t[0] + t[2],  # cat and pizza share the mass: each about 0.5
    ])
    got = clip_classifier_entities(x, t, vocab, top_k=3, threshold=0.2, temperature=0.01)
    assert got[0][:1] == ["dog"]
    probs = (torch.nn.functional.normalize(x) @ torch.nn.functional.normalize(t).T / 0.01).softmax(-1)
    expect = [vocab[i] for p, i in zip(*probs[0].topk(3)) if p >= 0.2]
    assert got[0] == expect
    assert sorted(got[1]) == ["cat", "pizza"]
    assert clip_classifier_entities(x, t, vocab, top_k=3, threshold=0.99)[1] == []
    # descending top-k, cut at the first probability below the threshold (equal passes)
    x2 = torch.tensor([[1.0, 0.5, 0.0, 0.0, 0, 0, 0, 0]])
    e = torch.eye(4, 8)
    p2 = (x2 / x2.norm(dim=-1, keepdim=True) @ e.T / 0.5).softmax(-1)[0]
    assert clip_classifier_entities(x2, e, vocab, top_k=3, threshold=float(p2[1]), temperature=0.5) == [["cat", "dog"]]
    assert clip_classifier_entities(x2, e, vocab, top_k=3, threshold=float(p2[1]) + 1e-6, temperature=0.5) == [["cat"]]
    assert clip_classifier_entities(x[0], t, vocab, top_k=1) == [["dog"]]
    with pytest.raises(ValueError, match="row i must embed vocab"):
        clip_classifier_entities(x, t[:3], vocab)


def test_ensemble_embeddings_average_normalised_template_embeddings():
    assert len(ENSEMBLE_TEMPLATES) == 7 and ENSEMBLE_TEMPLATES[0] == "itap of a {}."
    g = torch.Generator().manual_seed(0)
    table = {}

    def encode(texts):
        out = []
        for t in texts:
            if t not in table:
                table[t] = torch.randn(6, generator=g) * 3
            out.append(table[t])
        return torch.stack(out)

    got = ensemble_embeddings(["dog", "traffic light"], encode)
    assert got.shape == (2, 6)
    for i, name in enumerate(["dog", "traffic light"]):
        vs = torch.stack([table[t.format(name)] for t in ENSEMBLE_TEMPLATES])
        m = (vs / vs.norm(dim=-1, keepdim=True)).mean(0)
        torch.testing.assert_close(got[i], m / m.norm())
    assert "a traffic light in a video game." in table


def test_corpus_nouns_tagged_once_count_as_tagging_each_pool(tmp_path):
    """adjcap.index.nouns: the corpus captions' nouns, tagged once and kept with the index, give every
    pool of captions exactly count_nouns' (count, lemma) list; the file is keyed by the corpus and the
    tagger (another lexicon content: tagged again), and read back instead of tagged again."""
    import json
    import random

    from adjcap.models.entities import lexicon_tagger
    from adjcap.index.nouns import CorpusNouns, ensure_nouns

    lexicon = {"dog": ["NN", "dog"], "dogs": ["NNS", "dog"], "man": ["NN", "man"], "men": ["NNS", "man"],
               "park": ["NN", "park"], "frisbee": ["NN", "frisbee"], "runs": ["VBZ", "run"], "red": ["JJ", "red"],
               "beach": ["NN", "beach"], "ball": ["NN", "ball"]}
    lex = tmp_path / "lexicon.json"
    lex.write_text(json.dumps(lexicon))
    rng = random.Random(3)
    words = [*lexicon, "a", "the", "with", "Dog", "."]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    said = []
    nouns = ensure_nouns(tmp_path, texts, "fp-1", str(lex), say=said.append)
    assert len(said) == 1 and len(list(tmp_path.glob("nouns-*.npz"))) == 1
    tagger, lemmatize = lexicon_tagger(lexicon)
    for _ in range(50):
        pool = rng.sample(range(len(texts)), rng.randint(1, 9))
        assert nouns.counts(pool) == count_nouns([texts[i] for i in pool], tagger=tagger, lemmatize=lemmatize)
    again = ensure_nouns(tmp_path, texts, "fp-1", str(lex), say=said.append)
    assert len(said) == 1 and again.counts(range(len(texts))) == nouns.counts(range(len(texts)))  # read, not tagged
    ensure_nouns(tmp_path, texts, "fp-2", str(lex), say=said.append)  # another corpus: its own file
    lex.write_text(json.dumps({**lexicon, "runs": ["NNS", "run"]}))  # another tagger: its own file
    other = ensure_nouns(tmp_path, texts, "fp-1", str(lex), say=said.append)
    assert len(said) == 3 and len(list(tmp_path.glob("nouns-*.npz"))) == 3
    assert any(other.of(i) != nouns.of(i) for i in range(len(texts)))
    assert CorpusNouns.load(tmp_path / "missing.npz") is None
