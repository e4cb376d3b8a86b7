"""Every relative link in README.md, docs/ and evidence/'s pages names a file that exists and, where it names an
anchor, a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens; lines in code
fences are no headings). A guide split by task keeps its readers' links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
GUIDE_MAX_LINES = 300  # a guide longer than this is split by task


def anchors(page: Path) -> set[str]:
    out, fence = set(), False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "evidence").glob("*.md"))]


def test_every_relative_link_names_a_file_and_an_anchor_that_exist():
    bad = []
    for page in pages():
        for m in LINK.finditer(page.read_text()):
            path, _, anchor = m.group(1).partition("#")
            if m.group(1).startswith(("http://", "https://", "mailto:")):
                continue
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                bad.append(f"{page.relative_to(ROOT)}: {m.group(1)} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                bad.append(f"{page.relative_to(ROOT)}: {m.group(1)} (no such heading)")
    assert bad == []


def test_no_guide_is_longer_than_a_task_needs():
    long = [
        f"{p.name}: {n}"
        for p in (ROOT / "docs" / "guides").glob("*.md")
        if (n := len(p.read_text().splitlines())) > GUIDE_MAX_LINES
    ]
    assert long == [], f"split these guides by task: {long}"
