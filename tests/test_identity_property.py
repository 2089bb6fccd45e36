"""The identity property (docs/architecture.md, "Identity"): for every config setting,
changing it either changes the identity of each stage whose output it changes, or leaves the outputs
equal. Each setting is changed once; the stages before the first stage whose identity changed are run
on two demo images with the changed config (tiny models, in process) and their outputs compared with
the unchanged config's. A setting whose change alters an output but not that stage's identity fails,
named; so does a setting this test has no other value for (add one to ALTERNATIVES)."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from adjcap.engine import image_state, stages
from adjcap.config import BenchmarkCfg, Config, load_config
from adjcap.engine.identity import config_view, stage_identities
from adjcap.index import CaptionIndex, encode_shards_in_process, encoder_identity, ensure_index
from adjcap.index.lifecycle import index_location, search_corpus
from adjcap.models import roles
from adjcap.engine import stage_registry
from adjcap.engine.run_plan import read_records

STAGES = stage_registry.names()

BASE = ["captioner.beam_width=4", "captioner.max_len=12"]


class World:
    """The demo world in a cache of its own, two images, and models loaded once per role section."""

    def __init__(self, demo_cfg: Config, root: Path):
        self.root = root
        self.cache = root / "cache"
        self.cache.mkdir()
        shared = Path(demo_cfg.resolved().paths.cache_dir)
        for sub in ("demo", "tiny"):
            (self.cache / sub).symlink_to(shared / sub, target_is_directory=True)
        self.sets = [f"paths.cache_dir={self.cache}", f"paths.runs_dir={root}/runs", *BASE]
        self.cfg = self.load()
        self.records = read_records(self.cfg)["test"][:2]
        self._models: dict[str, object] = {}
        self._copies = 0

    def load(self, *sets) -> Config:
        """``sets``: ``key=value`` overrides, or (key, value) pairs set as typed (a literal "none" value
        cannot be given as an override: it reads as None)."""
        updates = dict(s for s in sets if isinstance(s, tuple))
        return load_config("demo", [*self.sets, *(s for s in sets if isinstance(s, str))], updates=updates).resolved()

    def copy(self, path: str, alone: bool = False) -> str:
        """The same file or directory under another path (a file with the configs beside it, unless
        ``alone``)."""
        self._copies += 1
        src = Path(path)
        dst = self.root / "copies" / str(self._copies) / src.name
        dst.parent.mkdir(parents=True)
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
        if src.is_file() and not alone:
            for side in src.parent.glob("*.json"):
                if side != src:
                    shutil.copyfile(side, dst.parent / side.name)
        return str(dst)

    def model(self, role: str, key: object, load):
        k = role + json.dumps(key, sort_keys=True, default=str)
        if k not in self._models:
            self._models[k] = load()
        return self._models[k]

    def identities(self, cfg: Config) -> dict[str, str]:
        corpus = search_corpus(cfg.retrieval, cfg.benchmark_cfg(), cfg.benchmark, cfg.paths.cache_dir)
        return stage_identities(cfg, corpus.fingerprint)

    def outputs(self, cfg: Config, n_stages: int) -> dict[str, list[str]]:
        """The first ``n_stages`` stages on the two images with ``cfg``: stage -> each image's output."""
        dev = cfg.device
        d = lambda m: m.model_dump(mode="json")  # noqa: E731
        states = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path, r.error,
                                      cfg.benchmark_cfg().applies_exif()) for r in self.records]
        enc = self.model("retrieval", [d(cfg.retrieval.encoder), dev],
                         lambda: roles.load_retrieval_encoder(cfg.retrieval.encoder, dev))
        bench = cfg.benchmark_cfg()

        def index():
            corpus = search_corpus(cfg.retrieval, bench, cfg.benchmark, cfg.paths.cache_dir)
            out = ensure_index(cfg.retrieval, cfg.paths.cache_dir, corpus, encode_shards_in_process(enc),
                               corpus_format=bench.corpus_format)
            return CaptionIndex.load(out, device=dev, encoder_id=encoder_identity(cfg.retrieval.encoder)), corpus.texts

        idx, texts = self.model("index", [d(cfg.retrieval), d(bench), cfg.paths.cache_dir, dev], index)
        stages.retrieve(states, enc, idx, texts, cfg.retrieval.top_l)
        if n_stages > 1:
            ver = self.model("verifier", [d(cfg.verifier), dev], lambda: roles.load_verifier(cfg.verifier, dev))
            stages.verify(states, ver, cfg.verifier.keep)
        if n_stages > 2:
            c = self.model("captioner", [d(cfg.captioner), dev], lambda: roles.load_captioner(cfg.captioner, dev))
            stages.caption(states, c.captioner, c.clip, cfg.captioner, c.vocabulary)
        if n_stages > 3:
            sc = self.model("scorer", [d(cfg.retrieval.encoder), d(cfg.scorer_encoder()), d(cfg.eval.clipscore),
                                       d(cfg.verifier), dev],
                            lambda: roles.load_scorer(cfg.retrieval.encoder, cfg.scorer_encoder(), cfg.eval.clipscore,
                                                      cfg.verifier, dev, loaded={"retrieval": enc, "verifier": ver}))
            stages.score(states, sc.output, sc.verifier, sc.clipscore, reuse_image_embedding=sc.reuse_stage1)
        assert all(s.error is None for s in states), [s.error for s in states]
        return {stage: [json.dumps(stage_registry.stage(stage).output.stored(s), sort_keys=True, default=str) for s in states]
                for stage in STAGES[:n_stages]}


