"""Ray Data jobs: encode_corpus, extract_features, fit, evaluate, demo. They wire datasets to actor
pools and files; no model math lives here."""
