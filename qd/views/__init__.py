"""The terminal views of a run directory: ``qd show``, ``qd lineage``, ``qd stats`` and
``qd compare`` (``qd.cli`` dispatches to each module's ``main``). Each only reads the
run (``qd.rundir``, ``qd.history``), so each works on a run in progress."""
