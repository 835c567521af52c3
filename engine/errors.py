"""Errors the engine raises for conditions a user can cause and fix.

Every class here is a ``LocalchatError``: the CLI and the TUI print its message as one line
(``localchat: error: <message>``) and exit 1, with no traceback unless ``--debug``. Anything
else escaping the engine is a bug and keeps its traceback.
"""

from __future__ import annotations


class LocalchatError(Exception):
    """Base class of user-facing errors; ``str(err)`` is a complete one-line message."""


class ModelNotFoundError(LocalchatError):
    """A model spec names no catalog alias, local file or folder, or Hub repository."""


class ModelDownloadError(LocalchatError):
    """Fetching a model failed (network, checksum mismatch, missing files in a bundle)."""


class ModelLoadError(LocalchatError):
    """A model file or folder is unreadable: truncated, corrupt, or missing tensors."""


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architecture has no model definition in ``MODEL_REGISTRY``."""


class ContextLengthError(LocalchatError):
    """A prompt does not fit in the model's context (``max_model_len`` tokens)."""


class SettingError(LocalchatError, ValueError):
    """An environment setting (``LOCALCHAT_CPU_ISA`` ...) holds a value it does not take: a
    user's typo, printed as one line, exit 2 as for a bad flag value."""

    exit_code = 2
