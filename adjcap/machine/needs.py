"""What a resolved config needs on this machine, and whether each thing is here: model weights, the
IFCap checkpoint, the benchmark's files, the NLTK data of the entity filter, Java and the SPICE jars.
One list, read by ``adjcap doctor``, the caption/run-job preflight, ``adjcap prepare --for`` and
``adjcap reproduce --list``. Nothing is downloaded or loaded; hub caches are only looked up.

Each :class:`Need` names the ``adjcap prepare`` step that fetches it (None: prepare cannot; ``hint``
says what to do). The checks are a registry (:data:`CHECKS`), one function per group."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from adjcap.engine.captioners import judge_needs
from adjcap.models.sources import Weights, looks_like_path, weights_of

# the benchmark steps of `adjcap prepare` by the folder they lay out under {data}
DATA_STEPS = ("ifcap", "coco", "flickr30k", "nocaps")


@dataclass(frozen=True)
class Need:
    group: str  # a key of CHECKS
    what: str  # e.g. "verifier Salesforce/blip-itm-large-coco"
    found: str | None  # where it is; None: missing
    step: str | None = None  # the `adjcap prepare` step that fetches it
    hint: str = ""  # what to do when prepare cannot fetch it

    @property
    def ok(self) -> bool:
        return self.found is not None


CHECKS: dict[str, Callable[[Any], list[Need]]] = {}


def check(group: str) -> Callable[[Callable[[Any], list[Need]]], Callable[[Any], list[Need]]]:
    def register(fn: Callable[[Any], list[Need]]) -> Callable[[Any], list[Need]]:
        CHECKS[group] = fn
        return fn

    return register


def _data_step(cfg: Any, path: str) -> str | None:
    """The prepare step that lays out ``path`` (a file under {data}/<step>/), or None (a user's path)."""
    try:
        rel = Path(path).resolve().relative_to(Path(cfg.paths.data_dir).expanduser().resolve())
    except ValueError:
        return None
    return rel.parts[0] if rel.parts and rel.parts[0] in DATA_STEPS else None


# what to do about a missing file of the demo world or its tiny models ({cache}/demo, {cache}/tiny)
DEMO_HINT = "make demo (or `adjcap demo`) builds the demo world and its tiny models"


def _local_hint(cfg: Any, path: str, what: str = "a path in the config") -> str:
    """What to do about a missing file the config names: the demo's are built by ``make demo``."""
    cache = Path(cfg.paths.cache_dir).expanduser().resolve()
    p = Path(path).expanduser().resolve()
    if any(p.is_relative_to(cache / sub) for sub in ("demo", "tiny")):
        return DEMO_HINT
    return f"{path} is {what}: put the file there or change the config"


def weights_of_judge(lm: str) -> Weights:
    """The LM judge of a candidates file as a weights entry (a hub id or a local directory)."""
    local = looks_like_path(lm) or Path(lm).expanduser().exists()
    return Weights("LM judge", "file" if local else "hf", lm, None if local else "verifier")


@check("weights")
def weights(cfg: Any) -> list[Need]:
    out = []
    for w in weights_of(cfg):
        step = "models" if w.kind != "file" else _data_step(cfg, w.name)
        hint = "" if step else _local_hint(cfg, w.name, "a local path in the config")
        out.append(Need("weights", f"{w.role} {w.key}", w.locate(), step, hint))
    cap = cfg.captioner
    lm, counts = judge_needs(cap) if cap.family == "candidates" else (False, False)
    if lm or counts:  # rows without log-probs (the judge scores them) or without token counts (it counts them)
        w = weights_of_judge(cap.candidates.lm)
        role = "LM judge" if lm else "LM judge's tokenizer (rows without n_tokens)"
        out.append(Need("weights", f"{role} {w.key}", w.locate(), "models" if w.kind != "file" else None,
                        "" if w.kind != "file" else f"{w.name} is a local path in the config"))
    return out


def _exists(path: str | None) -> str | None:
    return str(path) if path and Path(path).exists() else None


@check("data")
def data(cfg: Any) -> list[Need]:
    """The benchmark's reference files (per split), its images and its caption corpus."""
    b = cfg.benchmarks.get(cfg.benchmark)
    if b is None:
        return []
    files = [(f"{split} references", b.annotations_by_split.get(split, b.annotations)) for split in cfg.splits]
    if b.format == "folder":  # the user's own images: no references; the folder is checked by the job
        files = []
    files += [("images", b.images)] if b.format != "folder" else []
    corpus_step = None
    if b.corpus:
        files.append(("caption corpus", b.corpus))
        if cfg.retrieval.corpus is not None:  # a registered corpus: its prepare step lays it out
            from adjcap.data.corpora import get_corpus

            corpus_step = get_corpus(cfg.retrieval.corpus).source
            corpus_step = corpus_step if corpus_step != "demo" else None
    seen, out = set(), []
    for what, path in files:
        if path in seen:
            continue
        seen.add(path)
        step = corpus_step if what == "caption corpus" and corpus_step else _data_step(cfg, path)
        owner = "retrieval" if b.format == "folder" else cfg.benchmark
        out.append(Need("data", f"{owner} {what} {path}", _exists(path), step,
                        "" if step else _local_hint(cfg, path)))
    return out


@check("nltk")
def nltk_data(cfg: Any) -> list[Need]:
    """NLTK's tokenizer, tagger and WordNet when the entity filter tags with NLTK."""
    e = cfg.captioner.entities
    if cfg.captioner.family != "ifcap" or e.mode != "frequency" or e.tagger != "nltk":
        return []
    from adjcap.models.entities import NLTK_RESOURCES, missing_nltk_resources

    missing = set(missing_nltk_resources())  # also puts ADJCAP_NLTK_DATA / {data}/nltk_data on NLTK's path
    return [Need("nltk", f"NLTK data {name} (entity filter)", None if name in missing else _nltk_where(paths),
                 "nltk") for name, paths in NLTK_RESOURCES.items()]


def _nltk_where(paths: tuple[str, ...]) -> str:
    """Where NLTK finds the first of ``paths`` (a directory, or a zip member)."""
    import nltk

    for path in paths:
        try:
            found = nltk.data.find(path)
        except LookupError:
            continue
        return str(getattr(found, "path", None) or getattr(getattr(found, "zipfile", None), "filename", found))
    return "nltk_data"


@functools.lru_cache(maxsize=4)
def java_found(java: str = "java") -> str | None:
    """``java`` (a name on PATH or a path, as ``eval.java``) and its major version, or None."""
    from adjcap.java.runtime import JavaUnavailable, find_java, java_major_version

    try:
        path = find_java(java)
    except JavaUnavailable:
        return None
    try:
        return f"{path} (Java {java_major_version(java)})"
    except Exception:  # noqa: BLE001 - a java that does not run is missing
        return None


@check("java")
def java(cfg: Any) -> list[Need]:
    """Java for the PTB tokenizer and METEOR (every evaluation)."""
    return [Need("java", "Java 11+ (PTB tokenizer, METEOR)", java_found(cfg.eval.java), None,
                 "install a Java 11+ runtime (e.g. apt-get install default-jre-headless) and put java on PATH, "
                 "or set eval.java")]


@check("spice")
def spice(cfg: Any) -> list[Need]:
    """The Stanford CoreNLP 3.6.0 jars, only when the config evaluates SPICE."""
    if not cfg.eval.spice:
        return []
    from adjcap.java.corenlp import spice_status

    status = spice_status(cfg.eval)
    return [Need("spice", "SPICE CoreNLP 3.6.0 jars", status if status.startswith("ready") else None, "spice",
                 status)]


@check("chair")
def chair_instances(cfg: Any) -> list[Need]:
    """The COCO instances files, only when the config scores the original CHAIR (eval.chair) on COCO
    (other benchmarks have no instance annotations: their evaluation says so in a note)."""
    if cfg.eval.chair == "proxy" or cfg.benchmark != "coco":
        return []
    return [Need("chair", f"COCO instances {Path(f).name} (instance CHAIR)", _exists(f), "coco-instances")
            for f in cfg.eval.coco_instances]


def needs_of(cfg: Any, groups: tuple[str, ...] | None = None) -> list[Need]:
    """Every need of a resolved config (``groups``: only those), in registry order."""
    out: list[Need] = []
    for group, fn in CHECKS.items():
        if groups is None or group in groups:
            out += fn(cfg)
    return out


def missing(needs: list[Need]) -> list[Need]:
    return [n for n in needs if not n.ok]


def steps_for(needs: list[Need]) -> list[str]:
    """The prepare steps that fetch ``needs``, without repeats, in first-use order."""
    return list(dict.fromkeys(n.step for n in needs if n.step))
