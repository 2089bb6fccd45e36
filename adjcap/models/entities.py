"""IFCap's entity side: the hard-prompt template, the frequency-based entity filter and the CLIP
zero-shot entity classifier (as the IFCap paper and its official code describe it).

Frequency filter (spec 4.1-4.2), per image:

1. every caption of the pool is NLTK ``word_tokenize``-d and ``pos_tag``-ged;
2. tokens tagged exactly ``NN`` or ``NNS`` are lower-cased, stripped and lemmatised with the WordNet
   lemmatiser (noun POS); every occurrence adds 1 to its lemma's count;
3. the (count, lemma) pairs are sorted descending *as tuples*: count first, ties reverse-alphabetical;
4. entities with count >= K are admitted in that order (no cap, no vocabulary/stop-word filter).

The counting/order/threshold logic is :func:`count_tagged` + :func:`filter_entities` and works on
already tagged captions; :func:`count_nouns` adds the NLTK tokenizer/tagger/lemmatiser.

NLTK data: the tagger path needs the NLTK resources ``punkt_tab``, ``averaged_perceptron_tagger_eng``
and ``wordnet``. They are not shipped by any package this project installs; install them once with
``python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng wordnet`` (or point the
environment variable ``ADJCAP_NLTK_DATA`` or ``NLTK_DATA`` at an ``nltk_data`` directory that holds
them; ``adjcap prepare nltk`` puts them in ``$ADJCAP_DATA/nltk_data``, which is searched too). A missing resource raises :class:`NLTKResourceError` naming it and that command.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

__all__ = [
    "ENSEMBLE_TEMPLATES",
    "NLTK_DOWNLOAD_COMMAND",
    "NLTK_RESOURCES",
    "NLTKResourceError",
    "clip_classifier_entities",
    "count_nouns",
    "count_tagged",
    "ensemble_embeddings",
    "filter_entities",
    "frequency_entities",
    "hard_prompt",
    "missing_nltk_resources",
    "nltk_lemmatizer",
    "nltk_tagger",
]

# --------------------------------------------------------------------------------------------
# Hard prompt (spec 1.4)
# --------------------------------------------------------------------------------------------

PROMPT_HEAD = "There are"
PROMPT_TAIL = " in image."
PROMPT_EMPTY = " something"


def hard_prompt(entities: Sequence[str]) -> str:
    """IFCap's entity prompt: ``There are e1, e2 in image.``; ``There are something in image.``
    when ``entities`` is empty. Entities are inserted verbatim, in the given order."""
    if isinstance(entities, str):
        raise TypeError("hard_prompt expects a list of entity strings, not one string")
    if not entities:
        return PROMPT_HEAD + PROMPT_EMPTY + PROMPT_TAIL
    body = "".join(" " + str(e) + "," for e in entities)[:-1]
    return PROMPT_HEAD + body + PROMPT_TAIL


# --------------------------------------------------------------------------------------------
# Frequency filter (spec 4.1-4.2)
# --------------------------------------------------------------------------------------------

NOUN_TAGS = ("NN", "NNS")


def count_tagged(
    tagged_captions: Iterable[Iterable[tuple[str, str]]],
    lemmatize: Callable[[str], str] | None = None,
) -> list[tuple[int, str]]:
    """Count noun lemmas over already POS-tagged captions.

    ``tagged_captions``: one list of ``(token, tag)`` pairs per caption. Tokens tagged exactly NN or
    NNS are lower-cased and stripped, then passed to ``lemmatize`` (identity when None). Every
    occurrence counts. Returns ``(count, lemma)`` tuples sorted descending as tuples (count desc,
    ties reverse-alphabetical), as IFCap's ``retrieved_entity`` files hold them.
    """
    counts: Counter[str] = Counter()
    for caption in tagged_captions:
        for token, tag in caption:
            if tag not in NOUN_TAGS:
                continue
            word = token.lower().strip()
            lemma = lemmatize(word) if lemmatize is not None else word
            counts[lemma] += 1
    return sorted(((c, w) for w, c in counts.items()), reverse=True)


def filter_entities(counts: Iterable[Sequence], K: int) -> list[str]:
    """Entities whose count is >= K, in the order of ``counts`` ((count, lemma) pairs, as returned
    by :func:`count_tagged` or read from an IFCap ``retrieved_entity`` JSON)."""
    out = []
    for pair in counts:
        count, lemma = pair[0], pair[1]
        if int(count) >= K:
            out.append(str(lemma))
    return out


NLTK_RESOURCES = {
    # name for the downloader: paths nltk.data.find accepts (first that exists wins)
    "punkt_tab": ("tokenizers/punkt_tab/english/",),
    "averaged_perceptron_tagger_eng": ("taggers/averaged_perceptron_tagger_eng/",),
    "wordnet": ("corpora/wordnet", "corpora/wordnet.zip/wordnet/"),
}
NLTK_DOWNLOAD_COMMAND = "python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng wordnet"


class NLTKResourceError(LookupError):
    """An NLTK data resource the entity filter needs is not installed."""


def _extend_nltk_path() -> None:
    import nltk

    for var in ("ADJCAP_NLTK_DATA", "NLTK_DATA"):
        for d in os.environ.get(var, "").split(os.pathsep):
            if d and d not in nltk.data.path:
                nltk.data.path.insert(0, d)
    prepared = os.path.join(os.path.expanduser(os.environ.get("ADJCAP_DATA", "~/adjcap-data")), "nltk_data")
    if os.path.isdir(prepared) and prepared not in nltk.data.path:  # where `adjcap prepare nltk` puts it
        nltk.data.path.append(prepared)


def missing_nltk_resources(names: Sequence[str] = tuple(NLTK_RESOURCES)) -> list[str]:
    """The NLTK resources among ``names`` that cannot be found (after adding ADJCAP_NLTK_DATA)."""
    import nltk

    _extend_nltk_path()
    missing = []
    for name in names:
        for path in NLTK_RESOURCES[name]:
            try:
                nltk.data.find(path)
                break
            except LookupError:
                continue
        else:
            missing.append(name)
    return missing


def _require_nltk(names: Sequence[str]) -> None:
    missing = missing_nltk_resources(names)
    if missing:
        import nltk

        raise NLTKResourceError(
            f"NLTK data missing: {', '.join(missing)} (needed by the entity filter: word_tokenize, "
            f"pos_tag, WordNet lemmatiser). Install it with:\n    {NLTK_DOWNLOAD_COMMAND}\n"
            f"or set ADJCAP_NLTK_DATA to an nltk_data directory that holds it. "
            f"Searched: {', '.join(map(str, nltk.data.path))}"
        )


def nltk_tagger() -> Callable[[str], list[tuple[str, str]]]:
    """NLTK ``word_tokenize`` + ``pos_tag`` (averaged perceptron, English) as one callable."""
    _require_nltk(("punkt_tab", "averaged_perceptron_tagger_eng"))
    from nltk import pos_tag, word_tokenize

    def tag(caption: str) -> list[tuple[str, str]]:
        return pos_tag(word_tokenize(caption))

    return tag


def nltk_lemmatizer() -> Callable[[str], str]:
    """NLTK ``WordNetLemmatizer().lemmatize`` with its default (noun) POS."""
    _require_nltk(("wordnet",))
    from nltk.stem import WordNetLemmatizer

    lem = WordNetLemmatizer()
    return lem.lemmatize


def count_nouns(
    captions: Sequence[str],
    tagger: Callable[[str], list[tuple[str, str]]] | None = None,
    lemmatize: Callable[[str], str] | None = None,
) -> list[tuple[int, str]]:
    """IFCap's noun counts over one image's caption pool (spec 4.1): NLTK tokenize + tag,
    NN/NNS only, lower+strip, WordNet noun lemma, every occurrence counts; sorted descending as
    (count, lemma) tuples. ``tagger``/``lemmatize`` default to NLTK's (they need NLTK data, see
    the module docstring)."""
    tagger = tagger or nltk_tagger()
    lemmatize = lemmatize or nltk_lemmatizer()
    return count_tagged((tagger(c) for c in captions), lemmatize=lemmatize)


def frequency_entities(
    captions: Sequence[str],
    K: int,
    tagger: Callable[[str], list[tuple[str, str]]] | None = None,
    lemmatize: Callable[[str], str] | None = None,
) -> list[str]:
    """:func:`count_nouns` then :func:`filter_entities` (count >= K)."""
    return filter_entities(count_nouns(captions, tagger=tagger, lemmatize=lemmatize), K)


# --------------------------------------------------------------------------------------------
# CLIP zero-shot entity classifier (spec 4.3; IFCap's NoCaps path)
# --------------------------------------------------------------------------------------------


# ViECap's 7-template prompt ensemble for the vocabulary text embeddings (spec 4.3)
ENSEMBLE_TEMPLATES = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)


def ensemble_embeddings(
    vocab: Sequence[str], encode_texts: Callable[[list[str]], torch.Tensor], templates: Sequence[str] = ENSEMBLE_TEMPLATES
) -> torch.Tensor:
    """[N, C] vocabulary embeddings as ViECap built them: encode the templates filled with each entry,
    L2-normalise each, average, L2-normalise the average. ``encode_texts`` maps a list of strings to
    [n, C] text embeddings (raw or normalised; normalised here). One encoder call for everything."""
    texts = [t.format(v) for v in vocab for t in templates]
    emb = torch.as_tensor(encode_texts(texts)).float()
    emb = emb / emb.norm(dim=-1, keepdim=True)
    mean = emb.view(len(vocab), len(templates), -1).mean(dim=1)
    return mean / mean.norm(dim=-1, keepdim=True)


def clip_classifier_entities(
    image_feats: torch.Tensor,
    vocab_embeddings: torch.Tensor,
    vocab: Sequence[str],
    top_k: int = 3,
    threshold: float = 0.2,
    temperature: float = 0.01,
) -> list[list[str]]:
    """Entities by CLIP zero-shot classification over a vocabulary.

    p = softmax(norm(x) . norm(T)^T / temperature) over the whole vocabulary; take the top_k by
    probability in descending order and stop at the first one below ``threshold``.
    ``image_feats``: [B, C] or [C] (raw or normalised; normalised here); ``vocab_embeddings``: [N, C]
    with row i = ``vocab[i]``. Returns one list of entity names per image.
    """
    x = torch.as_tensor(image_feats).float()
    if x.dim() == 1:
        x = x[None]
    t = torch.as_tensor(vocab_embeddings).float().to(x.device)
    if t.dim() != 2 or t.shape[0] != len(vocab):
        raise ValueError(
            f"vocab_embeddings has shape {tuple(t.shape)} but the vocabulary has {len(vocab)} entries; "
            "row i must embed vocab[i]"
        )
    if t.shape[1] != x.shape[1]:
        raise ValueError(f"image features are {x.shape[1]}-d but vocabulary embeddings are {t.shape[1]}-d")
    x = x / x.norm(dim=-1, keepdim=True)
    t = t / t.norm(dim=-1, keepdim=True)
    probs = (x @ t.T / temperature).softmax(dim=-1)
    k = min(top_k, len(vocab))
    top_p, top_i = probs.topk(k, dim=-1)
    out: list[list[str]] = []
    for ps, ids in zip(top_p.tolist(), top_i.tolist()):
        ents = []
        for p, i in zip(ps, ids):
            if p < threshold:
                break
            ents.append(vocab[i])
        out.append(ents)
    return out


# --------------------------------------------------------------------------------------------
# Lexicon tagger (closed vocabularies, e.g. the demo world)
# --------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|[0-9]+|[^\sA-Za-z0-9]")


def lexicon_tagger(lexicon: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], list[tuple[str, str]]], Callable[[str], str]]:
    """(tagger, lemmatize) from a {word: [tag, lemma]} lexicon: words are split on letters and
    punctuation, looked up lower-cased; unknown words get the tag 'X' (never a noun)."""
    lex = {str(k).lower(): (str(v[0]), str(v[1])) for k, v in lexicon.items()}

    def tag(caption: str) -> list[tuple[str, str]]:
        return [(w, lex.get(w.lower(), ("X", w))[0]) for w in _WORD.findall(caption)]

    def lemmatize(word: str) -> str:
        return lex.get(word, (None, word))[1]

    return tag, lemmatize


def load_tagger(spec: str) -> tuple[Callable[[str], list[tuple[str, str]]], Callable[[str], str]]:
    """'nltk' -> NLTK's tagger and WordNet lemmatiser (errors name the missing data); a path ->
    :func:`lexicon_tagger` over that JSON file."""
    if spec == "nltk":
        return nltk_tagger(), nltk_lemmatizer()
    import json
    from pathlib import Path

    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(
            f"captioner.entities.tagger: lexicon {path} does not exist (use 'nltk' or a JSON {{word: [tag, lemma]}})"
        )
    return lexicon_tagger(json.loads(path.read_text()))
