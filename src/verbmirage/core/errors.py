"""Errors every stage raises about the user's input."""


class ConfigError(ValueError):
    """The config is invalid; the message names the key."""
