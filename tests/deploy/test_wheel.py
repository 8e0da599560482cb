"""A non-editable install runs from any directory: page, docs assets and migrations ship."""

from __future__ import annotations

import subprocess
import zipfile

from sqlalchemy import create_engine, inspect

from tests.deploy.conftest import InstalledWheel, outside_env


def run(installed: InstalledWheel, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(installed.shardline), *args],
        cwd=installed.outside,
        env=outside_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_wheel_holds_the_page_and_the_migrations(installed_wheel: InstalledWheel) -> None:
    names = set(zipfile.ZipFile(installed_wheel.wheel).namelist())
    for shipped in (
        "shardline/api/static/page/index.html",
        "shardline/api/static/page/main.js",
        "shardline/api/static/page/app.css",
        "shardline/migrations/env.py",
        "shardline/migrations/script.py.mako",
        "shardline/migrations/versions/0001_initial_schema.py",
    ):
        assert shipped in names, f"{shipped} is not in {installed_wheel.wheel.name}"


def test_installed_package_is_the_wheel_not_the_checkout(installed_wheel: InstalledWheel) -> None:
    probe = "import shardline.api, shardline.service; print(shardline.api.__file__)"
    where = subprocess.run(
        [str(installed_wheel.python), "-c", probe],
        cwd=installed_wheel.outside,
        env=outside_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(installed_wheel.venv)), where


def test_the_wheel_installs_one_top_level_package(installed_wheel: InstalledWheel) -> None:
    """A user's own `api` or `service` module is never shadowed by installing Shardline."""
    names = zipfile.ZipFile(installed_wheel.wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"shardline"}, tops
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "shardline = shardline.api.cli:main"
        in zipfile.ZipFile(installed_wheel.wheel).read(entry).decode()
    )


def test_serve_help_and_migrate_from_outside_the_checkout(installed_wheel: InstalledWheel) -> None:
    helped = run(installed_wheel, "serve", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "SHARDLINE_RAY_ADDRESS" in helped.stdout

    url = f"sqlite:///{installed_wheel.outside / 'fresh.db'}"
    migrated = run(installed_wheel, "migrate", SHARDLINE_DATABASE_URL=url)
    assert migrated.returncode == 0, migrated.stderr
    engine = create_engine(url)
    assert {"jobs", "users", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()
