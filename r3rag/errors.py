"""Errors a user sees as one clear line (file, line, key, what was expected)."""


class R3RagError(Exception):
    """Base class for errors that are the user's to fix; CLIs print ``str(err)`` and exit 2."""


class DataError(R3RagError):
    """A dataset or corpus file has a bad record. The message starts with ``file:line:``."""


class ConfigError(R3RagError):
    """A config file or override is invalid. The message names the key and the file."""


class NotTrainableError(R3RagError):
    """A trajectory cannot be used as token-level training data (ids not exact)."""
