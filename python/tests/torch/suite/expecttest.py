"""A minimal stand-in for the `expecttest` package, which Debian's python3-torch
does not ship but torch.testing._internal.common_utils imports. It has what
that module uses: ACCEPT and the TestCase base class. expecttest's own
assertions (assertExpectedInline) are left out: the distributed suite calls
none, and a test that did would fail with AttributeError.

On sys.path only for the torch suite driver (torch_suite.py puts it there).
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True
