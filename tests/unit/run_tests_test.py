#!/usr/bin/env python3
"""scripts/run_tests.py on a tiny Meson build of its own: a failed test's log
is kept in the build dir (its path printed) and its last 40 lines printed; a
passing test leaves no log.

usage: run_tests_test.py PATH/TO/run_tests.py
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

RUN_TESTS = None

MESON_BUILD = """project('fake-build')
sh = find_program('sh')
test('noisy_failure', sh, args: ['-c', 'i=1; while [ $i -le 100 ]; do echo "line $i"; i=$((i+1)); done; exit 3'])
test('quiet_pass', sh, args: ['-c', 'echo "1 passed, 0 failed, 0 skipped"'])
"""


class RunTestsKeepsFailedLogs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="run-tests-test-")
        src = os.path.join(cls.tmp.name, "src")
        cls.build = os.path.join(cls.tmp.name, "build")
        os.mkdir(src)
        with open(os.path.join(src, "meson.build"), "w") as f:
            f.write(MESON_BUILD)
        subprocess.run(["meson", "setup", cls.build, src], check=True, capture_output=True)
        proc = subprocess.run([sys.executable, RUN_TESTS, cls.build], capture_output=True, text=True)
        cls.code, cls.out = proc.returncode, proc.stdout + proc.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_run_fails_and_counts_one_failure(self):
        self.assertEqual(self.code, 1, self.out)
        self.assertIn("1 passed, 1 failed, 0 skipped", self.out.splitlines()[-1])

    def test_the_failed_tests_whole_output_is_kept_in_the_build_dir_at_the_printed_path(self):
        m = re.search(r"log: (\S+noisy_failure\S*)", self.out)
        self.assertIsNotNone(m, "no log path printed for noisy_failure:\n" + self.out)
        path = m.group(1)
        self.assertTrue(os.path.realpath(path).startswith(os.path.realpath(self.build) + os.sep), path)
        with open(path) as f:
            log = f.read().splitlines()
        for i in (1, 50, 100):
            self.assertIn("line %d" % i, log, "%s lacks line %d" % (path, i))

    def test_the_last_40_lines_are_printed(self):
        printed = [l.strip() for l in self.out.splitlines()]
        self.assertIn("line 61", printed, self.out)
        self.assertIn("line 100", printed, self.out)
        self.assertNotIn("line 60", printed, self.out)

    def test_a_passing_test_leaves_no_log(self):
        self.assertNotRegex(self.out, r"log: \S*quiet_pass")
        for _, _, files in os.walk(self.build):
            self.assertFalse([f for f in files if "quiet_pass" in f and f.endswith(".log")], files)


if __name__ == "__main__":
    RUN_TESTS = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    # The line scripts/run_tests.py counts.
    print("%d passed, %d failed, %d skipped" % (result.testsRun - failed - len(result.skipped), failed,
                                                len(result.skipped)))
    sys.exit(1 if failed else 0)
