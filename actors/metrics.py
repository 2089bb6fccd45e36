"""adjcap's own metrics, exported through Ray's metrics agent (``ray.util.metrics``) to the dashboard's
Metrics view and its Prometheus endpoint, where Ray prefixes them ``ray_`` (counters also get ``_total``).

The one owner of their names: the stage actors count and time their batches (:class:`actors.progress.StageMeter`),
the driver sets the gauges (:mod:`adjcap.jobs.progress_display`)."""

from __future__ import annotations

import functools

from ray.util.metrics import Counter, Gauge, Histogram

PROCESSED = "adjcap_images_processed"
FAILED = "adjcap_images_failed"
BATCH_SECONDS = "adjcap_batch_seconds"
REMAINING = "adjcap_images_remaining"
ETA = "adjcap_eta_seconds"
CORPUS_ENCODED = "adjcap_corpus_captions_encoded"

# seconds per batch: a tiny model's batch on a CPU takes tens of ms, a bigG batch on a loaded CPU minutes
BATCH_BOUNDARIES = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600]

DESCRIPTIONS = {
    PROCESSED: "images that went through a stage (tag stage: decode, retrieve, verify, caption, score)",
    FAILED: "images whose stage set an error (their row keeps the error)",
    BATCH_SECONDS: "seconds one batch took in a stage (tag stage; encode: one corpus shard)",
    REMAINING: "images of the running job not yet through its last stage (tag phase)",
    ETA: "seconds until the running phase ends, at its rate so far (tag phase)",
    CORPUS_ENCODED: "corpus captions encoded into the retrieval index",
}
NAMES = tuple(DESCRIPTIONS)
KINDS = {PROCESSED: "counter", FAILED: "counter", BATCH_SECONDS: "histogram", REMAINING: "gauge", ETA: "gauge",
         CORPUS_ENCODED: "counter"}
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def prometheus_names() -> set[str]:
    """The series names these metrics have on Ray's Prometheus endpoint (what dashboards query): Ray
    prefixes ``ray_``, counters get ``_total``, histograms ``_bucket``, ``_sum`` and ``_count``."""
    return {f"ray_{name}{suffix}" for name, kind in KINDS.items() for suffix in _SUFFIXES[kind]}


@functools.cache
def counter(name: str, stage_tag: bool = True) -> Counter:
    """One metric object per process and name (Ray registers a name once per worker)."""
    return Counter(name, description=DESCRIPTIONS[name], tag_keys=("stage",) if stage_tag else ())


@functools.cache
def batch_seconds() -> Histogram:
    return Histogram(BATCH_SECONDS, description=DESCRIPTIONS[BATCH_SECONDS], boundaries=BATCH_BOUNDARIES,
                     tag_keys=("stage",))


@functools.cache
def gauge(name: str) -> Gauge:
    return Gauge(name, description=DESCRIPTIONS[name], tag_keys=("phase",))
