"""The device-resident numeric loop (``runner.loop=device``): a whole MAP-Elites
generation fused in one jitted step, ``lax.scan``'ed over K generations per host
round trip, for tasks with a pure-JAX evaluation.

``step`` holds the pure functions (no host code, runnable with only jax and
numpy: ``bench/device.py`` uses it on any backend, so this package imports
nothing on its own); ``driver`` runs them with a checkpoint after each call,
and its ``build`` makes a run of a plan.
"""
