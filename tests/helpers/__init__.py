"""Test helpers shared by several test files (import as `from helpers import start_chat_server`).

pytest puts tests/ on sys.path (rootdir-relative "prepend" import mode), so `helpers` resolves to this package.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHAT_SERVER = Path(__file__).with_name("chat_server.py")


@contextlib.contextmanager
def start_chat_server(
    tmp_path: Path,
    *,
    mode: str = "scripted",
    rules: dict[str, Any] | None = None,
    fail_first: int = 0,
    fail_status: int = 429,
    delay: float = 0.0,
    echo_auth: bool = False,
    model: str = "test-model",
    startup_timeout_s: float = 120.0,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start tests/helpers/chat_server.py on 127.0.0.1 as a subprocess; yield (base_url, process); always stop it.

    `rules` (scripted mode) is written to a JSON file under tmp_path. The server's stderr goes to
    tmp_path/chat_server.log and is shown in the error if it fails to start.
    """
    cmd = [sys.executable, str(CHAT_SERVER), "--port", "0", "--mode", mode, "--model", model]
    if mode == "scripted":
        rules_path = tmp_path / "chat_server_rules.json"
        rules_path.write_text(json.dumps(rules or {}), encoding="utf-8")
        cmd += ["--rules", str(rules_path)]
    cmd += ["--fail-first", str(fail_first), "--fail-status", str(fail_status), "--delay", str(delay)]
    cmd += ["--echo-auth"] if echo_auth else []
    log_path = tmp_path / "chat_server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        port = _read_port(process, startup_timeout_s, log_path)
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_ready(base_url, process, log_path)
        yield base_url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def server_stats(base_url: str) -> dict[str, int]:
    """GET /stats of a chat server started by start_chat_server (request counts)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=10) as response:
        return json.load(response)


def _read_port(process: subprocess.Popen, timeout_s: float, log_path: Path) -> int:
    # readline blocks, so it runs in a thread that the deadline can abandon.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not lines or not lines[0].strip().isdigit():
        raise RuntimeError(f"chat server did not print its port: {log_path.read_text()[-2000:]}")
    return int(lines[0])


def _wait_ready(base_url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"chat server exited with {process.returncode}: {log_path.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(base_url + "/models", timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"chat server not ready after {timeout_s} s: {log_path.read_text()[-2000:]}")


def accelerate_launch(
    module: str, overrides: list[str], *, num_processes: int = 2, timeout_s: float = 600
) -> subprocess.CompletedProcess:
    """`accelerate launch` `num_processes` CPU processes (gloo, conf/accelerate/cpu_ddp.yaml, 1 thread each) running
    `python -m <module> <overrides>`, offline; returns the finished process (output captured)."""
    command, env = accelerate_launch_command(module, overrides, num_processes=num_processes)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)


def accelerate_launch_command(
    module: str, overrides: list[str], *, num_processes: int = 2
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment `accelerate_launch` runs."""
    from pasta.config import conf_dir

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(conf_dir() / "accelerate" / "cpu_ddp.yaml"),
        "--num_processes", str(num_processes), "--num_cpu_threads_per_process", "1",
        # A free port per launch: tests run side by side (pytest-xdist) and must not meet on cpu_ddp.yaml's.
        "--main_process_port", str(_free_port()),
        "-m", module, *overrides,
    ]  # fmt: skip
    return command, env


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(monkeypatch, capsys, module_cli, *argv: str) -> tuple[int, str]:
    """Run an entry point's `cli` in this process with `argv`; (its exit code, what it wrote to stderr). For a
    command line refused before the task: the checks and the one-line error without a Python start-up."""
    monkeypatch.setattr(sys, "argv", ["pasta", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module_cli()
    return exit_info.value.code, capsys.readouterr().err
