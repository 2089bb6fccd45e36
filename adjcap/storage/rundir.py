"""The one owner of a run directory's layout. Every path inside a run is joined here.

::

    runs/<name>/
      config.toml                                   the config that produced the run (placeholders kept;
                                                    re-runs as is with --config)
      provenance.json                               what made the run: versions, hardware, command, times,
                                                    config digest, model and data identities (adjcap/storage/provenance.py)
      run.lock                                      held (flock) by the one job writing the run; names its pid/host
      features/identity.json                        the settings that produced the features; a rerun with
                                                    other feature settings is refused (--fresh starts over)
      references/<benchmark>-<split>.json           {image_id: [reference captions]}
      references/<benchmark>-<split>.domains.json   {image_id: domain} (NoCaps)
      references/<benchmark>-<split>.coco_ids.json  {image_id: COCO id} (when the layout has one)
      features/<benchmark>-<split>/part-*.parquet   one row per image (schema: adjcap/engine/features.py); a part
                                                    is written to a temp name and renamed: complete or absent
      features/summary.json                         per split: images, done, failed, skipped; seconds;
                                                    stages: images computed and reused per stage, and
                                                    streaming: {images, seconds} from the first batch
                                                    back from the pools to the last (the pace a longer
                                                    job approaches: loading and the index come before)
      fit/<protocol>.json                           what the protocol chose: alpha, beta, losses, fit images
      heads/                                        trifuse.safetensors, memattend.safetensors, heads.json
      heads/seeds/<seed>/                           rerank.seeds: the heads fitted with each seed of the study
      predictions/<protocol>/<picker>.json          COCO results [{image_id, caption, candidate_index, coco_id?}]
      predictions/<protocol>/seeds/<picker>.seed-<seed>.json   rerank.seeds: each learned picker's picks per seed
      metrics/<protocol>.json                       every picker's metrics, rank statistics, per-image scores
      samples.parquet, samples.md                   one row per image and split: references, candidates with every
                                                    judge's score, every picker's pick, per-image metrics (card: .md)
      report.md, report.html, tables/*.tex, plots/*.png
      gallery.html, gallery/rows-*.js               the paged gallery of every image (its rows load lazily)
      wandb/                                        W&B's local run files (--log wandb, unless WANDB_DIR is set)
      captions.jsonl, captions.html                 `adjcap caption DIR`: per image the chosen caption and its candidates

A :class:`RunDir` only names and reads/writes files; it never decides what goes into them. It is
also the one reader of a run: the Python API (``adjcap.load_run``), the report, ``evaluate`` and the
samples table read a run's config, settings and metrics through it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from adjcap.config import Config, load_config
from adjcap.storage.file_lock import holding
from adjcap.storage.io import atomic_write_json, atomic_write_text, is_temp_name
from adjcap.storage.parts import PART_GLOB, new_part_name, part_paths, read_part, write_part


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked; the message says why and what to do."""


def ray_working_dir(path: str | Path) -> Path | None:
    """The working directory Ray unpacked for a submitted job (``.../runtime_resources/working_dir_files/
    _ray_pkg_<hash>``) that ``path`` lies in, or None."""
    parts = Path(path).absolute().parts
    for i in range(len(parts) - 2):
        if parts[i] == "runtime_resources" and parts[i + 2].startswith("_ray_pkg_"):
            return Path(*parts[:i + 3])
    return None


