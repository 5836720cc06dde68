"""tools/steps_table.py: the step tables of docs/optimization/ are what docs/results/steps.json
gives (CI keeps the write-up and the JSON in sync), and the check catches a table that drifts."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import steps_table  # noqa: E402

PAGES = ("decode.md", "layer.md", "sm90a.md")


def entries():
    return steps_table.load_entries(os.path.join(ROOT, "docs", "results", "steps.json"))


@pytest.mark.parametrize("page", PAGES)
def test_page_tables_match_steps_json(page, capsys):
    path = os.path.join(ROOT, "docs", "optimization", page)
    assert steps_table.main(["--check", path]) == 0, capsys.readouterr().err


def test_every_entry_lands_in_one_page_table():
    text = "".join(open(os.path.join(ROOT, "docs", "optimization", p)).read() for p in PAGES)
    for e in entries():
        assert text.count(f"| `{e['id']}` |") == 1, e["id"]


def test_ids_are_unique_and_parts_known():
    ids = [e["id"] for e in entries()]
    assert len(ids) == len(set(ids))
    assert {steps_table.entry_part(e) for e in entries()} == {"decode", "layer", "sm90a"}


def test_row_shows_each_case_before_and_after():
    e = {"id": "x", "kind": "landed", "commit": "abc1234", "change": "a | b", "unit": "us",
         "prediction": "faster", "measured": [{"case": "b 1", "before": 31.7, "after": 29.7},
                                              {"case": "b 8", "before": [1.0, 2.5], "after": 2}],
         "note": "two calls", "source": ["c:path"]}
    row = steps_table.row(e)
    assert row == ("| `x` | landed | `abc1234` | a \\| b | faster | [us]<br>b 1: 31.7 -> 29.7<br>"
                   "b 8: 1 / 2.5 -> 2<br>*two calls* | `c:path` |")


def test_entry_without_a_commit_is_named():
    with pytest.raises(ValueError, match="'x' lacks commit"):
        steps_table.row({"id": "x", "kind": "landed", "change": "c"})


def write_page(tmp_path, body):
    path = tmp_path / "page.md"
    path.write_text(body)
    return str(path)


def test_check_fails_when_a_figure_differs(tmp_path, capsys):
    good = steps_table.table(entries(), "layer")
    path = write_page(tmp_path, f"intro\n<!-- steps-table part=layer -->\n{good}\n"
                                "<!-- /steps-table -->\nend\n")
    assert steps_table.main(["--check", path]) == 0
    first = next(e for e in entries() if e.get("part") == "layer" and e.get("measured"))
    m = first["measured"][0]
    wrong = good.replace(f"{steps_table.number(m['before'])} -> ", "1234.5 -> ", 1)
    assert wrong != good
    path = write_page(tmp_path, f"<!-- steps-table part=layer -->\n{wrong}\n<!-- /steps-table -->\n")
    assert steps_table.main(["--check", path]) == 1
    assert "--write" in capsys.readouterr().err


def test_write_fills_the_markers_and_keeps_the_rest(tmp_path):
    path = write_page(tmp_path, "a\n<!-- steps-table part=decode -->\nSTALE ROW\n<!-- /steps-table -->\nz\n")
    assert steps_table.main(["--write", path]) == 0
    text = open(path).read()
    assert text.startswith("a\n<!-- steps-table part=decode -->\n| id | kind |")
    assert text.endswith("<!-- /steps-table -->\nz\n") and "STALE ROW" not in text
    assert steps_table.main(["--check", path]) == 0


@pytest.mark.parametrize("body, message", [
    ("no markers\n", "no '<!-- steps-table"),
    ("<!-- steps-table part=decode -->\n", "without <!-- /steps-table -->"),
    ("<!-- /steps-table -->\n", "without a start marker"),
    ("<!-- steps-table part=nothing -->\n<!-- /steps-table -->\n", "no entries with part 'nothing'"),
])
def test_bad_markers_are_named(tmp_path, capsys, body, message):
    assert steps_table.main(["--check", write_page(tmp_path, body)]) == 2
    assert message in capsys.readouterr().err


def test_print_is_the_json_table(tmp_path, capsys):
    data = {"entries": [{"id": "s", "kind": "observation", "commit": "c", "change": "ch",
                         "unit": "as named", "figures": {"us": [1.5, 2.0]}, "source": "p"}]}
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(data))
    assert steps_table.main(["--json", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| `s` | observation | `c` | ch | - | [as named]<br>us: 1.5 / 2 | `p` |"
