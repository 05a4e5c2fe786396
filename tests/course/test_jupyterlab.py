"""The course's `make lab` server: starts headless, serves the notebooks, shuts down."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_the_notebooks(tmp_path):
    pytest.importorskip("jupyterlab")
    port, token = _free_port(), "flashlab-test"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
           f"--port={port}", "--ip=127.0.0.1", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={ROOT / 'notebooks'}", "--ServerApp.port_retries=0"]
    env = {**__import__("os").environ, "JUPYTER_RUNTIME_DIR": str(tmp_path),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, listing = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=5) as r:
                    listing = json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"server did not answer: {server.stderr.read1().decode()[-2000:]}"
        names = {item["name"] for item in listing["content"]}
        expected = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
        assert expected and expected <= names
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
        first = sorted(expected)[0]
        with urllib.request.urlopen(f"{base}/api/contents/{first}?token={token}", timeout=10) as r:
            assert json.load(r)["type"] == "notebook"
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    assert server.returncode is not None
