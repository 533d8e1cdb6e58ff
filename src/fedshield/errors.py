"""Errors that reach the user as one clear line (the CLI prints them without a traceback)."""


class FedshieldError(Exception):
    """Base class: anything the user can fix by changing config, files or arguments."""


class ConfigError(FedshieldError, ValueError):
    """An invalid or impossible configuration; the message names the key and the value."""


class DataError(FedshieldError):
    """Missing or unreadable data files; the message names the path and the switch to fix it."""
