"""Errors that reach the user as one line naming the field and the fix."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file and the fix."""
