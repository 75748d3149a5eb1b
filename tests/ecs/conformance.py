"""Runs moto's ECS tests in server mode against an mpsfleet server started with
--ecs-conformance, and holds each test's outcome to tests/ecs/expected-failures.txt.

usage: conformance.py ENDPOINT MOTO_TESTS_DIR EXPECTED_FILE
       conformance.py --self-test   (the judge catches each broken pin, on made-up outcomes)

The file pins every number of the run:
  tests N                      how many tests the four files hold (a lost file or test fails)
  group NAME | REASON          a group of tests that need what mpsfleet does not serve
  TEST | MESSAGE | REASON      TEST (and each of its parameters) must fail, with MESSAGE in its
                               failure's message ('...' stands for any text between parts);
                               REASON is `group NAME` for a member of a group
  skip TEST | MESSAGE          moto itself skips TEST in server mode, saying MESSAGE
Any other test must pass. A test that fails differently, or passes, or is skipped unlisted, or
an entry that matches no test, fails the run. Prints the whole summary and exits non-zero on
any of those.
"""

import os
import sys

FILES = ["tests/test_ecs/test_ecs.py", "tests/test_ecs/test_ecs_task_definitions.py",
         "tests/test_ecs/test_ecs_task_def_tags.py", "tests/test_ecs/test_ecs_capacity_provider.py"]



