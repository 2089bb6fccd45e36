"""Content ids (adjcap.storage.content_ids): whole files, streamed, remembered by path, size, mtime, ctime and
inode in a persistent store; a same-length edit anywhere in a file over 64 MiB changes its id and what
depends on it (issue 47 item 1)."""

import hashlib
import json
import os

import pytest

from adjcap.storage import content_ids
from adjcap.storage.content_ids import MIB, file_content_id, sampled_id

BIG = 65 * MIB  # over the 64 MiB the ids used to sample above
OLD_TEXT, NEW_TEXT = b"a red circle", b"a red square"  # same length


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """A persistent store of the test's own, an empty in-process memo, and a count of whole-file reads."""
    monkeypatch.setenv("ADJCAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(content_ids, "_MEMO", {})
    reads: list[str] = []
    real = content_ids.whole_file_sha256

    def counting(path):
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(content_ids, "whole_file_sha256", counting)
    return reads


def _aged(p):
    """Set the file's mtime an hour back: old enough to be remembered (not modified "just now")."""
    t = p.stat().st_mtime - 3600
    os.utime(p, (t, t))
    return p


def _big_lines(p, edit_at: int):
    """A >64 MiB text file of repeated lines with OLD_TEXT at byte ``edit_at``; returns its path."""
    line = b"a caption line of the generated corpus\n"
    body = bytearray(line * (BIG // len(line) + 1))
    body[edit_at:edit_at + len(OLD_TEXT)] = OLD_TEXT
    p.write_bytes(bytes(body))
    return p


def _edit(p, at: int):
    with open(p, "r+b") as f:
        f.seek(at)
        f.write(NEW_TEXT)


def test_a_small_file_keeps_its_whole_file_id(tmp_path, store):
    p = tmp_path / "refs.json"
    p.write_bytes(b'{"a": ["a red circle."]}\n' * 1000)
    data = p.read_bytes()
    # the format every id of a file up to 64 MiB had: size and the sha256 of the whole file
    assert file_content_id(p) == f"{len(data)}-{hashlib.sha256(data).hexdigest()[:16]}"


def test_a_same_length_edit_the_old_sampling_skipped_changes_the_id(tmp_path, store):
    at = 20 * MIB + 7  # outside the first, middle and last MiB
    p = _big_lines(tmp_path / "corpus.txt", at)
    before, old_before = file_content_id(p), sampled_id(p, p.stat().st_size)
    _edit(p, at)
    after = file_content_id(p)
    assert sampled_id(p, p.stat().st_size) == old_before  # what the old id could not see
    assert after != before
    data = p.read_bytes()
    assert after == f"{len(data)}-{hashlib.sha256(data).hexdigest()[:16]}"


def test_the_second_hash_of_an_unchanged_file_comes_from_the_store(tmp_path, store):
    p = _aged(_big_lines(tmp_path / "candidates.jsonl", 3 * MIB))
    first = file_content_id(p)
    assert store == [str(p)]
    content_ids._MEMO.clear()  # as a new process
    assert file_content_id(p) == first and store == [str(p)]  # no second read
    entries = list(content_ids.store_dir().glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["id"] == first
    # rewritten in place, same size, its mtime set back: the ctime still tells, it is read again
    st = p.stat()
    _edit(p, 3 * MIB)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    content_ids._MEMO.clear()
    assert file_content_id(p) != first and len(store) == 2


def test_a_file_modified_just_now_is_not_remembered(tmp_path, store):
    p = tmp_path / "fresh.jsonl"
    p.write_bytes(b"x" * (2 * MIB))
    file_content_id(p)
    file_content_id(p)
    assert len(store) == 2 and not list(content_ids.store_dir().glob("*.json"))


def test_only_a_prepared_weights_file_keeps_its_sampled_id(tmp_path, store):
    data = tmp_path / "data"
    ckpt = data / "ifcap" / "checkpoints" / "model.pt"
    ckpt.parent.mkdir(parents=True)
    _big_lines(ckpt, 5 * MIB)
    size = ckpt.stat().st_size
    whole = file_content_id(ckpt)
    assert whole != sampled_id(ckpt, size)  # not recorded by prepare: whole
    (data / "prepare.lock.json").write_text(json.dumps({"version": 1, "files": {
        "ifcap/checkpoints/model.pt": {"sha256": "0" * 64, "size": size}}}))
    content_ids._MEMO.clear()
    assert file_content_id(ckpt) == sampled_id(ckpt, size)  # recorded: the id it always had
    corpus = data / "ifcap" / "corpus.txt"  # content is never sampled, recorded or not
    _big_lines(corpus, 5 * MIB)
    (data / "prepare.lock.json").write_text(json.dumps({"version": 1, "files": {
        "ifcap/corpus.txt": {"sha256": "0" * 64, "size": corpus.stat().st_size}}}))
    assert file_content_id(corpus) != sampled_id(corpus, corpus.stat().st_size)


@pytest.mark.slow  # two 65 MiB files hashed twice: out of make test-fast
def test_an_edited_big_candidates_file_and_corpus_change_the_identities(demo_cfg, tmp_path, store):
    from adjcap.config import load_config
    from adjcap.engine.identity import stage_identities
    from adjcap.storage.provenance import data_digests
    from adjcap.engine.stage_registry import names

    at = 9 * MIB
    cands, corpus = _big_lines(tmp_path / "cands.jsonl", at), _big_lines(tmp_path / "corpus.txt", at)
    sets = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "captioner.family=candidates",
            f"captioner.candidates.file={cands}", f"benchmarks.demo.corpus={corpus}"]

    def ids():
        cfg = load_config("demo", sets).resolved()
        return stage_identities(cfg, "fp"), data_digests(cfg)["corpus"]["digest"]

    stages, digest = ids()
    _edit(cands, at)
    _edit(corpus, at)
    stages2, digest2 = ids()
    assert digest2 != digest
    caption = names().index("caption")
    assert [stages[s] == stages2[s] for s in names()] == [i < caption for i in range(len(names()))]
