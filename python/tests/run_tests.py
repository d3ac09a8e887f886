#!/usr/bin/env python3
"""ctest's entry to the Python tests (tests/CMakeLists.txt: python_api):
exit 77, which ctest reports as skipped, when NumPy is missing (the tfuse
package needs it; scripts/setup.sh installs it); else the unittest suite's
verdict. Tests needing torch skip themselves where it is absent."""
import os
import sys
import unittest

try:
    import numpy  # noqa: F401
except ImportError:
    print("python tests skipped: NumPy is not installed for", sys.executable, "(scripts/setup.sh installs it)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py", top_level_dir=here)
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
