"""Untrusted code (LLM-written programs) runs only here: pre-forked, isolated worker processes.

``pool`` is the host side (``Sandbox``, ``Limits``); ``worker`` is the program each
worker process runs (started as ``python -I worker.py``; the host imports it only for
``ModelCallError``, what an entry's ``llm(...)`` raises when a model call is refused
or fails).
"""

from qd.sandbox.pool import Limits, Sandbox, SandboxResult
from qd.sandbox.worker import ModelCallError

__all__ = ["Limits", "ModelCallError", "Sandbox", "SandboxResult"]