def _other_corpus(w: World) -> list[str]:
    texts = json.loads(Path(w.cfg.benchmark_cfg().corpus).read_text())
    lines = w.root / "other-corpus.txt"
    flat = [t for v in (texts.values() if isinstance(texts, dict) else [texts]) for t in (v if isinstance(v, list) else [v])]
    lines.write_text("\n".join(f"a photo of {t}" for t in reversed(flat[:200])) + "\n")
    return [f"benchmarks.demo.corpus={lines}", "benchmarks.demo.corpus_format=lines"]


def _built_index(w: World) -> str:
    w.outputs(w.cfg, 1)  # the demo index, built in this cache
    c = w.cfg
    corpus = search_corpus(c.retrieval, c.benchmark_cfg(), c.benchmark, c.paths.cache_dir)
    return w.copy(str(index_location(c.retrieval, c.paths.cache_dir, encoder_identity(c.retrieval.encoder),
                                     corpus.fingerprint)))


# settings whose other value is not derived from their type: key -> overrides, from the world
ALTERNATIVES: dict[str, typing.Callable[[World], list[str]]] = {
    "benchmark": lambda w: ["benchmark=mine", *(f"benchmarks.mine.{k}={json.dumps(v)}" for k, v in
                                                w.cfg.benchmark_cfg().model_dump(mode="json", exclude_none=True).items()
                                                if not isinstance(v, dict))],
    "benchmarks.demo.annotations": lambda w: [f"benchmarks.demo.annotations={w.cfg.benchmark_cfg().annotations_by_split['val']}"],
    "benchmarks.demo.annotations_by_split.test": lambda w: [
        f"benchmarks.demo.annotations_by_split.test={w.copy(w.cfg.benchmark_cfg().annotations_by_split['test'])}"],
    "benchmarks.demo.annotations_by_split.val": lambda w: [
        f"benchmarks.demo.annotations_by_split.val={w.cfg.benchmark_cfg().annotations_by_split['test']}"],
    "benchmarks.demo.corpus": _other_corpus,
    "benchmarks.demo.format": lambda w: ["benchmarks.demo.format=auto"],
    "benchmarks.demo.images": lambda w: [f"benchmarks.demo.images={w.copy(w.cfg.benchmark_cfg().images)}"],
    "cache.stages_dir": lambda w: [f"cache.stages_dir={w.root}/other-stages"],
    "captioner.checkpoint": lambda w: [f"captioner.checkpoint={w.copy(w.cfg.captioner.checkpoint)}"],
    "captioner.clip.model": lambda w: ["captioner.clip.model=adjcap-tiny-clip-large"],
    # alone: without the open_clip_config.json beside it, the file loads as another model
    "captioner.clip.pretrained": lambda w: [f"captioner.clip.pretrained={w.copy(w.cfg.captioner.clip.pretrained, alone=True)}"],
    "captioner.compile_cache": lambda w: [f"captioner.compile_cache={w.root}/elsewhere"],
    # as captioner.batch_size's 33: slots for every image (fewer slots move the log-probs' last bits, ~1e-6)
    "captioner.rows": lambda w: [f"captioner.rows={40 * w.cfg.captioner.beam_width}"],
    "captioner.candidates.file": lambda w: [f"captioner.candidates.file={w.root}/candidates.jsonl"],
    "captioner.candidates.lm": lambda w: ["captioner.candidates.lm=distilgpt2"],
    "captioner.entities.tagger": lambda w: ["captioner.entities.tagger=nltk"],
    "captioner.hf.model": lambda w: ["captioner.hf.model=Salesforce/blip-image-captioning-base"],
    "captioner.hf.prompt": lambda w: ["captioner.hf.prompt=a picture of"],
    "captioner.vlm.model": lambda w: ["captioner.vlm.model=llava-hf/llava-1.5-7b-hf"],
    "captioner.vlm.prompt": lambda w: ["captioner.vlm.prompt=Describe the picture."],
    "captioner.entities.vocabulary": lambda w: [f"captioner.entities.vocabulary={w.copy(w.cfg.captioner.entities.vocabulary)}"],
    "captioner.lm_config": lambda w: [f"captioner.lm_config={w.copy(w.cfg.captioner.lm_config)}"],
    "captioner.tokenizer": lambda w: [f"captioner.tokenizer={w.copy(w.cfg.captioner.tokenizer)}"],
    "description": lambda w: ["description=another"],
    "device": lambda w: ["device=cpu"],
    "eval.clipscore.model": lambda w: ["eval.clipscore.model=adjcap-tiny-clip"],
    "eval.clipscore.pretrained": lambda w: [f"eval.clipscore.pretrained={w.copy(w.cfg.eval.clipscore.pretrained)}"],
    "eval.coco_instances": lambda w: [f"eval.coco_instances=[\"{w.root}/instances_val2014.json\"]"],
    "eval.java": lambda w: ["eval.java=/usr/bin/java-other"],
    "eval.java_mem": lambda w: ["eval.java_mem=2G"],
    "eval.spice_jars": lambda w: [f"eval.spice_jars={w.root}/jars"],
    "name": lambda w: ["name=another"],
    "paths.cache_dir": lambda w: [f"paths.cache_dir={_alias(w)}"],
    "paths.data_dir": lambda w: [f"paths.data_dir={w.root}/data"],
    "paths.runs_dir": lambda w: [f"paths.runs_dir={w.root}/other-runs"],
    "precision": lambda w: ["precision=bf16"],
    "ray.address": lambda w: ["ray.address=127.0.0.1:6390"],
    "ray.autoscaler_config": lambda w: [f"ray.autoscaler_config={w.root}/ray_bootstrap_config.yaml"],
    "ray.dashboard_host": lambda w: ["ray.dashboard_host=0.0.0.0"],
    "ray.include_dashboard": lambda w: ["ray.include_dashboard=false"],
    "ray.pool": lambda w: ["ray.pool.captioner.actors=3"],
    "retrieval.corpus": lambda w: ["retrieval.corpus=demo-alt"],
    "rerank.seeds": lambda w: ["rerank.seeds=[42, 43]"],
    "rerank.apply_split": lambda w: ["rerank.apply_split=val"],
    "rerank.fit_split": lambda w: ["rerank.fit_split=test"],
    "rerank.picker": lambda w: ["rerank.picker=lm"],
    "rerank.protocol": lambda w: ["rerank.protocol=transductive"],
    "retrieval.encoder.model": lambda w: ["retrieval.encoder.model=adjcap-tiny-clip"],
    "retrieval.encoder.pretrained": lambda w: [f"retrieval.encoder.pretrained={w.copy(w.cfg.retrieval.encoder.pretrained)}"],
    "retrieval.index_dir": lambda w: [f"retrieval.index_dir={_built_index(w)}"],
    "scorer.encoder.model": lambda w: ["scorer.encoder.model=adjcap-tiny-clip",
                                       f"scorer.encoder.pretrained={w.cfg.captioner.clip.pretrained}"],
    "scorer.encoder.pretrained": lambda w: [f"scorer.encoder.model={w.cfg.retrieval.encoder.model}",
                                            f"scorer.encoder.pretrained={w.copy(w.cfg.retrieval.encoder.pretrained)}"],
    "splits": lambda w: ['splits=["test"]'],
    # another family: the captioner's tiny CLIP as an open_clip judge (verifier.family = clip)
    "verifier.family": lambda w: [("verifier.family", "clip"), f"verifier.model={w.cfg.captioner.clip.model}",
                                  f"verifier.pretrained={w.cfg.captioner.clip.pretrained}"],
    "verifier.model": lambda w: [f"verifier.model={w.copy(w.cfg.verifier.model)}"],
    "verifier.pretrained": lambda w: ["verifier.pretrained=webli"],
    "verifier.tokenizer": lambda w: ["verifier.tokenizer=bert-base-cased"],
}


