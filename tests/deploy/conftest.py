"""The package as a user installs it: a wheel built from the checkout, in a fresh venv.

The fresh venv gets the wheel without its dependencies and borrows them from the test's
own environment through a .pth line (no download of torch or ray per test run). That line
adds the folder to sys.path without processing the .pth files inside it, so the
checkout's editable install stays invisible: `shardline` resolves to
the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "test-output", ".shardline"
)


def outside_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would put the checkout on sys.path."""
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER: set by an embedded head of another tier (loopback
    # only); a multi-node cluster must not inherit it.
    drop = ("PYTHONPATH", "PYTHONHOME", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, **extra}


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path
    outside: Path  # a working directory that is not the checkout

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def shardline(self) -> Path:
        return self.venv / "bin" / "shardline"

    def tool(self, name: str) -> list[str]:
        """The command line of `shardline` or `ray` as this venv runs them."""
        if name == "ray":
            # Ray's CLI from this venv's interpreter, so the processes it starts (raylet
            # workers included) import the wheel, as in the image.
            return [str(self.python), "-m", "ray.scripts.scripts"]
        if name == "shardline":
            return [str(self.shardline)]
        raise KeyError(f"{name} is not installed by the image")


def build_wheel(into: Path) -> Path:
    source = into / "source"
    shutil.copytree(CHECKOUT, source, ignore=_NOT_SOURCE)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-q", "-w", str(into), str(source)], check=True, env=outside_env())
    return next(into.glob("shardline-*.whl"))


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)  # ensurepip: offline
    subprocess.run(
        [str(env_dir / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        env=outside_env(),
    )
    site = Path(
        sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)})
    )
    deps = Path(sysconfig.get_path("purelib"))
    (site / "zz-borrowed-deps.pth").write_text(f"{deps}\n")
    outside = root / "elsewhere"
    outside.mkdir()
    return InstalledWheel(wheel, env_dir, outside)
