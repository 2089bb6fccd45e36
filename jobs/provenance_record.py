"""A job's provenance in its run directory (:mod:`adjcap.storage.provenance` collects it): written when the
job starts, the Ray cluster's nodes added once Ray is up (cheaply, from ``ray.nodes()``: no task runs
on the nodes), completed - with the end time and how it ended - when the job stops."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray

from adjcap.storage import provenance
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import RunPlan


def cluster_nodes() -> list[dict[str, Any]]:
    """Every alive node of the connected Ray cluster: host, CPUs, GPUs, GPU type, memory."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive", False):
            continue
        res = n.get("Resources") or {}
        types = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
        out.append({
            "host": n.get("NodeManagerHostname") or n.get("NodeManagerAddress"),
            "address": n.get("NodeManagerAddress"),
            "cpus": res.get("CPU", 0),
            "gpus": int(res.get("GPU", 0)),
            "gpu_type": ",".join(sorted(types)) or None,
            "memory_gib": round(float(res.get("memory", 0)) / 2**30, 1),
        })
    return out


class ProvenanceRecord:
    """The provenance document of one job, kept on disk as it grows."""

    def __init__(self, run: RunDir, doc: dict[str, Any]):
        self.run = run
        self.doc = doc
        run.write_provenance(doc)

    def add_cluster(self) -> None:
        """Inside a Ray session: the nodes the job runs on."""
        if ray.is_initialized():
            self.doc["cluster"] = provenance.cluster_summary(cluster_nodes())
            self.run.write_provenance(self.doc)

    def finish(self, plan: RunPlan, status: str = "finished") -> dict[str, Any]:
        feats = self.doc.get("features") or {}
        if not (feats.get("index") or {}).get("digest"):
            self.doc["features"] = provenance.feature_identities(plan)  # the index exists now
        self.doc = provenance.finish(self.doc, status)
        self.run.write_provenance(self.doc)
        return self.doc


@contextlib.contextmanager
def recorded(plan: RunPlan, job: str = "run-job") -> Iterator[ProvenanceRecord]:
    """Write the plan's run directory's ``provenance.json`` at the start and complete it at the end,
    also when the job fails or is interrupted (its status then says so)."""
    rec = ProvenanceRecord(plan.run, provenance.start(plan, job=job))
    try:
        yield rec
    except BaseException as e:
        rec.finish(plan, status=f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
        raise
    rec.finish(plan)


def note_step(run: RunDir, job: str) -> None:
    """A later command that changed the run's outputs (``adjcap fit``, ``adjcap evaluate``): appended
    to provenance.json's ``later_steps`` with its time, command and adjcap version."""
    doc = run.provenance()
    if not doc:
        return
    import sys

    doc.setdefault("later_steps", []).append({"job": job, "utc": provenance.utc_now(), "command": list(sys.argv),
                                              "adjcap": provenance.adjcap_version()})
    run.write_provenance(doc)