def _alias(w: World) -> str:
    alias = w.root / "alias-cache"
    if not alias.exists():
        alias.symlink_to(w.cache, target_is_directory=True)
    return str(alias)


def _field(key: str):
    """The pydantic field of a flat key (the run's benchmark as a BenchmarkCfg)."""
    model: typing.Any = Config
    parts = key.split(".")
    if parts[0] == "benchmarks":
        model, parts = BenchmarkCfg, parts[2:]
    info = None
    for p in parts:
        if info is not None:
            ann = info.annotation
            model = next((a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if model is None:
                return info
        info = model.model_fields[p]
    return info


def _derived(key: str, value: typing.Any) -> list[str] | None:
    """Another value from the setting's type, or None."""
    info = _field(key)
    ann = info.annotation if info is not None else type(value)
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    literal = next((a for a in (ann, *args) if typing.get_origin(a) is typing.Literal), None)
    if literal is not None:
        other = [c for c in typing.get_args(literal) if c != value]
        return [(key, other[-1])] if other else None
    if isinstance(value, bool) or ann is bool or bool in args:
        return [f"{key}={'false' if value else 'true'}"]
    if isinstance(value, int) or int in args:
        return [f"{key}={(value or 1) + 1}"]
    if isinstance(value, float) or float in args:
        return [f"{key}={round(value * 0.5 if value else 0.1, 6)}"]
    return None


def _keys(cfg: Config) -> dict[str, typing.Any]:
    return {k: v for k, v in config_view(cfg).items()
            if not k.startswith("benchmarks.") or k.startswith(f"benchmarks.{cfg.benchmark}.")}


@pytest.fixture(scope="module")
def world(demo_cfg, tmp_path_factory):
    return World(demo_cfg, tmp_path_factory.mktemp("identity-property"))


def test_every_setting_changes_the_identity_or_nothing(world):
    w = world
    base_ids = w.identities(w.cfg)
    base = w.outputs(w.cfg, len(STAGES))
    failures, checked = [], {}
    for key, value in sorted(_keys(w.cfg).items()):
        sets = ALTERNATIVES[key](w) if key in ALTERNATIVES else _derived(key, value)
        if sets is None:
            failures.append(f"{key}: no other value to try; add one to ALTERNATIVES")
            continue
        cfg = w.load(*sets)
        ids = w.identities(cfg)
        first = next((i for i, s in enumerate(STAGES) if ids[s] != base_ids[s]), len(STAGES))
        checked[key] = STAGES[first] if first < len(STAGES) else "none"
        if first == 0:
            continue  # every stage's identity changed
        got = w.outputs(cfg, first)
        for stage in STAGES[:first]:
            if got[stage] != base[stage]:
                failures.append(f"{key} ({str(sets)[:80]}) changes the {stage} output but not its identity")
                break
    assert not failures, "\n".join(failures)
    # the changes that must reach an identity do (the test above would also pass if nothing ran)
    assert checked["retrieval.index_dir"] == "none", checked
    assert checked["benchmarks.demo.corpus"] == "retrieve"
    assert checked["captioner.checkpoint"] == "none" and checked["captioner.beam_width"] == "caption"
    assert checked["verifier.keep"] == "verify" and checked["eval.clipscore.model"] == "score"
    assert checked["verifier.long_captions"] == "score", checked  # the candidates' judge, not stage 2's
    assert checked["captioner.batch_size"] == "none" and checked["captioner.compile"] == "none", checked
    assert checked["captioner.rows"] == "none" and checked["captioner.compile_cache"] == "none", checked
    assert checked["paths.cache_dir"] == "retrieve"  # the image root counts by its path (its files are the ids)
