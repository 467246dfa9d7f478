"""Running the checks of `tfdtape.cli.checks` and reporting them.

`run_check` runs one check in every configuration and judges it; the
writers turn results into the console report, JSON and JUnit XML.
"""

import dataclasses
import json
import time
import xml.etree.ElementTree as ElementTree

from tfdtape import testing
from tfdtape.cli import checks as checks_lib

PASS = "PASS"
FAIL = "FAIL"
NOT_DISCRIMINATING = "NOT DISCRIMINATING"
JUDGED = testing.PATCHED_CONFIGURATIONS


@dataclasses.dataclass
class CheckResult:
    """The outcome of one check.

    Attributes:
        check: the check that ran.
        observations: configuration name -> what the check observed there.
        status: PASS, FAIL or NOT DISCRIMINATING.
        message: why it did not pass ('' when it passed).
        seconds: wall time over all configurations.
    """
    check: checks_lib.Check
    observations: dict[str, str]
    status: str
    message: str
    seconds: float

    def configuration_failure(self, configuration):
        """Why `configuration`'s observation is wrong, or '' when it is right.

        Stock TensorFlow is informational and never fails.
        """
        observed = self.observations[configuration]
        expected = self.check.expected
        if configuration in JUDGED and observed != expected:
            return f"expected {expected!r}, observed {observed!r}"
        if (configuration == "pre_seed" and self.check.discriminating and
                observed == expected):
            return (f"the pre-seed control also observed {observed!r}, so this "
                    "check cannot tell tfdtape from no tfdtape")
        return ""


def run_check(check, strategy):
    """Runs `check` in every configuration and judges it."""
    start = time.perf_counter()
    observations = {}
    for configuration in testing.CONFIGURATIONS:
        with testing.configuration(configuration):
            observations[configuration] = checks_lib.observe_safely(check, strategy)
    result = CheckResult(check, observations, PASS, "",
                         time.perf_counter() - start)
    reasons = {configuration: result.configuration_failure(configuration)
               for configuration in (*JUDGED, "pre_seed")}
    failures = [f"{configuration}: {reasons[configuration]}"
                for configuration in JUDGED if reasons[configuration]]
    if failures:
        result.status, result.message = FAIL, "; ".join(failures)
    elif reasons["pre_seed"]:
        result.status, result.message = NOT_DISCRIMINATING, reasons["pre_seed"]
    return result


def result_line(result, name_width, width=100, verbose=False):
    """The console report for `result`: one line of at most `width` columns
    (name, verdict, time, one short observation), and with `verbose` one
    more line per configuration with its full observation."""
    head = f"{result.check.name:{name_width}}  {result.status:4}  {result.seconds:5.2f}s  "
    if result.status == PASS:
        note = result.observations["tfdtape"]
    else:
        note = result.message
    line = head + _shorten(note, max(width - len(head), 8))
    if verbose:
        line += "".join(f"\n    {configuration:14}{result.observations[configuration]}"
                        for configuration in testing.CONFIGURATIONS)
    return line


def _shorten(text, width):
    """`text` cut to `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[:width - 3] + "..."


def summary_lines(results, environment):
    """The closing summary: counts, versions, devices, resolver (each line
    within 100 columns but for the names of failing checks)."""
    passed = sum(result.status == PASS for result in results)
    devices = environment["devices"]
    return [
        f"{passed}/{len(results)} checks passed"
        + ("" if passed == len(results) else
           f"; failing: {', '.join(r.check.name for r in results if r.status != PASS)}"),
        f"TensorFlow {environment['tensorflow']}"
        + (" (untested)" if environment.get("tensorflow_untested") else "")
        + f", Python {environment['python']}",
        f"devices: {len(devices)} logical CPUs, {devices[0]} to {devices[-1]}",
        f"TensorFlow's native resolver: {environment['native_resolution']}",
        "A check passes when tfdtape and tfdtape_alone observe the expected "
        "value and,",
        "where it discriminates, the pre_seed control does not; stock is "
        "informational (--verbose).",
    ]


def to_json(results, environment):
    """The results as a JSON-serialisable dict."""
    return {
        "environment": environment,
        "passed": all(result.status == PASS for result in results),
        "checks": [{
            "name": result.check.name,
            "description": result.check.description,
            "status": result.status,
            "message": result.message,
            "seconds": round(result.seconds, 3),
            "expected": result.check.expected,
            "discriminating": result.check.discriminating,
            "observations": result.observations,
        } for result in results],
    }


def write_json(path, results, environment):
    with open(path, "w", encoding="utf-8") as output:
        json.dump(to_json(results, environment), output, indent=2)
        output.write("\n")


def to_junit(results, environment):
    """JUnit XML: one testcase per check and configuration."""
    suite = ElementTree.Element("testsuite", name="tfdtape.verify")
    failures = 0
    for result in results:
        for configuration in testing.CONFIGURATIONS:
            case = ElementTree.SubElement(
                suite, "testcase", classname=f"tfdtape.verify.{result.check.name}",
                name=configuration,
                time=f"{result.seconds / len(testing.CONFIGURATIONS):.3f}")
            reason = result.configuration_failure(configuration)
            if reason:
                failures += 1
                failure = ElementTree.SubElement(case, "failure", message=reason)
                failure.text = result.check.description
            out = ElementTree.SubElement(case, "system-out")
            out.text = (f"observed: {result.observations[configuration]}\n"
                        f"expected: {result.check.expected}\n"
                        + ("informational: stock TensorFlow is not judged\n"
                           if configuration == "stock" else ""))
    suite.set("tests", str(len(results) * len(testing.CONFIGURATIONS)))
    suite.set("failures", str(failures))
    properties = ElementTree.Element("properties")
    for key, value in environment.items():
        ElementTree.SubElement(properties, "property", name=key, value=str(value))
    suite.insert(0, properties)
    root = ElementTree.Element("testsuites")
    root.append(suite)
    return ElementTree.ElementTree(root)


def write_junit(path, results, environment):
    to_junit(results, environment).write(path, encoding="utf-8",
                                         xml_declaration=True)
