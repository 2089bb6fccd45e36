"""Benchmark readers on real excerpts (tests/fixtures/data, see its README) and on broken files."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from adjcap.data import (
    DataError,
    References,
    coco_id_from_name,
    decode_image,
    detect_format,
    format_names,
    normalize_domain,
    read_benchmark,
    read_references,
    register_layout,
    split_annotations,
)
from adjcap.data.annotations import layout_of
from adjcap.data.layouts import LAYOUTS, check_format, dir_layout, get_layout

FIX = Path(__file__).parent / "fixtures" / "data"
COCO_IFCAP = FIX / "coco_test_captions.json"
COCO_GT = FIX / "coco_karpathy_test_gt.json"
COCO_LAVIS = FIX / "coco_karpathy_test.json"
FLICKR = FIX / "flickr30k_test_captions.json"
NOCAPS = FIX / "nocaps_corpus.json"
NOCAPS_IMAGES = FIX / "nocaps_val.json"
IMAGES = FIX / "images"
REAL_JPEGS = ["COCO_val2014_000000354533.jpg", "COCO_val2014_000000579664.jpg"]


def _json(path: Path):
    return json.loads(path.read_text())


def _write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture
def karpathy_file(tmp_path: Path) -> Path:
    """A Karpathy-format dataset_coco.json built from the IFCap excerpt: images 0-13 test, 14-17 val,
    18-20 train, 21-23 restval (filepath val2014, cocoid, sentences with raw + tokens)."""
    caps = _json(COCO_IFCAP)
    images = []
    for i, (name, refs) in enumerate(caps.items()):
        split = "test" if i < 14 else "val" if i < 18 else "train" if i < 21 else "restval"
        images.append(
            {
                "filepath": "val2014",
                "filename": name,
                "imgid": i,
                "split": split,
                "cocoid": coco_id_from_name(name),
                "sentids": list(range(5 * i, 5 * i + len(refs))),
                "sentences": [
                    {"raw": r, "tokens": r.lower().split(), "imgid": i, "sentid": 5 * i + j}
                    for j, r in enumerate(refs)
                ],
            }
        )
    return _write(tmp_path / "dataset_coco.json", {"images": images, "dataset": "coco"})


@pytest.fixture
def nocaps_official(tmp_path: Path) -> Path:
    """The official nocaps_val_4500_captions.json layout, built from the IFCap nocaps excerpt and the
    matching BLIP nocaps image list (Open Images ids; img_id k <-> IFCap's k.jpg)."""
    corpus = _json(NOCAPS)
    ims = {d["img_id"]: d["image"] for d in _json(NOCAPS_IMAGES)}
    images, anns = [], []
    for e in corpus:
        k = int(e["image_id"].split(".")[0])
        oid = ims[k].split("/")[-1].split(".")[0]
        images.append(
            {"id": k, "open_images_id": oid, "file_name": f"{oid}.jpg", "height": 500, "width": 500,
             "coco_url": f"https://s3.amazonaws.com/nocaps/val/{oid}.jpg",
             "domain": e["split"].replace("_", "-")}
        )
        for c in e["caption"]:
            anns.append({"image_id": k, "id": len(anns), "caption": c})
    return _write(tmp_path / "nocaps_val_4500_captions.json", {"licenses": [], "info": {}, "images": images, "annotations": anns})


# ---------------------------------------------------------------------------------------------
# Real excerpts
# ---------------------------------------------------------------------------------------------


def test_ifcap_coco_excerpt():
    recs = read_benchmark("ifcap", COCO_IFCAP, None, "test")
    assert len(recs) == 24
    assert sum(len(r.references) for r in recs) == 121
    r0 = recs[0]
    assert r0.image_id == "COCO_val2014_000000391895.jpg"
    assert r0.coco_id == 391895
    assert r0.image_path is None and r0.split == "test" and r0.domain is None
    assert r0.references[0] == "A man with a red helmet on a small moped on a dirt road. "  # raw, untouched
    assert Counter(len(r.references) for r in recs) == {5: 23, 6: 1}
    assert [r.image_id for r in recs] == list(_json(COCO_IFCAP))  # file order


def test_same_images_same_references_across_formats():
    ifcap = read_references(COCO_IFCAP)
    gt = read_references(COCO_GT)
    lavis = read_references(COCO_LAVIS)
    assert (ifcap.fmt, gt.fmt, lavis.fmt) == ("ifcap", "coco", "lavis")
    assert len(ifcap) == len(gt) == len(lavis) == 24
    # the COCO gt file has only numeric ids -> canonical ids are the numbers as strings
    assert "391895" in gt.captions and "COCO_val2014_000000391895.jpg" in ifcap.captions
    for cid, refs in ifcap.captions.items():
        assert gt.captions[gt.resolve(cid)] == refs
        assert lavis.captions[lavis.resolve(cid)] == refs
        assert ifcap.resolve(gt.resolve(cid)) == cid


def test_resolve_accepts_every_id_spelling():
    refs = read_references(COCO_IFCAP)
    cid = "COCO_val2014_000000391895.jpg"
    for spelling in [cid, 391895, "391895", "000000391895", "COCO_val2014_000000391895",
                     "val2014/COCO_val2014_000000391895.jpg", 391895.0]:
        assert refs.resolve(spelling) == cid, spelling
    for unknown in [1, "1", "nope.jpg", None, True, 3.5]:
        assert refs.resolve(unknown) is None
    import numpy as np

    assert refs.resolve(np.int64(391895)) == cid


def test_flickr30k_excerpt():
    recs = read_benchmark("auto", FLICKR, None, "test")
    assert len(recs) == 20 and all(len(r.references) == 5 for r in recs)
    assert recs[0].image_id == "1007129816.jpg" and recs[0].coco_id is None
    refs = read_references(FLICKR)
    assert refs.resolve(1007129816) == "1007129816.jpg"


def test_nocaps_ifcap_corpus_domains():
    recs = read_benchmark("nocaps", NOCAPS, None, "val")
    assert len(recs) == 24 and all(len(r.references) == 10 for r in recs)
    assert Counter(r.domain for r in recs) == {"near-domain": 12, "out-domain": 8, "in-domain": 4}
    assert recs[0].image_id == "0.jpg" and recs[0].domain == "in-domain"
    refs = read_references(NOCAPS, "ifcap")
    assert refs.domains is not None and refs.domains["1.jpg"] == "near-domain"
    assert refs.resolve(0) == "0.jpg" and refs.resolve("23") == "23.jpg"


def test_nocaps_official_layout_matches_ifcap_corpus(nocaps_official: Path):
    assert detect_format(nocaps_official) == "nocaps"
    off = read_references(nocaps_official, "nocaps")
    ifc = read_references(NOCAPS, "nocaps")
    assert len(off) == len(ifc) == 24
    first_oid = _json(NOCAPS_IMAGES)[0]["image"].split("/")[-1]
    assert off.ids[0] == first_oid
    for k in range(24):
        a, b = off.resolve(k), ifc.resolve(k)  # predictions keyed by the numeric nocaps id
        assert off.captions[a] == ifc.captions[b]
        assert off.domains[a] == ifc.domains[b]
    # open images id also resolves
    assert off.resolve(first_oid.split(".")[0]) == first_oid


def test_karpathy_splits(karpathy_file: Path):
    assert detect_format(karpathy_file) == "karpathy"
    test = read_benchmark("karpathy", karpathy_file, None, "test")
    val = read_benchmark("karpathy", karpathy_file, None, "val")
    train = read_benchmark("karpathy", karpathy_file, None, "train")  # train + restval
    assert (len(test), len(val), len(train)) == (14, 4, 6)
    ifcap = read_references(COCO_IFCAP)
    for r in test + val + train:
        assert list(r.references) == ifcap.captions[r.image_id]
        assert r.coco_id == coco_id_from_name(r.image_id)
    kref = read_references(karpathy_file, "karpathy", split="test")
    assert kref.resolve(391895) == "COCO_val2014_000000391895.jpg"
    assert kref.resolve("val2014/COCO_val2014_000000391895.jpg") == "COCO_val2014_000000391895.jpg"


def test_karpathy_split_errors(karpathy_file: Path):
    with pytest.raises(DataError, match=r"--split"):
        read_references(karpathy_file)
    with pytest.raises(DataError, match=r"no images in split 'testing'.*restval \(3\).*test \(14\)"):
        read_benchmark("karpathy", karpathy_file, None, "testing")


def test_karpathy_image_paths_with_and_without_filepath(tmp_path: Path, karpathy_file: Path):
    coco = tmp_path / "coco"
    (coco / "val2014").mkdir(parents=True)
    for n in REAL_JPEGS:
        shutil.copy(IMAGES / n, coco / "val2014" / n)
    caps = _json(karpathy_file)
    caps["images"] = [im for im in caps["images"] if im["filename"] in REAL_JPEGS]
    for im in caps["images"]:
        im["split"] = "test"
    small = _write(tmp_path / "small_karpathy.json", caps)
    for root in (coco, coco / "val2014"):  # <root>/<filepath>/<filename> or <root>/<filename>
        recs = read_benchmark("karpathy", small, root, "test")
        assert [Path(r.image_path).name for r in recs] == [im["filename"] for im in caps["images"]]
        assert all(Path(r.image_path).is_file() for r in recs)


def test_real_images_decode_through_records(tmp_path: Path):
    caps = _json(COCO_IFCAP)
    small = _write(tmp_path / "test_captions.json", {k: caps[k] for k in REAL_JPEGS})
    recs = read_benchmark("ifcap", small, IMAGES, "test")
    assert [r.coco_id for r in recs] == [354533, 579664]
    for r in recs:
        d = decode_image(r.image_path)
        assert d.ok and d.image.mode == "RGB" and d.width > 100 and d.height > 100


def test_coco_numeric_ids_find_images_by_number(tmp_path: Path):
    recs = read_benchmark("coco", COCO_GT, IMAGES, "test", check_images=False)
    by_id = {r.coco_id: r for r in recs}
    assert len(recs) == 24
    assert Path(by_id[354533].image_path).name == "COCO_val2014_000000354533.jpg"
    assert by_id[391895].image_path is None  # not in the folder and not checked
    with pytest.raises(DataError, match=r"22 of 24 images"):
        read_benchmark("coco", COCO_GT, IMAGES, "test")


def test_lavis_list_under_coco_format():
    recs = read_benchmark("coco", COCO_LAVIS, None, "test")
    assert recs[0].image_id == "COCO_val2014_000000391895.jpg" and len(recs) == 24


def test_ifcap_annotation_directory(tmp_path: Path):
    d = tmp_path / "annotations" / "coco"
    d.mkdir(parents=True)
    shutil.copy(COCO_IFCAP, d / "test_captions.json")
    assert detect_format(d) == "ifcap"
    assert len(read_benchmark("ifcap", d, None, "test")) == 24
    with pytest.raises(DataError, match=r"no val_captions\.json.*test_captions\.json"):
        read_benchmark("ifcap", d, None, "val")


def test_limit():
    assert [r.image_id for r in read_benchmark("ifcap", COCO_IFCAP, None, "test", limit=3)] == list(
        _json(COCO_IFCAP)
    )[:3]
    for bad in (0, -2):
        with pytest.raises(DataError, match=rf"limit must be a positive number of images, got {bad}"):
            read_benchmark("ifcap", COCO_IFCAP, None, "test", limit=bad)


def test_folder_format(tmp_path: Path):
    root = tmp_path / "mine"
    (root / "sub").mkdir(parents=True)
    shutil.copy(IMAGES / REAL_JPEGS[0], root / "b.jpg")
    shutil.copy(IMAGES / REAL_JPEGS[1], root / "sub" / "a.JPG")
    (root / "notes.txt").write_text("not an image")
    (root / ".hidden.png").write_bytes(b"")
    assert detect_format(root) == "folder"
    recs = read_benchmark("folder", root, None, "test")
    assert [r.image_id for r in recs] == ["b.jpg", "sub/a.JPG"]
    assert all(r.references == () and Path(r.image_path).is_file() for r in recs)
    assert [r.image_id for r in read_benchmark("auto", root, root, "test")] == ["b.jpg", "sub/a.JPG"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no image files"):
        read_benchmark("folder", empty, None, "test")
    with pytest.raises(DataError, match="no reference captions"):
        read_references(root, "folder")


def test_normalize_domain():
    assert normalize_domain("in_domain") == "in-domain"
    assert normalize_domain("Near-Domain") == "near-domain"
    assert normalize_domain("out") == "out-domain"
    assert normalize_domain("overall") is None


def test_from_records_roundtrip():
    recs = read_benchmark("nocaps", NOCAPS, None, "val")
    refs = References.from_records(recs)
    assert refs.captions == read_references(NOCAPS).captions
    assert refs.domains["0.jpg"] == "in-domain" and refs.resolve(5) == "5.jpg"
    sub = refs.subset(["1.jpg", "2.jpg"])
    assert sub.ids == ["1.jpg", "2.jpg"] and sub.resolve(1) == "1.jpg" and sub.resolve(3) is None


# ---------------------------------------------------------------------------------------------
# Broken input: DataError naming the file, the offenders and their count
# ---------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path):
    missing = tmp_path / "nope" / "test_captions.json"
    with pytest.raises(DataError, match=r"test_captions\.json: file not found.*--set benchmarks"):
        read_benchmark("ifcap", missing, None, "test")
    with pytest.raises(DataError, match="file not found"):
        read_references(missing)
    with pytest.raises(DataError, match="file not found"):
        detect_format(missing)


@pytest.mark.parametrize(
    "content, pattern",
    [
        (b"", "the file is empty"),
        (b'{"COCO_val2014_000000391895.jpg": ["A man', "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"42", "top-level JSON int"),
        (b"[]", "JSON list is empty"),
        (b"{}", "JSON object is empty"),
        (b'{"a.jpg": 3, "b.jpg": 4}', "unrecognised annotation layout"),
        (b"[1, 2, 3]", "unrecognised annotation layout"),
        (b'{"images": [{"file_name": "x.jpg"}]}', "neither 'annotations'"),
        (b'[{"image_id": 1, "caption": "a dog"}]', "predictions"),
        (b'[{"image_name": "x.jpg", "captions": ["a"], "prediction": "b"}]', "generated captions"),
        (b'[{"image": "val/x.jpg", "img_id": 0}]', "without 'caption'"),
    ],
)
def test_bad_files(tmp_path: Path, content: bytes, pattern: str):
    bad = tmp_path / "bad_captions.json"
    bad.write_bytes(content)
    with pytest.raises(DataError, match=pattern) as ei:
        read_benchmark("auto", bad, None, "test")
    assert str(bad) in str(ei.value)
    with pytest.raises(DataError, match=pattern):
        read_references(bad)


def test_format_mismatch_says_which_format_it_is(tmp_path: Path):
    with pytest.raises(DataError, match=r"IFCap/ViECap.*Pass --format ifcap"):
        read_benchmark("karpathy", COCO_IFCAP, None, "test")
    with pytest.raises(DataError, match=r"format 'coco'"):
        read_references(COCO_GT, "nocaps")
    with pytest.raises(DataError, match=r"unknown benchmark format 'cocoa'; did you mean 'coco'\?"):
        read_benchmark("cocoa", COCO_IFCAP, None, "test")


def test_empty_references_list_offenders_and_count(tmp_path: Path):
    caps = _json(COCO_IFCAP)
    keys = list(caps)
    for k in keys[:8]:
        caps[k] = [] if k != keys[3] else ["   ", ""]  # blank captions count as none
    bad = _write(tmp_path / "test_captions.json", caps)
    with pytest.raises(DataError) as ei:
        read_benchmark("ifcap", bad, None, "test")
    msg = str(ei.value)
    assert str(bad) in msg and "no reference captions" in msg
    assert keys[0] in msg and keys[4] in msg and keys[5] not in msg  # first five named
    assert "and 3 more (8 in all)" in msg
    assert "remove these images" in msg
    # only the images actually returned are validated: a broken last entry does not stop limit=5
    caps = _json(COCO_IFCAP)
    caps[keys[-1]] = []
    tail_bad = _write(tmp_path / "tail_captions.json", caps)
    assert len(read_benchmark("ifcap", tail_bad, None, "test", limit=5)) == 5
    with pytest.raises(DataError, match=r"\(1 in all\)"):
        read_benchmark("ifcap", tail_bad, None, "test")


def test_wrong_caption_types(tmp_path: Path):
    bad = _write(tmp_path / "t.json", {"a.jpg": ["ok"], "b.jpg": "a string", "c.jpg": [1, 2]})
    with pytest.raises(DataError, match=r"list of strings.*'b\.jpg', 'c\.jpg' \(2 in all\)"):
        read_references(bad)


def test_nocaps_bad_domain_and_duplicates(tmp_path: Path):
    corpus = _json(NOCAPS)
    corpus[2]["split"] = "far_domain"
    bad = _write(tmp_path / "nocaps_corpus.json", corpus)
    with pytest.raises(DataError, match=r"in_domain/near_domain/out_domain.*2\.jpg: 'far_domain'.*\(1 in all\)"):
        read_references(bad)
    corpus = _json(NOCAPS)
    dup = _write(tmp_path / "dup.json", corpus + corpus[:2])
    with pytest.raises(DataError, match=r"more than once.*'0\.jpg', '1\.jpg' \(2 in all\)"):
        read_references(dup)


def test_coco_orphan_annotations_and_imageless_annotations(tmp_path: Path):
    gt = _json(COCO_GT)
    gt["annotations"].append({"image_id": 999999999, "caption": "orphan", "id": 1})
    bad = _write(tmp_path / "gt.json", gt)
    with pytest.raises(DataError, match=r"missing from 'images'.*999999999"):
        read_references(bad)
    gt = _json(COCO_GT)
    gt["annotations"] = [a for a in gt["annotations"] if a["image_id"] != 391895]
    bad = _write(tmp_path / "gt2.json", gt)
    with pytest.raises(DataError, match=r"no reference captions: '391895' \(1 in all\)"):
        read_references(bad)
    gt = _json(COCO_GT)
    gt["annotations"][0] = {"image": 1}
    bad = _write(tmp_path / "gt3.json", gt)
    with pytest.raises(DataError, match=r"without 'image_id' and 'caption'.*'0' \(1 in all\)"):
        read_references(bad)


def test_missing_images_listed(tmp_path: Path):
    with pytest.raises(DataError) as ei:
        read_benchmark("ifcap", COCO_IFCAP, IMAGES, "test")
    msg = str(ei.value)
    assert "22 of 24 images" in msg and str(COCO_IFCAP) in msg and str(IMAGES) in msg
    assert "COCO_val2014_000000391895.jpg" in msg and "(22 in all)" in msg
    assert "--set benchmarks.<name>.images=DIR" in msg
    recs = read_benchmark("ifcap", COCO_IFCAP, IMAGES, "test", check_images=False)
    assert len(recs) == 24 and all(r.image_path is not None for r in recs)
    with pytest.raises(DataError, match="image folder not found"):
        read_benchmark("ifcap", COCO_IFCAP, tmp_path / "no-such-dir", "test")


# ---------------------------------------------------------------------------------------------
# The layout registry: every layout is sniffed from its own content; errors list the known names
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def layout_samples(tmp_path: Path, karpathy_file: Path, nocaps_official: Path) -> dict[str, Path]:
    """One real-excerpt sample per registered layout."""
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(IMAGES / REAL_JPEGS[0], folder / "x.jpg")
    return {
        "karpathy": karpathy_file,
        "ifcap": COCO_IFCAP,
        "ifcap_nocaps": NOCAPS,
        "nocaps_official": nocaps_official,
        "coco": COCO_GT,
        "lavis": COCO_LAVIS,
        "folder": folder,
    }


def test_every_registered_layout_is_sniffed_from_its_content(layout_samples: dict[str, Path]):
    assert set(layout_samples) == set(LAYOUTS)  # a new layout needs a sample here
    for name, path in layout_samples.items():
        lay = get_layout(name)
        if lay.reads == "dir":
            assert dir_layout(path) is lay
        else:
            obj = json.loads(path.read_text())
            hits = [other.name for other in LAYOUTS.values() if other.reads == "json" and other.sniff(obj)]
            assert hits == [name], (name, hits)  # sniffers are mutually exclusive
            assert layout_of(obj, path) is lay
        assert detect_format(path) == lay.format
        split = "test" if name in ("karpathy", "folder", "ifcap") else "val"
        recs = read_benchmark(lay.format, path, None, split)
        assert recs and all(r.split == split for r in recs)
        assert read_benchmark("auto", path, None, split) == recs


def test_formats_come_from_the_registry():
    assert format_names() == ("coco", "folder", "ifcap", "karpathy", "lavis", "nocaps", "auto")
    assert get_layout("nocaps_official").read_as("coco") and not get_layout("coco").read_as("nocaps")


def test_registry_errors_list_known_names():
    with pytest.raises(DataError) as ei:
        check_format("karpaty")
    msg = str(ei.value)
    assert "unknown benchmark format 'karpaty'; did you mean 'karpathy'?" in msg
    assert "(known: coco, folder, ifcap, karpathy, lavis, nocaps, auto)" in msg
    with pytest.raises(DataError, match=r"unknown annotation layout 'lavs'; did you mean 'lavis'\? \(known: coco, folder"):
        get_layout("lavs")
    with pytest.raises(DataError, match=r"unknown benchmark format 'xyzzy' \(known: coco"):
        check_format("xyzzy")
    with pytest.raises(ValueError, match="already registered"):
        register_layout("coco", format="coco", description="again", sniff=lambda obj: False)(lambda o, p, s: [])
    assert get_layout("coco").description == "a COCO captions annotation file"


def test_benchmark_config_format_checked_against_the_registry():
    from pydantic import ValidationError

    from adjcap.config import BenchmarkCfg, Config

    ok = BenchmarkCfg(format="lavis", annotations="a.json", images="img")
    assert ok.format == "lavis"
    with pytest.raises(ValidationError, match=r"did you mean 'nocaps'.*known: coco, folder"):
        BenchmarkCfg(format="nocap", annotations="a.json", images="img")
    with pytest.raises(ValidationError, match="greater than 0"):
        Config(limit=0)


# ---------------------------------------------------------------------------------------------
# Splits: a split the benchmark does not list is an error, never another split's file
# ---------------------------------------------------------------------------------------------


def test_unknown_split_is_an_error_naming_the_known_ones():
    from adjcap.config import BenchmarkCfg

    b = BenchmarkCfg(
        format="ifcap", annotations="t.json", images="img", annotations_by_split={"test": "t.json", "val": "v.json"}
    )
    assert split_annotations(b, "val", "coco") == "v.json"
    assert split_annotations(b, "test", "coco") == "t.json"
    with pytest.raises(DataError) as ei:
        split_annotations(b, "train", "coco")
    msg = str(ei.value)
    assert "benchmark 'coco' has no split 'train'; its splits: test, val" in msg
    assert "benchmarks.coco.annotations_by_split.train=FILE" in msg
    one = BenchmarkCfg(format="karpathy", annotations="dataset_coco.json", images="img")
    assert split_annotations(one, "restval", "k") == "dataset_coco.json"  # the file itself holds the splits


# ---------------------------------------------------------------------------------------------
# Image paths stay inside the image root
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def rooted(tmp_path: Path) -> tuple[Path, Path]:
    """(image root holding ok.jpg, a real JPEG outside the root)."""
    root = tmp_path / "root" / "images"
    root.mkdir(parents=True)
    shutil.copy(IMAGES / REAL_JPEGS[0], root / "ok.jpg")
    outside = tmp_path / "secret.jpg"
    shutil.copy(IMAGES / REAL_JPEGS[1], outside)
    return root, outside


def test_annotation_keys_cannot_leave_the_image_root(tmp_path: Path, rooted: tuple[Path, Path]):
    root, outside = rooted
    caps = {"ok.jpg": ["a dog"], "../../secret.jpg": ["a cat"], str(outside): ["a cow"], "sub/../../../secret.jpg": ["x"]}
    ann = _write(tmp_path / "test_captions.json", caps)
    recs = read_benchmark("ifcap", ann, root, "test")  # check_images: escaping keys are rows, not a refusal
    by = {r.image_id: r for r in recs}
    assert by["ok.jpg"].error is None and by["ok.jpg"].image_path == str(root / "ok.jpg")
    for key in list(caps)[1:]:
        assert by[key].image_path is None, key
        assert by[key].error.startswith("image path escapes the image root"), key
    # the LAVIS list's fallback to the bare file name does not rescue a climbing key
    lavis = _write(tmp_path / "lavis.json", [{"image": "../../secret.jpg", "caption": "a cat"}])
    (root / "secret.jpg").write_bytes((IMAGES / REAL_JPEGS[0]).read_bytes())
    (rec,) = read_benchmark("lavis", lavis, root, "test")
    assert rec.image_path is None and "escapes the image root" in rec.error


def test_symlinks_out_of_the_root_are_refused(tmp_path: Path, rooted: tuple[Path, Path]):
    root, outside = rooted
    (root / "link-out.jpg").symlink_to(outside)
    (root / "link-in.jpg").symlink_to(root / "ok.jpg")
    (root / "dir-out").symlink_to(outside.parent, target_is_directory=True)
    caps = {"link-out.jpg": ["a"], "link-in.jpg": ["b"], "dir-out/secret.jpg": ["c"]}
    recs = {r.image_id: r for r in read_benchmark("ifcap", _write(tmp_path / "t.json", caps), root, "test")}
    assert recs["link-in.jpg"].error is None and Path(recs["link-in.jpg"].image_path).is_file()
    for key in ("link-out.jpg", "dir-out/secret.jpg"):
        assert recs[key].image_path is None
        assert "escapes the image root" in recs[key].error and str(outside) in recs[key].error
    folder = {r.image_id: r for r in read_benchmark("folder", root, None, "test")}
    assert sorted(folder) == ["link-in.jpg", "link-out.jpg", "ok.jpg"]  # symlinked dirs are not walked
    assert folder["link-out.jpg"].image_path is None and "escapes the image root" in folder["link-out.jpg"].error
    assert folder["link-in.jpg"].error is None and folder["ok.jpg"].error is None


def test_image_root_itself_may_be_a_symlink(tmp_path: Path, rooted: tuple[Path, Path]):
    root, _ = rooted
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    (rec,) = read_benchmark("ifcap", _write(tmp_path / "t.json", {"ok.jpg": ["a"]}), alias, "test")
    assert rec.error is None and rec.image_path == str(alias / "ok.jpg")


# ---------------------------------------------------------------------------------------------
# The folder benchmark: odd files become per-image errors, never a refusal to start
# ---------------------------------------------------------------------------------------------


def _decode_within(path: str, seconds: float = 10.0):
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(decode_image(path)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"decoding {path} blocked for {seconds}s"
    return out[0]


def test_folder_with_dangling_symlink_fifo_and_unreadable_file(tmp_path: Path):
    import os

    root = tmp_path / "mine"
    root.mkdir()
    shutil.copy(IMAGES / REAL_JPEGS[0], root / "good.jpg")
    (root / "dangling.jpg").symlink_to(root / "gone.jpg")
    os.mkfifo(root / "pipe.jpg")
    locked = root / "locked.jpg"
    shutil.copy(IMAGES / REAL_JPEGS[1], locked)
    locked.chmod(0)
    try:
        recs = {r.image_id: r for r in read_benchmark("folder", root, None, "test")}
        assert sorted(recs) == ["dangling.jpg", "good.jpg", "locked.jpg", "pipe.jpg"]
        assert all(r.error is None and r.image_path for r in recs.values())
        assert _decode_within(recs["good.jpg"].image_path).ok
        assert "file not found" in _decode_within(recs["dangling.jpg"].image_path).error
        assert "not a file (a FIFO)" in _decode_within(recs["pipe.jpg"].image_path).error
        d = _decode_within(recs["locked.jpg"].image_path)
        if os.geteuid() == 0:  # root reads mode-000 files
            assert d.ok
        else:
            assert "permission denied" in d.error
        # the same files listed by an annotation file: present (so not "missing"), errors at decode
        caps = {k: ["a caption"] for k in recs}
        listed = read_benchmark("ifcap", _write(tmp_path / "t.json", caps), root, "test")
        assert [r.image_path for r in listed] == [str(root / k) for k in caps]
    finally:
        locked.chmod(0o644)
