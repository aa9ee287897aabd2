"""Errors that reach the user as one line naming the field and the fix."""


class ConfigError(ValueError):
    """A bad config field: ``field`` is the dotted key, ``fix`` says what to do."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}" + (f" ({fix})" if fix else ""))


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file and the fix."""
