"""The README and docs/ hold together: every relative link points at a file that exists (and, with an
#anchor, at a heading of that file), and the file structure (docs/files.md) names every file of the code."""
import re

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_DIRS = ["rlcore", "launch", "recipes", "benchmarks"]


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def without_code(text: str) -> str:
    """The text outside fenced blocks and inline code spans, where a link is a link."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def anchors(path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen, ids = {}, set()
    for heading in re.findall(r"^#+ (.+)$", without_code_blocks(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def test_anchors_by_hand(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A b\n\n```\n# not a heading\n```\n## Fork a recipe: RLOO (x.py)\n### A b\n")
    assert anchors(page) == {"a-b", "fork-a-recipe-rloo-xpy", "a-b-1"}


def test_every_relative_link_resolves():
    broken, checked = [], 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            checked += 1
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no heading #{anchor} in {file.name})")
    assert not broken, broken
    assert checked >= 20  # the README links every page of docs/


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme] == []


def test_file_structure_names_every_file():
    readme = (ROOT / "docs" / "files.md").read_text()
    tree = re.search(r"## File structure\n\n```\n(.*?)```", readme, re.S).group(1)
    code, tests = tree.split("── tests/")
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.name != "__init__.py" and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    assert [str(p.relative_to(ROOT)) for p in files if not re.search(rf"(?<![\w.]){re.escape(p.name)}\b", code)] == []
    test_files = [p.stem.removeprefix("test_") for p in (ROOT / "tests").glob("test_*.py")]
    assert [t for t in test_files if not re.search(rf"(?<![a-z0-9]){t}(?![a-z0-9_])", tests)] == []
