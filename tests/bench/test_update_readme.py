"""README.md shows every results table exactly as its file in bench/results/ holds it (what
bench/update_readme.py copies between the ``<!-- NAME -->`` markers)."""

import update_readme

from tests.bench.conftest import REPO, RESULTS


def test_readme_tables_equal_their_results_files():
    readme = (REPO / "README.md").read_text()
    for key in update_readme.TABLES:
        assert readme.count(f"<!-- {key} -->") == 1 and readme.count(f"<!-- /{key} -->") == 1
    assert update_readme.render(readme, RESULTS) == readme, "run bench/update_readme.py"


def test_update_readme_replaces_only_between_markers(tmp_path, monkeypatch):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in update_readme.TABLES.values():
        (tmp_path / "bench" / "results" / name).write_text(f"table {name}\n")
    blocks = [f"<!-- {k} -->\nold\n<!-- /{k} -->" for k in update_readme.TABLES]
    (tmp_path / "README.md").write_text("intro\n" + "\ntext\n".join(blocks) + "\nend\n")
    monkeypatch.setattr(update_readme, "ROOT", tmp_path)
    assert update_readme.main(["--check"]) == 1  # stale, and left as it is
    assert "old" in (tmp_path / "README.md").read_text()
    assert update_readme.main([]) == 0
    assert update_readme.main(["--check"]) == 0
    new = (tmp_path / "README.md").read_text()
    assert new.startswith("intro\n") and new.endswith("\nend\n") and "old" not in new
    for key, name in update_readme.TABLES.items():
        assert f"<!-- {key} -->\ntable {name}\n<!-- /{key} -->" in new
