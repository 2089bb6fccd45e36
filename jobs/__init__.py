"""Ray Data jobs: encode_corpus, run_benchmark, fit, evaluate, demo. They wire datasets to actor
pools and files; no model math lives here."""
