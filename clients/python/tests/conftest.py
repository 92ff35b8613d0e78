"""Starts real `lathe serve` processes on free loopback ports with temporary data folders.

LATHE_BIN: the binary (default: <repo>/target/release/lathe, else <repo>/target/debug/lathe).
LATHE_MODELS_DIR: the models folder laid out by scripts/fetch-models.sh (default: <repo>/models).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from lathe_client import Lathe, LatheError

REPO = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = REPO / "deploy" / "lathe.toml"


def lathe_binary() -> Path:
    if os.environ.get("LATHE_BIN"):
        return Path(os.environ["LATHE_BIN"])
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "lathe"
        if candidate.exists():
            return candidate
    return REPO / "target" / "release" / "lathe"


def models_dir() -> Path:
    return Path(os.environ.get("LATHE_MODELS_DIR", REPO / "models"))


def documented_config() -> dict:
    """deploy/lathe.toml: every key the server knows, with its default."""
    with DEFAULT_CONFIG.open("rb") as file:
        return tomllib.load(file)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, sections: dict[str, dict[str, object]]) -> Path:
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class ServerProcess:
    address: str
    process: subprocess.Popen
    log_path: Path
    data_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    tmp_dir: Path,
    extra_config: dict[str, dict[str, object]] | None = None,
    client_kwargs: dict | None = None,
    ready_timeout: float = 60.0,
) -> ServerProcess:
    """Starts `lathe serve` and waits until its health service says lathe.v1.Lathe is SERVING."""
    binary = lathe_binary()
    if not binary.exists():
        pytest.fail(f"lathe binary {binary} not found: build it or set LATHE_BIN")
    if not (models_dir() / "minilm" / "tokenizer.json").exists():
        pytest.fail(f"models missing in {models_dir()}: run scripts/fetch-models.sh")
    address = f"127.0.0.1:{free_port()}"
    data_dir = tmp_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    sections: dict[str, dict[str, object]] = {
        "server": {"listen": address, "cpu_threads": 2},
        "storage": {
            "data_dir": str(data_dir),
            "writer_memory_bytes": 15 << 20,
        },
        "models": {"dir": str(models_dir())},
        "log": {"filter": "info"},
    }
    for section, values in (extra_config or {}).items():
        sections.setdefault(section, {}).update(values)
    config = write_config(tmp_dir / "lathe.toml", sections)
    log_path = tmp_dir / "lathe.log"
    log = log_path.open("wb")
    # No LATHE_* variables from the caller's environment: the config file says everything.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LATHE_")}
    process = subprocess.Popen(
        [str(binary), "serve", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    server = ServerProcess(address, process, log_path, data_dir)
    deadline = time.monotonic() + ready_timeout
    with Lathe(address, timeout=2.0, **(client_kwargs or {})) as probe:
        while True:
            if process.poll() is not None:
                pytest.fail(f"lathe serve exited with {process.returncode}:\n{server.log()}")
            try:
                if probe.health() == "SERVING":
                    return server
            except LatheError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                pytest.fail(f"lathe serve not SERVING after {ready_timeout}s:\n{server.log()}")
            time.sleep(0.05)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    running = start_server(tmp_path_factory.mktemp("lathe"))
    yield running
    code = running.stop()
    if code != 0:
        sys.stderr.write(running.log())
        pytest.fail(f"lathe serve exited with {code} after SIGTERM")


@pytest.fixture()
def lathe(server: ServerProcess) -> Iterator[Lathe]:
    with Lathe(server.address) as client:
        yield client