class RunDir:
    """A run directory (see the module docstring for its layout)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def default_for(cls, runs_dir: str | Path, config_name: str, benchmark: str) -> "RunDir":
        """``<runs_dir>/<preset>-<benchmark>``: where a run goes when no --run-dir is given."""
        return cls(Path(runs_dir) / f"{config_name}-{benchmark}")

    def check_usable(self) -> None:
        """A clear error when the path exists but is not a directory, or lies in the working directory
        Ray unpacked for a submitted job (deleted with the job's session: a resume would find nothing)."""
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"{self.path}: run directory path exists and is not a directory; "
                                     "choose another --run-dir")
        unpacked = ray_working_dir(self.path)
        if unpacked is not None:
            raise RunDirError(f"{self.path.absolute()} is inside Ray's unpacked working directory {unpacked}, which "
                              "Ray deletes with the job; set $ADJCAP_RUNS or --set paths.runs_dir=/an/absolute/path "
                              "on storage every node shares (or --run-dir)")

    def is_run(self) -> bool:
        """A directory adjcap wrote a run into: its config.toml (written first) or metrics/."""
        return self.path.is_dir() and (self.config_path.exists() or self.metrics_dir.is_dir())

    # ---- lock ---------------------------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.path / "run.lock"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run directory for one job. A second job on it fails at once with a message
        naming the holder's pid and host (the OS releases the lock when the holder dies)."""
        self.check_usable()
        self.path.mkdir(parents=True, exist_ok=True)

        def busy(_: Path, holder: str) -> Exception:
            return RunDirError(f"{self.path} is in use by {holder}; wait for that job to finish or use another --run-dir")

        with holding(self.lock_path, busy=busy):
            self.remove_leftovers()
            yield

    def remove_leftovers(self) -> list[Path]:
        """Delete the temp files of atomic writes (:func:`adjcap.storage.io.is_temp_name`) that a killed writer
        left in this run directory. Called with the run lock held: no live job writes here then."""
        gone = []
        for p in self.path.rglob(".*.tmp"):
            if is_temp_name(p.name) and p.is_file() and not p.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    gone.append(p)
        return gone

    # ---- config ------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.toml"

    def write_config(self, toml_text: str) -> Path:
        return atomic_write_text(self.config_path, toml_text)

    def config(self) -> Config:
        """The config that produced the run, read back from config.toml (FileNotFoundError naming it
        when the directory has none; ConfigError when it cannot be read)."""
        if not self.config_path.exists():
            raise FileNotFoundError(f"{self.config_path} not found: is {self.path} a run directory?")
        return load_config(None, [], self.config_path)

    def settings(self) -> tuple[str | None, str]:
        """(benchmark, the split pickers are applied to) from config.toml; (None, 'test') when it is
        absent or cannot be read (a damaged config only loses these defaults)."""
        try:
            cfg = self.config()
        except Exception:  # noqa: BLE001 - a missing or damaged config only loses the defaults
            return None, "test"
        return cfg.benchmark, cfg.rerank.apply_split

    # ---- provenance --------------------------------------------------------------------------
    @property
    def provenance_path(self) -> Path:
        return self.path / "provenance.json"

    def write_provenance(self, doc: Mapping[str, Any]) -> Path:
        return atomic_write_json(self.provenance_path, dict(doc))

    def provenance(self) -> dict[str, Any]:
        return _read_json(self.provenance_path, {})

    # ---- references --------------------------------------------------------------------------
    def references_path(self, benchmark: str, split: str) -> Path:
        return self.path / "references" / f"{benchmark}-{split}.json"

    def domains_path(self, benchmark: str, split: str) -> Path:
        return self.path / "references" / f"{benchmark}-{split}.domains.json"

    def coco_ids_path(self, benchmark: str, split: str) -> Path:
        return self.path / "references" / f"{benchmark}-{split}.coco_ids.json"

    def write_references(self, benchmark: str, split: str, references: Mapping[str, list[str]],
                         domains: Mapping[str, str] | None = None,
                         coco_ids: Mapping[str, int] | None = None) -> None:
        atomic_write_json(self.references_path(benchmark, split), dict(references))
        for path, data in ((self.domains_path(benchmark, split), domains),
                           (self.coco_ids_path(benchmark, split), coco_ids)):
            if data:
                atomic_write_json(path, dict(data))
            elif path.exists():
                path.unlink()

    def references(self, benchmark: str, split: str) -> dict[str, list[str]]:
        return _read_json(self.references_path(benchmark, split), {})

    def domains(self, benchmark: str, split: str) -> dict[str, str] | None:
        return _read_json(self.domains_path(benchmark, split), None)

    def coco_ids(self, benchmark: str, split: str) -> dict[str, int]:
        return _read_json(self.coco_ids_path(benchmark, split), {})

    def reference_splits(self) -> list[tuple[str, str]]:
        """(benchmark, split) of every references file written."""
        out = []
        for p in sorted((self.path / "references").glob("*.json")):
            if p.name.endswith((".domains.json", ".coco_ids.json")) or p.name.startswith("."):
                continue
            bench, _, split = p.stem.rpartition("-")
            if bench:
                out.append((bench, split))
        return out

    # ---- features ----------------------------------------------------------------------------
    def features_dir(self, benchmark: str, split: str) -> Path:
        return self.path / "features" / f"{benchmark}-{split}"

    def parts(self, benchmark: str, split: str) -> list[Path]:
        """Complete feature parts, sorted by name (:mod:`adjcap.storage.parts`)."""
        return part_paths(self.features_dir(benchmark, split))

    def has_features(self, benchmark: str, split: str) -> bool:
        return bool(self.parts(benchmark, split))

    def done_ids(self, benchmark: str, split: str) -> set[str]:
        """Image ids in readable parts; an unreadable part is moved aside first (see
        :meth:`quarantine_corrupt`), so its images count as not done and are recomputed."""
        self.quarantine_corrupt(benchmark, split)
        out: set[str] = set()
        for p in self.parts(benchmark, split):
            out.update(pq.read_table(p, columns=["image_id"]).column("image_id").to_pylist())
        return out

    def quarantine_corrupt(self, benchmark: str, split: str) -> list[Path]:
        """Rename every part that cannot be read to ``<name>.corrupt`` (kept for inspection, never
        read again) and say so on stderr."""
        return [p.with_name(p.name + ".corrupt") for p in self.parts(benchmark, split)
                if read_part(p, columns=["image_id"]) is None]

    def new_part_path(self, benchmark: str, split: str) -> Path:
        """A part name no other writer can take (:func:`adjcap.storage.parts.new_part_name`)."""
        return self.features_dir(benchmark, split) / new_part_name()

    def write_part(self, benchmark: str, split: str, table: pa.Table, name: str | None = None) -> Path:
        """``table`` as a feature part, atomically; ``name`` (:func:`adjcap.storage.parts.content_part_name`)
        makes a batch written again replace its own part."""
        return write_part(self.features_dir(benchmark, split), table, name)

    def clear_features(self, benchmark: str, split: str) -> None:
        for p in self.features_dir(benchmark, split).glob(PART_GLOB):
            p.unlink()

    def read_features(self, benchmark: str, split: str, columns: list[str] | None = None,
                      image_ids: set[str] | None = None) -> pa.Table:
        """The split's feature rows (only ``image_ids`` when given: a run's current image set)."""
        parts = self.parts(benchmark, split)
        if not parts:
            raise FileNotFoundError(
                f"no feature parts in {self.features_dir(benchmark, split)}; run `adjcap run-job {benchmark}` first"
            )
        tables = [pq.read_table(p, columns=columns) for p in parts]
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        if image_ids is not None:
            keep = [i in image_ids for i in table.column("image_id").to_pylist()]
            table = table.filter(pa.array(keep, type=pa.bool_()))
        return table

    def current_ids(self, benchmark: str, split: str) -> set[str] | None:
        """The image ids of the split as the last run-job read them (its references file), or None."""
        p = self.references_path(benchmark, split)
        return set(self.references(benchmark, split)) if p.exists() else None

    @property
    def identity_path(self) -> Path:
        return self.path / "features" / "identity.json"

    def check_identity(self, identity: Mapping[str, Any], fresh: bool) -> None:
        """Record the feature settings; refuse (naming the keys) to add features made with other
        settings to features already there, unless ``fresh`` (then the old features are deleted)."""
        old = _read_json(self.identity_path, None)
        have = any((self.path / "features").glob(f"*/{PART_GLOB}"))
        if old is not None and have and dict(old) != dict(identity):
            if not fresh:
                keys = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
                shown = ", ".join(f"{k} ({old.get(k)!r} -> {identity.get(k)!r})" for k in keys[:4])
                raise RunDirError(f"{self.path} holds features made with other settings: {shown}"
                                  f"{' ...' if len(keys) > 4 else ''}; rerun with --fresh to start over, "
                                  "or use another --run-dir")
        if fresh or (old is not None and dict(old) != dict(identity)):
            for p in (self.path / "features").glob(f"*/{PART_GLOB}"):
                p.unlink()
        atomic_write_json(self.identity_path, dict(identity))

    @property
    def summary_path(self) -> Path:
        return self.path / "features" / "summary.json"

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        return atomic_write_json(self.summary_path, dict(summary))

    def summary(self) -> dict[str, Any]:
        return _read_json(self.summary_path, {})

    # ---- fit, heads, predictions -------------------------------------------------------------
    def fit_summary_path(self, protocol: str) -> Path:
        return self.path / "fit" / f"{protocol}.json"

    def write_fit_summary(self, protocol: str, summary: Mapping[str, Any]) -> Path:
        return atomic_write_json(self.fit_summary_path(protocol), dict(summary))

    def fit_summary(self, protocol: str) -> dict[str, Any]:
        return _read_json(self.fit_summary_path(protocol), {})

    @property
    def captions_jsonl(self) -> Path:
        """``adjcap caption``: one line per image (chosen caption, candidates and their scores)."""
        return self.path / "captions.jsonl"

    @property
    def heads_dir(self) -> Path:
        return self.path / "heads"

    @property
    def heads_json_path(self) -> Path:
        return self.heads_dir / "heads.json"

    def predictions_dir(self, protocol: str) -> Path:
        return self.path / "predictions" / protocol

    def predictions_path(self, protocol: str, picker: str) -> Path:
        return self.predictions_dir(protocol) / f"{picker}.json"

    def write_predictions(self, protocol: str, picker: str, entries: list[dict[str, Any]]) -> Path:
        return atomic_write_json(self.predictions_path(protocol, picker), entries)

    def prediction_protocols(self) -> list[str]:
        root = self.path / "predictions"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def prediction_files(self, protocol: str) -> dict[str, Path]:
        """picker -> predictions file of one protocol."""
        d = self.predictions_dir(protocol)
        return {p.stem: p for p in sorted(d.glob("*.json")) if not p.name.startswith(".")}

    def predictions(self, protocol: str, picker: str) -> list[dict[str, Any]]:
        return _read_json(self.predictions_path(protocol, picker), [])

    # ---- the seed study (rerank.seeds) -------------------------------------------------------
    def seed_heads_dir(self, seed: int) -> Path:
        return self.heads_dir / "seeds" / str(int(seed))

    def seed_predictions_dir(self, protocol: str) -> Path:
        return self.predictions_dir(protocol) / "seeds"

    def clear_seed_study(self, protocol: str) -> None:
        """Remove a protocol's seed predictions and every seed's heads (a refit writes its own)."""
        import shutil

        for d in (self.seed_predictions_dir(protocol), self.heads_dir / "seeds"):
            if d.is_dir():
                shutil.rmtree(d)

    def write_seed_predictions(self, protocol: str, picker: str, seed: int, entries: list[dict[str, Any]]) -> Path:
        return atomic_write_json(self.seed_predictions_dir(protocol) / f"{picker}.seed-{int(seed)}.json", entries)

    def seed_prediction_files(self, protocol: str) -> dict[tuple[str, int], Path]:
        """(picker, seed) -> predictions file of the protocol's seed study (empty without one)."""
        out: dict[tuple[str, int], Path] = {}
        for p in sorted(self.seed_predictions_dir(protocol).glob("*.seed-*.json")):
            picker, _, seed = p.name[: -len(".json")].rpartition(".seed-")
            if picker and seed.lstrip("-").isdigit() and not p.name.startswith("."):
                out[(picker, int(seed))] = p
        return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1])))

    # ---- metrics and report ------------------------------------------------------------------
    @property
    def metrics_dir(self) -> Path:
        return self.path / "metrics"

    def metrics_path(self, protocol: str) -> Path:
        return self.metrics_dir / f"{protocol}.json"

    def write_metrics(self, protocol: str, doc: Mapping[str, Any]) -> Path:
        return atomic_write_json(self.metrics_path(protocol), dict(doc))

    def metrics_current(self, protocol: str) -> bool:
        """metrics/<protocol>.json exists and is not older than any of the protocol's predictions
        (a new ``adjcap fit`` makes it stale until ``adjcap evaluate``)."""
        p = self.metrics_path(protocol)
        if not p.exists():
            return False
        files = [*self.prediction_files(protocol).values(), *self.seed_prediction_files(protocol).values()]
        newest = max((f.stat().st_mtime_ns for f in files), default=0)
        return p.stat().st_mtime_ns >= newest

    def metrics_files(self) -> list[Path]:
        d = self.metrics_dir
        return sorted(p for p in d.glob("*.json") if not p.name.startswith(".")) if d.is_dir() else []

    def metrics_docs(self) -> dict[str, dict[str, Any]]:
        """protocol -> its metrics document (every picker's metrics, per-image scores), for each
        metrics/*.json that holds pickers; ValueError naming a file that is not JSON."""
        out: dict[str, dict[str, Any]] = {}
        for f in self.metrics_files():
            try:
                doc = json.loads(f.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{f}: not valid JSON ({e}); re-run `adjcap evaluate --run {self.path}`") from None
            if isinstance(doc, dict) and "pickers" in doc:
                out[doc.get("protocol", f.stem)] = doc
        return out

    @property
    def report_md(self) -> Path:
        return self.path / "report.md"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.parquet"

    @property
    def samples_card_path(self) -> Path:
        return self.path / "samples.md"

    def gallery_html(self, label: str | None = None) -> Path:
        """The paged gallery of every image (``gallery-<label>.html`` for one of several runs reported together)."""
        return self.path / (f"gallery-{label}.html" if label else "gallery.html")

    def diagnostics_html(self, label: str | None = None) -> Path:
        """The reranker diagnostics page (heads/heads.json as a table), linked from the report."""
        return self.path / (f"diagnostics-{label}.html" if label else "diagnostics.html")

    def gallery_dir(self, label: str | None = None) -> Path:
        """The gallery's row chunks (``rows-<n>.js``), loaded by the gallery page as it pages."""
        return self.path / "gallery" / label if label else self.path / "gallery"

    @property
    def tables_dir(self) -> Path:
        return self.path / "tables"

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"


def _read_json(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it and rerun the step that writes it") from None
