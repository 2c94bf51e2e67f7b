"""README.md and the results pages of docs/ show every results table exactly as its file in
bench/results/ holds it (what bench/update_readme.py copies between the ``<!-- NAME -->``
markers), each table in one document only."""

import update_readme

from tests.bench.conftest import REPO, RESULTS


def test_every_table_is_in_one_document_and_equals_its_results_file():
    texts = {doc: (REPO / doc).read_text() for doc in update_readme.DOCS}
    for doc, tables in update_readme.DOCS.items():
        for key in update_readme.TABLES:
            count = 1 if key in tables else 0
            assert texts[doc].count(f"<!-- {key} -->") == count, (doc, key)
            assert texts[doc].count(f"<!-- /{key} -->") == count, (doc, key)
        rendered = update_readme.render(texts[doc], RESULTS, tables, doc)
        assert rendered == texts[doc], f"{doc} is stale: run bench/update_readme.py"


def test_update_readme_replaces_only_between_markers(tmp_path, monkeypatch):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in update_readme.TABLES.values():
        (tmp_path / "bench" / "results" / name).write_text(f"table {name}\n")
    for doc, tables in update_readme.DOCS.items():
        blocks = [f"<!-- {k} -->\nold\n<!-- /{k} -->" for k in tables]
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text("intro\n" + "\ntext\n".join(blocks) + "\nend\n")
    monkeypatch.setattr(update_readme, "ROOT", tmp_path)
    assert update_readme.main(["--check"]) == 1  # stale, and left as it is
    assert all("old" in (tmp_path / doc).read_text() for doc in update_readme.DOCS)
    assert update_readme.main([]) == 0
    assert update_readme.main(["--check"]) == 0
    for doc, tables in update_readme.DOCS.items():
        new = (tmp_path / doc).read_text()
        assert new.startswith("intro\n") and new.endswith("\nend\n") and "old" not in new
        for key, name in tables.items():
            assert f"<!-- {key} -->\ntable {name}\n<!-- /{key} -->" in new


def test_a_missing_marker_names_the_document(tmp_path):
    (tmp_path / "p3.md").write_text("t\n")
    try:
        update_readme.render("no markers", tmp_path, {"P3_TABLE": "p3.md"}, "docs/x.md")
    except SystemExit as err:
        assert "docs/x.md has no <!-- P3_TABLE -->" in str(err)
    else:
        raise AssertionError("render accepted a document without the table's markers")
