"""dpstream installed from a wheel (``pip install``, not editable) starts its local broker:
``deploy/pom.xml`` and ``deploy/log4j2.properties`` are package data, the jars and the
broker's whereabouts go under ``DPSTREAM_HOME`` (never site-packages), and ``broker start
--data DIR`` restarts a broker on its old data and ports (``broker stop`` keeps DIR).
Before, ``dpstream broker start`` from a wheel failed: the pom was not packaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from dpstream.deploy.broker import REPO_ROOT

pytestmark = pytest.mark.integration

QUIET = {"log_level": 0}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(  # its build backend as pyproject.toml asks, from pip's cache
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(out), str(REPO_ROOT)],
        check=True, capture_output=True, timeout=600, cwd=out,
    )  # fmt: skip
    (built,) = out.glob("dpstream-*.whl")
    return built


def test_the_wheel_holds_the_pom_and_the_log_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dpstream/deploy/pom.xml", "dpstream/deploy/log4j2.properties"} <= names
    assert "dpstream/config/demo.yaml" in names


def installed(wheel: Path, where: Path) -> Path:
    """A fresh venv with the wheel installed (``--no-deps``); its dependencies are this
    interpreter's, appended to its path by a .pth line (a path added so processes no .pth
    of its own: the project's editable install stays out of it)."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_an_installed_dpstream_starts_its_broker_and_restarts_it_on_its_data(wheel, tmp_path):
    python = installed(wheel, tmp_path)
    home, data = tmp_path / "home", tmp_path / "kafka-data"
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {"DPSTREAM_HOME": str(home)}
    where = subprocess.run(
        [str(python), "-c", "import dpstream.deploy.broker as b; print(b.POM_FILE)"],
        check=True, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(tmp_path / "venv"))  # the wheel's, not the checkout's

    def dpstream(*args: str) -> str:
        out = subprocess.run(
            [str(python), "-m", "dpstream.pipeline.tools.cli", "broker", *args],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    try:
        dpstream("start", "--data", str(data))
        first = json.loads((home / ".dpstream" / "broker.json").read_text())["bootstrap"]
        admin = AdminClient({"bootstrap.servers": first, **QUIET})
        for future in admin.create_topics([NewTopic("kept", 1, 1)]).values():
            future.result(timeout=30)
        assert f"its data is kept in {data}" in dpstream("stop")
        assert (data / "server.properties").is_file()
        dpstream("start", "--data", str(data))
        again = json.loads((home / ".dpstream" / "broker.json").read_text())["bootstrap"]
        assert again == first  # its clients know only that address
        topics = AdminClient({"bootstrap.servers": again, **QUIET}).list_topics(timeout=30).topics
        assert "kept" in topics
    finally:
        dpstream("stop")
    assert (home / ".dpstream" / "cache" / "kafka-4.1.1").is_dir()  # not in site-packages
    assert data.is_dir()
