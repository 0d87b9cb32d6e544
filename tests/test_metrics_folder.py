"""
The metrics folder of a parent of workers killed by SIGKILL is left
behind; the next parent to start removes it, and only such folders: never
a running server's, another user's, or anything not named as the server
names its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from twisted.internet.task import Clock

from authsrv.config import ConfigSource
from authsrv.workers import METRICS_DIR_ENV, Supervisor


def killed_process() -> int:
    """The pid of a process started here and killed with SIGKILL, as a parent of workers may be."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    process.kill()
    process.wait()
    return process.pid


async def nothing_to_prepare():
    return None


def test_a_starting_parent_removes_the_metrics_folders_of_killed_parents_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f"authsrv-metrics-{killed_process()}-k1lled_x"
        (dead / "counter_123.db").parent.mkdir()
        (dead / "counter_123.db").write_bytes(b"counts")
        kept = [tmp_path / f"authsrv-metrics-{running.pid}-running1", tmp_path / f"authsrv-metrics-{os.getpid()}-itself_1",
                tmp_path / "authsrv-metrics-abcdefgh", tmp_path / "authsrv-metrics-1234567-notmine"]
        for folder in kept[:3]:
            folder.mkdir()
        kept[3].write_bytes(b"a file, not a folder")
        service = Supervisor(Clock(), 1, [], 0, nothing_to_prepare, config=ConfigSource(Path("authsrv.toml"), b""),
                             argv=["authsrv"], shared_metrics=True, give_up=lambda status: None)
        service.startService()
        own = Path(service._env[METRICS_DIR_ENV])
        assert not dead.exists()
        assert all(path.exists() for path in kept)
        assert own.parent == tmp_path and own.name.startswith(f"authsrv-metrics-{os.getpid()}-")
        service._remove_shared(None)
        assert not own.exists()
    finally:
        running.kill()
        running.wait()
