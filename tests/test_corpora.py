"""Other caption corpora for retrieval: the registry, `adjcap prepare corpus-cc3m` / `corpus-laion-coco`
against a local mirror on 127.0.0.1 (the published layouts, small: a caption<TAB>url TSV, parquet shards
with a top_caption column), `--max-captions` sampling with the seed the manifest and the index record,
`--dry-run`, a cut download resumed, refused files; `retrieval.corpus` swapping what a run searches and the
exposure (size, verbatim reference overlap) it reports; the demo world's second corpus."""

import hashlib
import io
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from adjcap.cli import app
from adjcap.config import ConfigError, load_config
from adjcap.data.corpora import SAMPLE_SEED, corpora, exposure, get_corpus, match_key, read_manifest, reference_overlap
from adjcap.data.corpus import load_corpus
from adjcap.demo.world import COLOURS, OBJECTS
from adjcap.prepare import PrepareError, run
from test_prepare import Server, opts, quiet

CC3M_PATH = "/storage.googleapis.com/gcc-data/Train/GCC-training.tsv"
LAION = "/huggingface.co/datasets/laion/laion-coco/resolve/main/part-{:05d}-2256f782-126f-4dc6-b9c6-e6757637749d-c000.snappy.parquet"
N_ROWS = 40


def cc3m_tsv() -> bytes:
    rows = [f"actor attends the premiere of the film number {i}\thttp://img.example/{i}.jpg" for i in range(N_ROWS)]
    return ("\n".join(rows) + "\n").encode()


def laion_shard(k: int) -> bytes:
    buf = io.BytesIO()
    n = 10
    pq.write_table(pa.table({"URL": [f"http://x/{k}-{i}.jpg" for i in range(n)],
                             "top_caption": [f"a photo of shard {k} image {i}" for i in range(n)],
                             "all_captions": [[f"cap {i}", f"other {i}"] for i in range(n)]}), buf)
    return buf.getvalue()


@pytest.fixture
def mirror():
    with Server() as s:
        s.state.files.update({CC3M_PATH: cc3m_tsv(), LAION.format(0): laion_shard(0), LAION.format(1): laion_shard(1)})
        yield s


@pytest.fixture
def sources(tmp_path):
    p = tmp_path / "sources.toml"
    p.write_text(f"[corpus_cc3m]\nexpect_rows = {N_ROWS}\n[corpus_laion_coco]\nshards = [0, 1]\n")
    return p


def test_the_registry_names_each_corpus_once_with_a_reader_and_a_licence():
    names = list(corpora())
    assert names == ["cc3m", "laion-coco", "demo-alt"]
    for c in corpora().values():
        assert c.licence and c.title and c.captions.endswith(".txt")
    with pytest.raises(ValueError, match="did you mean 'cc3m'"):
        get_corpus("cc3")
    with pytest.raises(ConfigError, match="cc3"):
        load_config("demo", ["retrieval.corpus=cc3"])


def test_dry_run_names_the_url_the_size_and_where_it_goes(tmp_path, mirror, sources):
    data = tmp_path / "data"
    lines: list[str] = []
    run(["corpus-cc3m"], opts(data, sources, mirror, dry_run=True), say=quiet(lines))
    text = "\n".join(lines)
    assert f"{mirror.url}{CC3M_PATH}" in text and str(data / "corpora/cc3m/captions.txt") in text
    from adjcap.prepare.download_progress import human_bytes

    assert f" {human_bytes(len(cc3m_tsv()))} " in lines[0] and "~" not in lines[0]  # the server's size (HEAD)
    assert not data.exists() and not [m for m, _, _ in mirror.state.log if m == "GET"]
    # offline: the published estimate, marked as one
    lines.clear()
    run(["corpus-cc3m"], opts(data, sources, None, dry_run=True), say=quiet(lines))
    assert "https://storage.googleapis.com/gcc-data/Train/GCC-training.tsv" in lines[0] and "~" in lines[0]


