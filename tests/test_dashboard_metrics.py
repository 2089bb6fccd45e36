"""adjcap's own dashboard metrics: a small demo job on an embedded Ray that exports its metrics on a
known port; its Prometheus endpoint (scraped over 127.0.0.1) counts exactly the rows the job wrote."""

import re
import socket
import time
import urllib.request
from collections import defaultdict

import pytest

from adjcap.actors import metrics
from adjcap.index import benchmark_corpus
from adjcap.storage.rundir import RunDir

pytestmark = pytest.mark.slow

SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """{metric name: {sorted labels without Ray's per-process ones: value summed over processes}}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or line.startswith("#") or "adjcap_" not in m["name"]:
            continue
        labels = tuple(sorted((k, v) for k, v in LABEL.findall(m["labels"] or "")
                              if k in ("stage", "phase", "le")))
        out[m["name"]][labels] += float(m["value"])
    return out


def by_stage(series: dict[tuple, float]) -> dict[str, float]:
    return {dict(k)["stage"]: v for k, v in series.items()}


def test_prometheus_counts_equal_the_rows_written(demo_cfg, tmp_path, monkeypatch):
    from adjcap.jobs import run
    from adjcap.jobs.ray_session import ray_session

    monkeypatch.setenv("RAY_metrics_report_interval_ms", "1000")  # workers report every second
    port = _free_port()
    cfg = demo_cfg.model_copy(update={
        "limit": 3,
        "cache": demo_cfg.cache.model_copy(update={"share_stages": False}),  # every image through every stage
        "retrieval": demo_cfg.retrieval.model_copy(update={"index_dir": str(tmp_path / "index")}),  # encoded here
        "ray": demo_cfg.ray.model_copy(update={"metrics_export_port": port, "include_dashboard": False}),
    })
    rd = RunDir(tmp_path / "run")
    with ray_session(cfg.resolved()):  # kept up after the job so that its metrics can be read
        run.main(cfg, run_dir=rd.path, evaluate_after=False)
        rows = sum(rd.read_features(cfg.benchmark, split).num_rows for split in cfg.splits)
        failed = sum(sum(1 for e in rd.read_features(cfg.benchmark, split).column("error").to_pylist() if e)
                     for split in cfg.splits)
        corpus = len(benchmark_corpus(cfg.resolved().benchmark_cfg(), cfg.benchmark).texts)
        stages = ["decode", "retrieve", "verify", "caption", "score"]
        want = {s: float(rows) for s in stages}
        deadline = time.monotonic() + 60
        while True:
            got = scrape(port)
            processed = by_stage(got.get(f"ray_{metrics.PROCESSED}_total", {}))
            encoded = sum(got.get(f"ray_{metrics.CORPUS_ENCODED}_total", {}).values())
            remaining = got.get(f"ray_{metrics.REMAINING}", {}).get((("phase", "features"),))
            if (processed == want and encoded == corpus and remaining == 0) or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert rows == 6
    assert processed == want, (processed, rows)
    assert sum(got.get(f"ray_{metrics.FAILED}_total", {}).values()) == failed
    assert encoded == corpus
    batches = by_stage({k: v for k, v in got[f"ray_{metrics.BATCH_SECONDS}_count"].items()})
    assert set(batches) == set(stages) | {"encode"} and all(n >= 1 for n in batches.values())
    assert remaining == 0  # the driver's gauge at the end of the phase
    # the names dashboards query (actors.metrics.prometheus_names, deploy/grafana/adjcap.json) are the real ones
    assert set(got) <= metrics.prometheus_names(), set(got) - metrics.prometheus_names()
    assert {f"ray_{metrics.PROCESSED}_total", f"ray_{metrics.BATCH_SECONDS}_bucket",
            f"ray_{metrics.CORPUS_ENCODED}_total", f"ray_{metrics.REMAINING}"} <= set(got)
