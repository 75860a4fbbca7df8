"""examples/container/: no Docker here, so the compose file's shape is checked
(YAML, the keys it needs, agreement with memorizzd.toml and the Dockerfiles),
and the agent container's command, call-all.sh, runs on the host against a real
daemon configured from the example's memorizzd.toml and its demo server,
calling the tool with each client (Python, Node.js, shell)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from memorizzd.config import Config
from tests.harness import DaemonHarness, node

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "container"


def _compose() -> dict[str, Any]:
    compose = yaml.safe_load((EXAMPLE / "compose.yaml").read_text())
    assert isinstance(compose, dict)
    return compose


def _toml() -> dict[str, Any]:
    return tomllib.loads((EXAMPLE / "memorizzd.toml").read_text())


def test_the_compose_file_mounts_a_profiles_directory_into_the_agent() -> None:
    compose = _compose()
    config = _toml()
    daemon = compose["services"]["memorizzd"]
    agent = compose["services"]["agent"]
    # both images build from the checkout's Dockerfiles
    for service in (daemon, agent):
        assert (
            EXAMPLE / service["build"]["context"] / service["build"]["dockerfile"]
        ).is_file()
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
    # the daemon reads the example's config, and is healthy when memorizzctl says so
    config_path = daemon["command"][daemon["command"].index("--config") + 1]
    assert f"./memorizzd.toml:{config_path}:ro" in daemon["volumes"]
    assert daemon["healthcheck"]["test"] == ["CMD", "memorizzctl", "daemon", "status"]
    assert daemon["environment"]["MEMORIZZ_SOCKET"] == config["socket"]
    # the agent starts once it is, and mounts one profile's directory of the
    # daemon's socket volume, as one of the profile's uids
    assert agent["depends_on"] == {"memorizzd": {"condition": "service_healthy"}}
    (mount,) = agent["volumes"]
    run_volume = next(
        v.split(":")[1]
        for v in daemon["volumes"]
        if v.startswith(f"{mount['source']}:")
    )
    assert mount["source"] in compose["volumes"]
    assert mount["read_only"] is True
    directory = f"{run_volume}/{mount['volume']['subpath']}"
    profile = next(
        p
        for p in config["profiles"]
        if directory == f"{config['agents_dir']}/{p['name']}"
    )
    assert int(agent["user"].split(":")[0]) in profile["uids"]
    assert agent["environment"]["MEMORIZZ_SOCKET"] == f"{mount['target']}/api.sock"
    assert agent["command"][0] == "call-all"
    assert agent["command"][1] in profile["servers"]


def test_the_agents_dockerfile_copies_what_exists() -> None:
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    copied = [
        line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")
    ]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), source
    uid = _compose()["services"]["agent"]["user"]
    assert f"USER {uid}" in dockerfile


def test_call_all_calls_the_demo_tool_with_each_client(base_dir: str) -> None:
    exe = node("the container example's Node.js client")
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (scripts/bootstrap installs it as root)")
    fields = _toml()
    fields |= {
        "socket": os.path.join(base_dir, "operator", "d.sock"),
        "state_dir": os.path.join(base_dir, "state"),
        "agents_dir": os.path.join(base_dir, "agents"),
    }
    (server,) = fields["servers"]
    server |= {"command": sys.executable, "args": [str(EXAMPLE / "demo_server.py")]}
    (profile,) = fields["profiles"]
    profile["uids"] = [os.geteuid()]  # the container's uid 1500 is this test's
    config = msgspec.convert(fields, Config)
    with DaemonHarness.running(config) as harness:
        harness.wait_ready(server["name"])
        bins = os.path.join(base_dir, "bin")
        os.mkdir(bins)
        os.symlink(ROOT / "clients" / "sh" / "mz", os.path.join(bins, "mz"))
        os.symlink(exe, os.path.join(bins, "node"))
        done = subprocess.run(
            ["/bin/sh", str(EXAMPLE / "call-all.sh"), server["name"], "echo"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={
                **os.environ,
                # python3: this one, which has msgspec (the image installs it)
                "PATH": f"{bins}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                "PYTHONPATH": str(ROOT / "client"),
                "MEMORIZZ_NODE_CLIENT": str(ROOT / "clients" / "node" / "memorizz.mjs"),
                "MEMORIZZ_SOCKET": os.path.join(
                    base_dir, "agents", profile["name"], "api.sock"
                ),
            },
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == ["python:", "hello from python", "node:", "hello from node"]
    assert lines[4] == "sh:"
    assert msgspec.json.decode(lines[5])["content"] == [
        {"type": "text", "text": "hello from sh"}
    ]