def test_cc3m_sampled_resumed_recorded_and_verified(tmp_path, mirror, sources):
    data = tmp_path / "data"
    mirror.state.drop_once.add(CC3M_PATH)  # the first GET is cut halfway: the next one resumes it
    run(["corpus-cc3m"], opts(data, sources, mirror, max_captions=12), say=quiet())
    assert [r for r in mirror.state.gets(CC3M_PATH) if r] and len(mirror.state.gets(CC3M_PATH)) == 2
    final = data / "corpora/cc3m/captions.txt"
    lines = final.read_text().splitlines()
    everything = [c.split("\t")[0] for c in cc3m_tsv().decode().splitlines()]
    keep = sorted(random.Random(SAMPLE_SEED).sample(range(N_ROWS), 12))
    assert lines == [everything[i] for i in keep]  # the seeded sample, in file order
    man = read_manifest(final)
    assert man["sample"] == {"max_captions": 12, "seed": SAMPLE_SEED} and man["source_captions"] == N_ROWS
    assert man["sources"][0]["sha256"] == hashlib.sha256(cc3m_tsv()).hexdigest()
    assert "Google" in man["licence"]
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert lock["files"]["corpora/cc3m/captions.txt"]["sha256"] == hashlib.sha256(final.read_bytes()).hexdigest()
    assert not list((data / ".prepare").rglob("*.tsv")) if (data / ".prepare").exists() else True
    # again with the same sample: present, nothing fetched; another sample size: done again
    n_gets = len(mirror.state.gets(CC3M_PATH))
    run(["corpus-cc3m"], opts(data, sources, mirror, max_captions=12), say=quiet())
    assert len(mirror.state.gets(CC3M_PATH)) == n_gets
    run(["corpus-cc3m"], opts(data, sources, mirror), say=quiet())
    assert len(final.read_text().splitlines()) == N_ROWS and read_manifest(final)["sample"]["max_captions"] is None
    run([], opts(data, sources, mirror), verify=True, say=quiet())
    final.write_text("altered\n")
    with pytest.raises(PrepareError, match="captions.txt"):
        run(["corpus-cc3m"], opts(data, sources, mirror), verify=True, say=quiet())


