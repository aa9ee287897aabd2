"""Untrusted code (LLM-written programs) runs only here: pre-forked, isolated worker processes.

``pool`` is the host side (``Sandbox``, ``Limits``); ``worker.py`` is the program each
worker process runs (``python -I worker.py``, never imported by the host), made of
``serve``, ``child``, ``supervise``, ``model_calls`` and ``isolation``; ``protocol`` is
the frames both sides speak, and ``ModelCallError``, what an entry's ``llm(...)`` raises
when a model call is refused or fails.
"""

from qd.sandbox.pool import Limits, Sandbox, SandboxResult
from qd.sandbox.protocol import ModelCallError

__all__ = ["Limits", "ModelCallError", "Sandbox", "SandboxResult"]
