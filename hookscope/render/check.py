"""``hookscope check`` drawn three ways, all from its JSON document: a table of rules, JUnit
XML, GitHub annotations."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.core.errors import HookscopeError, param
from hookscope.core.files import Output, resolve_output
from hookscope.render.tables import DataTable, fmt_float, header, joined

Doc = Mapping[str, Any]

#: Offenders listed per rule in the table and in a GitHub annotation (JSON and JUnit: all).
SHOWN = 10
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def limit_text(limit: Any) -> str:
    """A rule's limit in a few characters: a number, a path, or a count of inputs."""
    if isinstance(limit, Mapping):
        return f"{len(limit)} input{'s' if len(limit) != 1 else ''}"
    if isinstance(limit, float):
        return fmt_float(limit)
    return Path(limit).name if isinstance(limit, str) else str(limit)  # a baseline's path


def _shown(rule: Mapping[str, Any]) -> list[str]:
    """A rule's first :data:`SHOWN` offenders, then how many more there are."""
    rest = len(rule["offenders"]) - SHOWN
    more = [f"... and {rest} more (all in --format json or --junit)"] if rest > 0 else []
    return rule["offenders"][:SHOWN] + more


def rules_table(doc: Doc) -> DataTable:
    """One row per rule: its name, PASS or FAIL, its limit and what was found."""
    table = DataTable(["rule", "result", "limit", "detail"])
    for rule in doc["rules"]:
        result = Text("pass", style="green") if rule["passed"] else \
            Text("FAIL", style="bold red")
        table.add_row(rule["rule"], result, limit_text(rule["limit"]), rule["detail"])
    return table


def offenders_table(doc: Doc) -> DataTable:
    """The offending calls or inputs of each failed rule (the first :data:`SHOWN`)."""
    table = DataTable(["rule", "offending call or input"], title="offenders")
    for rule in doc["rules"]:
        lines = [] if rule["passed"] else _shown(rule)
        for i, line in enumerate(lines):
            table.add_row(rule["rule"] if i == 0 else "", line,
                          end_section=i == len(lines) - 1)
    return table


def verdict(doc: Doc) -> Text:
    """``passed: all 6 rules`` in green, or ``FAILED: 2 of 6 rules (a, b)`` in red."""
    failed = [r["rule"] for r in doc["rules"] if not r["passed"]]
    if not failed:
        return Text(f"passed: all {len(doc['rules'])} rules", style="bold green")
    return Text(f"FAILED: {len(failed)} of {len(doc['rules'])} rules ({', '.join(failed)})",
                style="bold red")


def log_header(doc: Doc) -> Text:
    """A training log's check: the model, the log, its logging steps, the rows checked."""
    span = f" (steps {doc.get('first_step')} to {doc.get('last_step')})" \
        if doc.get("logging_steps") else ""
    return joined((str(doc.get("model")), "bold"), (f"log: {doc['log']}", "cyan"),
                  f"logging steps: {doc.get('logging_steps')}{span}",
                  f"layer calls checked: {doc.get('calls', 0)}")


def check_view(doc: Doc) -> RenderableType:
    """The whole ``check`` table output."""
    top = log_header(doc) if doc.get("log") is not None else \
        header(doc, f"layer calls: {doc.get('calls', 0)}")
    offenders = offenders_table(doc)
    return Group(top, rules_table(doc), *([offenders] if offenders.rows else []), verdict(doc))


def _xml_text(text: Any) -> str:
    """``text`` without what XML 1.0 cannot hold (control characters, lone surrogates)."""
    return _NOT_XML.sub("\ufffd", str(text))


def junit_xml(doc: Doc) -> str:
    """A JUnit XML report, in the shape GitLab, Jenkins and GitHub's test-report actions read::

        <testsuites name tests failures errors>
          <testsuite name="hookscope check" tests failures errors skipped>
            <properties>...</properties>
            <testcase classname="hookscope.check.<model>" name="<rule>">
              <failure message="<detail>" type="<rule>">offenders, one a line</failure>
    """
    rules = doc["rules"]
    counts = {"tests": str(len(rules)), "failures": str(sum(not r["passed"] for r in rules)),
              "errors": "0"}
    root = ET.Element("testsuites", {"name": "hookscope check", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "hookscope check", **counts,
                                              "skipped": "0"})
    props = ET.SubElement(suite, "properties")
    found = {"model": doc.get("model"), "weights": (doc.get("weights") or {}).get("loaded"),
             "device": doc.get("device"), "rules_file": doc.get("rules_file")}
    for key, value in found.items():
        if value is not None:
            ET.SubElement(props, "property", {"name": key, "value": _xml_text(value)})
    # The model's name as one part of the class name: test reporters split it at dots.
    classname = "hookscope.check." + re.sub(r"[^A-Za-z0-9_-]+", "_", str(doc.get("model") or "model"))
    for rule in rules:
        case = ET.SubElement(suite, "testcase", {"classname": classname, "name": rule["rule"],
                                                 "time": "0"})
        if rule["passed"]:
            ET.SubElement(case, "system-out").text = _xml_text(rule["detail"])
            continue
        failure = ET.SubElement(case, "failure", {"message": _xml_text(rule["detail"]),
                                                  "type": rule["rule"]})
        failure.text = _xml_text("\n".join([rule["detail"], *rule["offenders"]]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def resolve_junit(path: Path | str | None, output: Path | str | None, *,
                  force: bool) -> Output | None:
    """Where the JUnit file goes, checked before the model loads (None: not asked for); a
    path that cannot be written, or the report's own output, is a :class:`HookscopeError`."""
    if path is None:
        return None
    if str(path) == "-" and (output is None or str(output) == "-"):
        raise HookscopeError(f"{param('junit')} - and the report would both go to stdout; "
                             f"give {param('junit')} a file, or the report {param('output')}.")
    if output is not None and str(path) != "-" and str(output) != "-" and \
            Path(path).resolve() == Path(output).resolve():
        raise HookscopeError(f"{param('junit')} and {param('output')} name the same file "
                             f"{str(path)!r}; give two files.")
    return resolve_output(path, force=force)


def escape_data(text: str) -> str:
    """A workflow command's message, escaped as GitHub's toolkit does."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property (``title=``), escaped as GitHub's toolkit does."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(kind: str, title: str, lines: Sequence[str]) -> str:
    return f"::{kind} title={escape_property(title)}::{escape_data(chr(10).join(lines))}\n"


def github_annotations(doc: Doc) -> str:
    """One ``::error`` line per failed rule (its detail and first offenders), then a
    ``::notice`` with the verdict."""
    out = [_annotation("error", f"hookscope check: {rule['rule']}",
                       [rule["detail"], *_shown(rule)])
           for rule in doc["rules"] if not rule["passed"]]
    failed = [r["rule"] for r in doc["rules"] if not r["passed"]]
    what = f"{len(failed)} of {len(doc['rules'])} rules failed ({', '.join(failed)})" \
        if failed else f"all {len(doc['rules'])} rules passed"
    out.append(_annotation("notice", "hookscope check", [f"{doc.get('model')}: {what}"]))
    return "".join(out)
