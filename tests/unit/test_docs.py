"""The documentation a newcomer reads stays whole: every link in README.md and docs/
resolves (files and their headings), every server setting is documented, and the README
stays a few screens long and points to the topic pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardline.service.config import Settings

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces
    as dashes."""
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = []
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        env = alias if isinstance(alias, str) else f"SHARDLINE_{name.upper()}"
        if f"`{env}`" not in text:
            missing.append(env)
    assert missing == []


def test_the_readme_fits_on_a_few_screens_and_points_to_the_topics() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme
    topics = {t for t in LINK.findall(readme) if t.startswith("docs/") and t.endswith(".md")}
    assert len(topics) >= 4, topics
