"""Test setup: import the checkout's packages (qd, operators, descriptors) and tests/helpers.py."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
