"""The README and docs/ hold together: every relative link and anchor resolves, every repository
path they name in code spans exists, and the README gives the commands CI and newcomers run.

Offline and fast: it reads files only (no binary, no network). Links to other sites (`https:`,
`mailto:`) are not followed.
"""

from __future__ import annotations

import pathlib
import re
from collections import Counter

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The top-level directories and files a path in a code span may start with to be checked.
REPO_TOPS = ("src/", "crates/", "tests/", "scripts/", "docs/", "benches/", "fuzz/", "conf/",
             "dashboards/", "deploy/", "examples/", ".ci/")

# Paths that exist only once something has run (git ignores them).
GENERATED = {"tests/python/artifacts/"}

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def doc_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1).startswith(fence[0]) and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if fence is None:
            yield n, line


def without_code_spans(line: str) -> str:
    return CODE_SPAN.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs (numbered when repeated) and HTML ids."""
    text = path.read_text()
    seen: Counter[str] = Counter()
    out = set(HTML_ANCHOR.findall(text))
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            out.add(s if seen[s] == 0 else f"{s}-{seen[s]}")
            seen[s] += 1
    return out


def links(path: pathlib.Path):
    """(line number, target) of every link in a page's prose."""
    for n, line in prose_lines(path.read_text()):
        bare = without_code_spans(line)
        for target in INLINE_LINK.findall(bare):
            yield n, target
        m = REF_DEF.match(bare)
        if m:
            yield n, m.group(1)


def broken_links(files: list[pathlib.Path], root: pathlib.Path) -> list[str]:
    """Each relative link whose file does not exist, or whose #anchor the target page lacks."""
    broken = []
    cache: dict[pathlib.Path, set[str]] = {}
    for page in files:
        for n, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # https:, mailto:, …: another site
            where = f"{page.relative_to(root)}:{n}: {target}"
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page.resolve()
            if not dest.exists():
                broken.append(f"{where} (no such file)")
                continue
            if fragment and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if fragment not in cache[dest]:
                    broken.append(f"{where} (no heading or anchor #{fragment} in {dest.name})")
    return broken


def missing_paths(files: list[pathlib.Path], root: pathlib.Path) -> list[str]:
    """Repository paths named in code spans (`src/proxy/api.rs`) that do not exist. Templates
    (`<format>`, `*`, `…`), what the tests write (`GENERATED`) and anything outside the
    repository's top-level folders are skipped."""
    missing = []
    for page in files:
        for n, line in prose_lines(page.read_text()):
            for _, span in CODE_SPAN.findall(line):
                path = span.strip().split()[0] if span.strip() else ""
                path = path.rstrip(".,:;)")
                if not path.startswith(REPO_TOPS) or path in GENERATED or re.search(r"[<>*…{}$]", path):
                    continue
                path = path.split("#")[0].split("::")[0]
                if not (root / path).exists():
                    missing.append(f"{page.relative_to(root)}:{n}: {path}")
    return missing


@pytest.mark.smoke
def test_every_relative_link_and_anchor_resolves():
    broken = broken_links(doc_files(), ROOT)
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.smoke
def test_every_repository_path_named_in_the_docs_exists():
    missing = missing_paths(doc_files(), ROOT)
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_the_checker_finds_what_is_broken(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "here.rs").write_text("")
    (tmp_path / "README.md").write_text(
        "# Quipu · the gateway\n\n## Run it (twice)\n\n## Run it (twice)\n\n"
        "[ok](docs/a.md#tenants-keys-and-money) [ok](#run-it-twice-1) [ok](#quipu--the-gateway)\n"
        "[gone](docs/missing.md) [bad anchor](docs/a.md#nowhere) [web](https://example.com/x)\n"
        "`src/here.rs` `src/gone.rs` `docs/benchmarks-<date>.md` `/etc/quipu/tls.pem`\n"
        "```sh\n[in a fence](docs/nothing.md) `src/fenced.rs`\n```\n"
        "`[in a code span](docs/nothing.md)`\n"
    )
    (tmp_path / "docs" / "a.md").write_text("# Tenants, keys and money\n\n[up](../README.md#run-it-twice)\n")
    files = [tmp_path / "README.md", tmp_path / "docs" / "a.md"]
    assert broken_links(files, tmp_path) == [
        "README.md:8: docs/missing.md (no such file)",
        "README.md:8: docs/a.md#nowhere (no heading or anchor #nowhere in a.md)",
    ]
    assert missing_paths(files, tmp_path) == ["README.md:9: src/gone.rs"]


@pytest.mark.parametrize("command", ["./scripts/run.sh --demo", "./scripts/test.sh"])
def test_the_readme_gives_the_demo_and_the_test_command(command):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M)
    assert any(command in b.splitlines() for b in blocks), f"README.md has no ```sh block with `{command}`"
    script = ROOT / command.split()[0]
    assert script.is_file() and script.stat().st_mode & 0o111, f"{script} is not an executable script"


def test_ci_runs_the_readme_test_command():
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines() if not l.lstrip().startswith("#")]
    assert "./scripts/test.sh" in ci, ".ci/run must call ./scripts/test.sh, the README's test command"


def test_the_readme_stays_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines; move detail to a page in docs/"