def test_a_file_that_is_not_the_published_layout_is_refused_and_not_trusted(tmp_path, mirror, sources):
    data = tmp_path / "data"
    mirror.state.files[CC3M_PATH] = b"just a caption without its url\n"
    with pytest.raises(PrepareError, match="caption<TAB>url"):
        run(["corpus-cc3m"], opts(data, sources, mirror), say=quiet())
    assert not (data / "corpora/cc3m/captions.txt").exists()
    lock = data / "prepare.lock.json"
    assert not lock.exists() or CC3M_PATH.split("/", 2)[2] not in lock.read_text()
    mirror.state.files[CC3M_PATH] = cc3m_tsv()[: len(cc3m_tsv()) // 2].rsplit(b"\n", 1)[0] + b"\n"
    with pytest.raises(PrepareError, match=f"the published file has {N_ROWS}"):
        run(["corpus-cc3m"], opts(data, sources, mirror), say=quiet())


def test_laion_coco_reads_the_top_caption_of_every_shard(tmp_path, mirror, sources):
    data = tmp_path / "data"
    res = CliRunner().invoke(app, ["prepare", "corpus-laion-coco", "--data", str(data), "--sources", str(sources),
                                   "--mirror", mirror.url, "--max-captions", "15"])
    assert res.exit_code == 0, res.output
    final = data / "corpora/laion-coco/captions.txt"
    lines = final.read_text().splitlines()
    everything = [f"a photo of shard {k} image {i}" for k in (0, 1) for i in range(10)]
    keep = sorted(random.Random(SAMPLE_SEED).sample(range(20), 15))
    assert lines == [everything[i] for i in keep]
    man = read_manifest(final)
    assert [s["url"] for s in man["sources"]] == [f"https://huggingface.co{LAION.format(k).split('huggingface.co', 1)[1]}"
                                                  for k in (0, 1)]
    assert man["captions"] == 15 and "CC-BY" in man["licence"]


def test_retrieval_corpus_swaps_what_a_run_searches(demo_cfg, tmp_path):
    """retrieval.corpus = demo-alt: the benchmark's corpus becomes the registered file (lines), the retrieve
    stage's identity changes, the index built for it records the corpus's manifest, and its exposure is
    its size and the references it holds verbatim."""
    from adjcap.engine.identity import stage_identities
    from adjcap.index.lifecycle import encode_shards_in_process, ensure_index, search_corpus
    from adjcap.index.shards import IndexManifest
    from adjcap.engine.run_plan import read_records
    from adjcap.models import roles

    base = demo_cfg.resolved()
    alt = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "retrieval.corpus=demo-alt"]).resolved()
    assert alt.benchmark_cfg().corpus.endswith("demo/annotations/alt_captions.txt")
    assert alt.benchmark_cfg().corpus_format == "lines" and "retrieval" in alt.to_toml()
    own = search_corpus(base.retrieval, base.benchmark_cfg(), "demo", base.paths.cache_dir)
    other = search_corpus(alt.retrieval, alt.benchmark_cfg(), "demo", alt.paths.cache_dir)
    assert other.texts[:3] != own.texts[:3] and (len(own), len(other)) == (3000, 2000)
    ids, ids_alt = stage_identities(base, own.fingerprint), stage_identities(alt, other.fingerprint)
    assert all(ids[s] != ids_alt[s] for s in ids)
    # a prepared corpus's manifest goes into its index's manifest (here: one written beside a copy)
    lines = tmp_path / "corpora" / "captions.txt"
    lines.parent.mkdir()
    lines.write_text("\n".join(other.texts[:40]) + "\n")
    (tmp_path / "corpora" / "captions.manifest.json").write_text(json.dumps(
        {"corpus": "demo-alt", "sample": {"max_captions": 40, "seed": SAMPLE_SEED}}))
    small = load_corpus(lines, "lines")
    enc = roles.load_retrieval_encoder(alt.retrieval.encoder, "cpu")
    own_dir = alt.retrieval.model_copy(update={"index_dir": str(tmp_path / "index")})
    out = ensure_index(own_dir, alt.paths.cache_dir, small, encode_shards_in_process(enc), corpus_format="lines")
    assert IndexManifest.read(out).extra["corpus_manifest"]["sample"] == {"max_captions": 40, "seed": SAMPLE_SEED}
    # exposure: the demo's own corpus holds none of the test references verbatim (other scenes), and
    # a corpus holding some says how many
    records = read_records(base)
    refs = {r.image_id: list(r.references) for r in records["test"]}
    seen = exposure(other, "demo-alt", {"test": refs, "none": {}})
    assert seen["captions"] == 2000 and seen["name"] == "demo-alt" and list(seen["overlap"]) == ["test"]
    assert seen["overlap"]["test"]["in_corpus"] == 0
    planted = list(other.texts) + [refs[next(iter(refs))][0].upper() + "  "]
    ov = reference_overlap(planted, refs)
    assert ov["in_corpus"] >= 1 and ov["images_with_one"] >= 1 and ov["references"] == sum(map(len, refs.values()))
    assert match_key("A red Ball.") == match_key("a red  ball")
    assert exposure(small, "demo-alt", {"test": refs})["sample"]["max_captions"] == 40


def test_the_demo_worlds_second_corpus_is_another_style(demo_cfg):
    cfg = demo_cfg.resolved()
    own = load_corpus(cfg.benchmark_cfg().corpus, "ifcap").texts
    alt = load_corpus(get_corpus("demo-alt").path(cfg.paths.data_dir, cfg.paths.cache_dir), "lines").texts
    words = lambda texts: {w.strip(".,:").lower() for t in texts for w in t.split()}
    content = set(COLOURS) | {w for kind, (plural, _, _) in OBJECTS.items() for w in (*kind.split(), *plural.split())}
    assert content <= words(own) and not content & words(alt)  # other words for every colour and object
    assert len(words(own) & words(alt)) < 0.4 * len(words(alt)), sorted(words(own) & words(alt))
    assert not {match_key(t) for t in own} & {match_key(t) for t in alt}  # no caption in common
