"""``deploy/local/kafka`` on a fresh data directory: what it formats the storage with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.kafka_broker import second_broker_home
from tests.kafka_helpers import free_port
from tests.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy" / "local" / "kafka"


@pytest.mark.kafka
def test_a_cluster_id_that_reads_as_an_option_is_drawn_again(tmp_path: Path) -> None:
    """A KRaft cluster id is base64url, so 1 draw in 64 starts with '-', which the storage tool
    took for an option ("expected one argument"): the start failed. One left by such an attempt is
    drawn again, and the broker starts on the data formatted with the new id."""
    home = second_broker_home(tmp_path / "kafka")
    (home / "cluster.id").write_text("-aCMNZeEEBIadg4EDfa4zg\n")
    env = {
        **os.environ,
        "KAFKA_HOME_DIR": str(home),
        "KAFKA_PORT": str(free_port()),
        "KAFKA_CONTROLLER_PORT": str(free_port()),
        "KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
        "KAFKA_START_TIMEOUT": "180",
    }
    started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        cluster_id = (home / "cluster.id").read_text().strip()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        assert f"cluster.id={cluster_id}" in (home / "data" / "meta.properties").read_text()
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
