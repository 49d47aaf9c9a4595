"""A minimal stand-in for the `expecttest` package, which
torch.testing._internal.common_utils imports but neither the torch wheel (it
does not depend on it) nor Debian's python3-torch installs. It has what that
module uses (torch 1.13 to 2.15): ACCEPT and the TestCase base class.
expecttest's own assertions (assertExpectedInline) are left out: the
distributed suite calls none, and a test that did would fail with
AttributeError.

On sys.path only for the torch suite driver (torch_suite.py puts it there).
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True
