"""Typed errors of the runtime; each message is one line that says what was expected and what was found.

The CLI turns any TlmpackError into that one line and exit code 2, so messages must stand alone:
they name the file, input or target concerned, not just the symptom.
"""


class TlmpackError(Exception):
    """Base of every error tlmpack raises on purpose (the CLI catches this one)."""


class ArtifactError(TlmpackError):
    """The artifact is unreadable, corrupted, inconsistent, unsafe to extract, or of an unsupported format."""


class IncompatibleTargetError(TlmpackError):
    """The artifact is fine, but no target in it can run on this machine (CPU features, device, OS)."""


class InputError(TlmpackError):
    """A feed does not match the model's inputs (name, dtype, shape), or a requested output does not exist."""


class KernelError(TlmpackError):
    """A kernel (or the C runtime while running) reported a failure."""


class TlmpackWarning(UserWarning):
    """Something worked, but not the way it should have (e.g. "auto" fell back from CUDA to the CPU)."""
