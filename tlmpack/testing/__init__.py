"""Test and benchmark support: model generators and conformance drivers. Not the product.

Nothing under ``tlmpack.build``/``tlmpack.runtime`` imports this package; tests, bench/ and the
lead's GPU scripts do.
"""
