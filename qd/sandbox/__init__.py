"""Untrusted code (LLM-written programs) runs only here: pre-forked, isolated worker processes.

``pool`` is the host side (``Sandbox``, ``Limits``); ``worker`` is the program each
worker process runs (started as ``python -I worker.py``, never imported by the host).
"""

from qd.sandbox.pool import Limits, Sandbox, SandboxResult

__all__ = ["Limits", "Sandbox", "SandboxResult"]
