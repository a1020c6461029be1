"""tlmpack: an ahead-of-time compiler and packager for trained models.

Importing this package is cheap: tvm, torch and transformers are imported only by the
functions that compile.
"""

__version__ = "0.1.0"
