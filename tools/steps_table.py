#!/usr/bin/env python3
"""Print the Markdown table of the optimization steps in docs/results/steps.json.

Each entry becomes one row: its id and kind, the commit, the change, the prediction, what was
measured (before -> after for each case, or the observed figures) and the record it came from.
The write-up in docs/optimization/ holds these tables between marker comments, so a reader sees
the JSON's figures and nothing typed by hand:

    <!-- steps-table part=decode -->
    ...the table this script prints for --part decode...
    <!-- /steps-table -->

    python3 tools/steps_table.py --part decode          # print the table
    python3 tools/steps_table.py --write docs/optimization/decode.md   # refresh every marked table
    python3 tools/steps_table.py --check docs/optimization/decode.md   # exit 1 if one differs

An entry's `part` names the page it belongs to (`layer` for the fused layer's steps); entries
without one are the decode kernel's (`decode`). Nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_JSON = os.path.join(ROOT, "docs", "results", "steps.json")
DEFAULT_PART = "decode"
BEGIN = re.compile(r"^<!-- steps-table part=(\w+) -->$")
END = "<!-- /steps-table -->"
HEADER = ("| id | kind | commit | change | prediction | before -> after | source |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")


def load_entries(path: str) -> list:
    with open(path) as f:
        return json.load(f)["entries"]


def entry_part(entry: dict) -> str:
    return entry.get("part", DEFAULT_PART)


def number(v) -> str:
    """A measured value as the JSON holds it: floats without trailing zeros, lists as a / b."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, "g")
    if isinstance(v, list):
        return " / ".join(number(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {number(x)}" for k, x in v.items())
    return str(v)


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def measured_case(m: dict) -> str:
    if "before" in m and "after" in m:
        line = f"{m['case']}: {number(m['before'])} -> {number(m['after'])}"
        return line + (f" ({m['result']})" if "result" in m else "")
    return f"{m['case']}: {number(m.get('result', '-'))}"


def outcome(entry: dict) -> str:
    """The before -> after cell: each case, or the figures of an observation, then the note."""
    parts = [measured_case(m) for m in entry.get("measured", [])]
    parts += [f"{k}: {number(v)}" for k, v in entry.get("figures", {}).items()]
    text = "<br>".join(cell(p) for p in parts) or "-"
    text = f"[{cell(entry['unit'])}]<br>{text}" if entry.get("unit") else text
    if entry.get("note"):
        text += f"<br>*{cell(entry['note'])}*"
    return text


def sources(entry: dict) -> str:
    src = entry.get("source", [])
    src = [src] if isinstance(src, str) else src
    return "<br>".join(f"`{cell(s)}`" for s in src) or "-"


REQUIRED = ("id", "kind", "commit", "change")


def row(entry: dict) -> str:
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        name = entry.get("id", "(no id)")
        raise ValueError(f"steps.json entry {name!r} lacks {', '.join(missing)}")
    cells = (f"`{entry['id']}`", entry["kind"], f"`{entry['commit']}`", cell(entry["change"]),
             cell(entry.get("prediction") or "-"), outcome(entry), sources(entry))
    return "| " + " | ".join(cells) + " |"


def table(entries: list, part: str) -> str:
    rows = [row(e) for e in entries if entry_part(e) == part]
    if not rows:
        raise ValueError(f"steps.json has no entries with part {part!r}")
    return "\n".join([HEADER] + rows)


def marked_tables(lines: list, path: str) -> list:
    """(first line, end line, part) of each table between the marker comments of a file."""
    found, start, part = [], None, None
    for i, line in enumerate(lines):
        m = BEGIN.match(line.strip())
        if m:
            if start is not None:
                raise ValueError(f"{path}:{i + 1}: a steps-table marker inside another")
            start, part = i, m.group(1)
        elif line.strip() == END:
            if start is None:
                raise ValueError(f"{path}:{i + 1}: {END} without a start marker")
            found.append((start, i, part))
            start = None
    if start is not None:
        raise ValueError(f"{path}:{start + 1}: steps-table marker without {END}")
    if not found:
        raise ValueError(f"{path}: no '<!-- steps-table part=NAME -->' marker")
    return found


def refresh(text: str, entries: list, path: str) -> str:
    """The file's text with every marked table replaced by what the JSON gives."""
    lines = text.split("\n")
    for start, end, part in reversed(marked_tables(lines, path)):
        lines[start + 1:end] = table(entries, part).split("\n")
    return "\n".join(lines)


def check(path: str, entries: list) -> int:
    with open(path) as f:
        text = f.read()
    want = refresh(text, entries, path)
    if want == text:
        print(f"{path}: the steps tables match steps.json")
        return 0
    print(f"{path}: a steps table differs from steps.json; refresh it with\n"
          f"  python3 tools/steps_table.py --write {path}", file=sys.stderr)
    return 1


def write(path: str, entries: list) -> None:
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(refresh(text, entries, path))
    print(f"wrote the steps tables of {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=STEPS_JSON,
                    help="the steps file (default: docs/results/steps.json of this checkout)")
    ap.add_argument("--part", default=DEFAULT_PART,
                    help="print the table of the entries of this part (default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", metavar="FILE",
                      help="exit 1 when a table between FILE's markers differs from the JSON")
    mode.add_argument("--write", metavar="FILE", help="replace the tables between FILE's markers")
    args = ap.parse_args(argv)
    try:
        entries = load_entries(args.json)
        if args.check:
            return check(args.check, entries)
        if args.write:
            write(args.write, entries)
        else:
            print(table(entries, args.part))
    except (OSError, ValueError) as e:
        print(f"steps_table.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
