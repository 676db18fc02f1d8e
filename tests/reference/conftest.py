"""pytest setup for tests/reference: import path and the `slow` marker.

Owns: registering the `slow` marker (long-prompt oracle cases; deselect with
-m "not slow") and putting this folder on sys.path.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-prompt oracle cases (deselect with -m 'not slow')")
