"""Offline: what makes the TLM (corpus, sampling, measuring, the record store, training, adapting). Never imported by a build."""