class Expected:
    """The file's pins."""

    def __init__(self, path, lines=None):
        self.total = None
        self.groups = {}      # name -> reason
        self.failures = []    # (test, message, reason, group or None)
        self.skips = []       # (test, message)
        for n, line in enumerate(lines if lines is not None else open(path), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{n}"
            if line.startswith("tests "):
                self.total = int(line.split()[1])
            elif line.startswith("group "):
                name, _, reason = line[len("group "):].partition("|")
                self.groups[name.strip()] = reason.strip()
            elif line.startswith("skip "):
                test, _, message = line[len("skip "):].partition("|")
                self.skips.append((test.strip(), message.strip()))
            else:
                parts = [p.strip() for p in line.split("|", 2)]
                if len(parts) != 3 or not parts[1]:
                    sys.exit(f"{where}: expected `TEST | MESSAGE | REASON`, got {line!r}")
                test, message, reason = parts
                group = reason[len("group "):].strip() if reason.startswith("group ") else None
                if group is not None and group not in self.groups:
                    sys.exit(f"{where}: group {group!r} is not declared with a `group` line")
                self.failures.append((test, message, reason, group))
        if self.total is None:
            sys.exit(f"{path}: no `tests N` line")


def name_of(nodeid):
    return nodeid.split("tests/test_ecs/", 1)[-1]


def matches(nodeid, test):
    """`test` names `nodeid`: its name, or its name with parameters (`name[...]`)."""
    name = name_of(nodeid)
    return name == test or name.startswith(test + "[")


def says(text, message):
    """`message`'s parts ('...' between them) appear in `text`, in order."""
    at = 0
    for part in message.split("..."):
        found = text.find(part.strip(), at)
        if found < 0:
            return False
        at = found + len(part.strip())
    return True


class Outcomes:
    def __init__(self):
        self.by_test = {}

    def pytest_runtest_logreport(self, report):
        if report.outcome == "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr)
            self.by_test[report.nodeid] = ("failed", " ".join(text.split()))
        elif report.outcome == "skipped":
            self.by_test[report.nodeid] = ("skipped", str(report.longrepr[2]))
        elif report.when == "call" and report.nodeid not in self.by_test:
            self.by_test[report.nodeid] = ("passed", "")


def judge(expected, by_test):
    """Each test's outcome against the pins: the lines to print, the wrong ones, the counts."""
    passed, singles, skipped = 0, 0, 0
    in_group = {name: 0 for name in expected.groups}
    lines, wrong, used = [], [], set()
    for nodeid, (outcome, detail) in sorted(by_test.items()):
        failure = next((f for f in expected.failures if matches(nodeid, f[0])), None)
        skip = next((s for s in expected.skips if matches(nodeid, s[0])), None)
        if failure is not None:
            used.add(("fail", failure[0]))
            test, message, reason, group = failure
            if outcome != "failed":
                wrong.append(f"UNEXPECTED {outcome.upper()} {nodeid} (listed to fail with {message!r}): "
                             "take it off the list")
            elif not says(detail, message):
                wrong.append(f"FAILED DIFFERENTLY {nodeid}: expected {message!r}, got {detail[:400]!r}")
            elif group is not None:
                in_group[group] += 1
            else:
                singles += 1
                lines.append(f"expected failure: {nodeid}: {reason}")
        elif skip is not None:
            used.add(("skip", skip[0]))
            if outcome != "skipped" or not says(detail, skip[1]):
                wrong.append(f"NOT SKIPPED AS LISTED {nodeid}: {outcome} {detail[:200]!r}, listed {skip[1]!r}")
            else:
                skipped += 1
                lines.append(f"skipped by moto: {nodeid}: {detail}")
        elif outcome == "passed":
            passed += 1
        elif outcome == "skipped":
            wrong.append(f"UNEXPECTED SKIP {nodeid}: {detail}")
        else:
            wrong.append(f"UNEXPECTED FAILURE {nodeid}: {detail[:400]}")
    for test, *_ in expected.failures:
        if ("fail", test) not in used:
            wrong.append(f"LISTED, NO SUCH TEST {test}: take it off the list")
    for test, _ in expected.skips:
        if ("skip", test) not in used:
            wrong.append(f"LISTED SKIP, NO SUCH TEST {test}: take it off the list")
    if len(by_test) != expected.total:
        wrong.append(f"TESTS RUN {len(by_test)}, the file pins {expected.total}")
    counts = dict(total=len(by_test), passed=passed, singles=singles, groups=in_group, skipped=skipped)
    return lines, wrong, counts


def self_test():
    """Each promise of the file broken on purpose, on made-up outcomes: the judge says so."""
    pins = ["tests 4", "group g | a group", "f.py::t_group | boom...here | group g",
            "f.py::t_single | assert 1 == 2 | a reason", "skip f.py::t_skip | no server mode"]
    good = {"tests/test_ecs/f.py::t_group[a]": ("failed", "boom, right here"),
            "tests/test_ecs/f.py::t_single": ("failed", "AssertionError: assert 1 == 2"),
            "tests/test_ecs/f.py::t_skip": ("skipped", "Skipped: no server mode"),
            "tests/test_ecs/f.py::t_ok": ("passed", "")}
    _, wrong, counts = judge(Expected("pins", pins), good)
    assert wrong == [] and counts["passed"] == 1 and counts["groups"] == {"g": 1}, (wrong, counts)
    cases = {
        "FAILED DIFFERENTLY": {"tests/test_ecs/f.py::t_single": ("failed", "KeyError: 'x'")},
        "FAILED DIFFERENTLY f.py::t_group": {"tests/test_ecs/f.py::t_group[a]": ("failed", "here boom")},
        "UNEXPECTED PASSED": {"tests/test_ecs/f.py::t_single": ("passed", "")},
        "UNEXPECTED FAILURE": {"tests/test_ecs/f.py::t_ok": ("failed", "new")},
        "NOT SKIPPED AS LISTED": {"tests/test_ecs/f.py::t_skip": ("passed", "")},
        "UNEXPECTED SKIP": {"tests/test_ecs/f.py::t_ok": ("skipped", "Skipped: why")},
    }
    for said, change in cases.items():
        _, wrong, _ = judge(Expected("pins", pins), {**good, **change})
        assert any(w.startswith(said.split(" f.py")[0]) for w in wrong), (said, wrong)
    gone = {k: v for k, v in good.items() if "t_single" not in k}
    _, wrong, _ = judge(Expected("pins", pins), gone)
    assert any(w.startswith("LISTED, NO SUCH TEST f.py::t_single") for w in wrong), wrong
    assert any(w.startswith("TESTS RUN 3") for w in wrong), wrong
    print("self-test: the judge caught each broken pin (7 cases)")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    endpoint, tests, path = sys.argv[1:4]
    # moto's harness reads these when it is imported: before pytest collects anything.
    os.environ.update(TEST_SERVER_MODE="true", TEST_SERVER_MODE_ENDPOINT=endpoint,
                      AWS_DEFAULT_REGION="us-east-1")
    import pytest
    expected = Expected(path)
    outcomes = Outcomes()
    os.chdir(tests)
    pytest.main(["-p", "no:cacheprovider", "-q", "--no-header", "-o", "console_output_style=classic", *FILES],
                plugins=[outcomes])
    lines, wrong, c = judge(expected, outcomes.by_test)
    for line in lines + wrong:
        print(line)
    version = open(os.path.join(tests, ".version")).read().strip()
    in_groups = sum(c["groups"].values())
    groups = ", ".join(f"{name} {n}" for name, n in c["groups"].items())
    print(f"moto {version} ECS suite: {c['total']} tests: {c['passed']} passed, {c['singles'] + in_groups} "
          f"expected failures ({c['singles']} single tests, {in_groups} in groups: {groups}), "
          f"{c['skipped']} skipped by moto in server mode, {len(wrong)} unexpected")
    sys.exit(1 if wrong else 0)


main()
