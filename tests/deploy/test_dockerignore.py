""".dockerignore against the Dockerfile: nothing the image copies is left out of the
build context, and what must never reach it (environments, state, secrets) is."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.deploy.conftest import CHECKOUT

DOCKERFILE = CHECKOUT / "Dockerfile"


def rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception, regex) per pattern, in order, as Docker reads .dockerignore:
    `*` and `?` within one path segment, `**` across any number, `!` re-includes."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = pattern.strip("/").removeprefix("./")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        out.append((negate, re.compile(regex)))
    return out


def excluded(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `path` out: the last pattern matching it, or a folder above
    it, decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negate, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            result = not negate
    return result


def copied_sources(dockerfile: str) -> list[str]:
    """The build-context paths of every COPY/ADD without --from."""
    sources = []
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        words = shlex.split(line.strip()) if line.strip() else []
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        assert not any(w.startswith("--from") for w in words), line
        sources += [a.removeprefix("./").rstrip("/") for a in args[:-1]]
    return sources


def files_under(source: str) -> list[str]:
    """The checkout's files (tracked, or new and not git-ignored) at or under `source`."""
    listed = subprocess.run(
        ["git", "-C", str(CHECKOUT), "ls-files", "-co", "--exclude-standard", "--", source],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return [f for f in listed.stdout.splitlines() if (CHECKOUT / f).exists()]


@pytest.fixture(scope="module")
def patterns() -> list[tuple[bool, re.Pattern[str]]]:
    return rules((CHECKOUT / ".dockerignore").read_text())


def test_nothing_the_dockerfile_copies_is_ignored(
    patterns: list[tuple[bool, re.Pattern[str]]],
) -> None:
    sources = copied_sources(DOCKERFILE.read_text())
    assert {"pyproject.toml", "api", "migrations", "src", "examples"} <= set(sources)
    for source in sources:
        assert (CHECKOUT / source).exists(), source
        assert not excluded(source, patterns), f".dockerignore leaves out {source}"
        files = files_under(source)
        assert files, source
        left_out = [f for f in files if excluded(f, patterns)]
        assert not left_out, f".dockerignore leaves out what COPY {source} needs: {left_out}"


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".env",
        ".shardline/admin-token",
        "api/.shardline/shardline.db",
        "data/corpus.txt",
        "api/__pycache__/app.cpython-311.pyc",
        "service/config.pyc",
        ".mypy_cache/3.11/x.json",
        "shardline.egg-info/PKG-INFO",
        "web/node_modules/x/index.js",
        "test-output/report.xml",
        "tests/unit/test_spec.py",
    ],
)
def test_what_must_not_reach_the_build_is_ignored(
    patterns: list[tuple[bool, re.Pattern[str]]], path: str
) -> None:
    assert excluded(path, patterns)


def test_the_matcher_reads_patterns_as_docker_does() -> None:
    read = rules("data\n**/*.pyc\n!keep/*.pyc\nsrc/*/x")
    assert excluded("data/a/b", read) and not excluded("workers/data/a", read)
    assert excluded("a/b/c.pyc", read) and not excluded("keep/c.pyc", read)
    assert excluded("src/one/x", read) and not excluded("src/one/two/x", read)


def test_copy_sources_are_parsed() -> None:
    text = "FROM x\nCOPY a b ./\nCOPY --chown=1 c \\\n  /d\nADD e /f\nRUN COPY g\n"
    assert copied_sources(text) == ["a", "b", "c", "e"]
