"""Reasoning problems shared by the agent, team and prompt experiments.

``problems``: seeded, exactly-checkable problems (standard library only); ``task``:
``ReasoningTask``, the base the three experiments' tasks subclass (search stage,
founders, held-out problems). The experiments import them from here, never each
other's files: an experiment folder is not a package.
"""
