"""Java and the jars it runs, below the metrics that run them and the `adjcap prepare` that fetches
them: finding Java (:mod:`.runtime`), what SPICE may execute (:mod:`.trust`: private directories,
pinned digests) and where SPICE's CoreNLP jars are and whether SPICE could run (:mod:`.corenlp`).
Nothing here downloads or unpacks: ``adjcap prepare`` owns that (:mod:`adjcap.prepare.corenlp`)."""
