"""Runs moto's ECS tests in server mode against an mpsfleet server started with
--ecs-conformance, and compares each test's outcome with tests/ecs/expected-failures.txt.

usage: conformance.py ENDPOINT MOTO_TESTS_DIR EXPECTED_FILE

Every test of the four files runs. A test listed as expected to fail must fail; any other
test must pass (or be skipped by moto itself in server mode, with its printed reason). Prints
the counts and exits non-zero on any test whose outcome is not the expected one.
"""

import os
import sys

ENDPOINT, TESTS, EXPECTED = sys.argv[1:4]
FILES = ["tests/test_ecs/test_ecs.py", "tests/test_ecs/test_ecs_task_definitions.py",
         "tests/test_ecs/test_ecs_task_def_tags.py", "tests/test_ecs/test_ecs_capacity_provider.py"]

# moto's harness reads these when it is imported: before pytest collects anything.
os.environ.update(TEST_SERVER_MODE="true", TEST_SERVER_MODE_ENDPOINT=ENDPOINT,
                  AWS_DEFAULT_REGION="us-east-1")
import pytest  # noqa: E402


def expected_failures(path):
    """`TEST | REASON` lines."""
    out = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            pattern, _, reason = line.partition("|")
            out.append((pattern.strip(), reason.strip()))
    return out


def listed(nodeid, patterns):
    """The reason `nodeid` is listed for: its name, or its name with parameters (`name[...]`)."""
    name = nodeid.split("tests/test_ecs/", 1)[-1]
    for pattern, reason in patterns:
        if name == pattern or name.startswith(pattern + "["):
            return reason
    return None


class Outcomes:
    def __init__(self):
        self.by_test = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome in ("failed", "skipped"):
            if report.nodeid not in self.by_test or report.outcome != "passed":
                self.by_test[report.nodeid] = (report.outcome, str(report.longrepr)[-300:] if report.failed else
                                               (report.longrepr[2] if report.skipped else ""))


def main():
    patterns = expected_failures(EXPECTED)
    outcomes = Outcomes()
    os.chdir(TESTS)
    pytest.main(["-p", "no:cacheprovider", "-q", "--no-header", "-o", "console_output_style=classic", *FILES],
                plugins=[outcomes])
    passed = in_groups = singles = skipped = 0
    wrong = []
    for nodeid, (outcome, detail) in sorted(outcomes.by_test.items()):
        reason = listed(nodeid, patterns)
        if outcome == "skipped":
            skipped += 1
            print(f"skipped by moto: {nodeid}: {detail}")
        elif outcome == "passed" and (reason is None or reason.startswith("group:")):
            passed += 1
        elif reason is not None and outcome == "failed":
            if reason.startswith("group:"):
                in_groups += 1
            else:
                singles += 1
                print(f"expected failure: {nodeid}: {reason}")
        elif reason is None:
            wrong.append(f"UNEXPECTED FAILURE {nodeid}: {detail}")
        else:
            wrong.append(f"UNEXPECTED PASS {nodeid} (listed: {reason}): take it off the list")
    for w in wrong:
        print(w)
    version = open(os.path.join(TESTS, ".version")).read().strip()
    print(f"moto {version} ECS suite: {passed} passed, {singles + in_groups} expected failures "
          f"({singles} single tests, {in_groups} in the EC2, capacity provider and account setting groups), "
          f"{skipped} skipped by moto in server mode, {len(wrong)} unexpected")
    sys.exit(1 if wrong else 0)


main()
