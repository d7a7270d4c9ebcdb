"""The simulated ``nvidia-cuda-mps-control``: what the job daemon starts for ``--mps`` jobs
on the simulated backend, so CI runs the path it runs on a real GPU.

It keeps what gpuwarden and its jobs rely on: ``-d`` daemonises a control daemon named
``nvidia-cuda-mps-control`` (argv[0], as ``read_mps_state`` reads it) with a ``control``
endpoint in CUDA_MPS_PIPE_DIRECTORY and a log in CUDA_MPS_LOG_DIRECTORY; without ``-d``
it sends the commands on stdin (``get_server_list``, ``get_client_list PID``,
``set_default_device_pinned_mem_limit DEV SIZE``, ``set_default_active_thread_percentage
N``, ``quit``) and prints the answers, or fails with MPS's "Cannot find MPS control
daemon process". A simulated CUDA client (sim/job.py) says hello on the endpoint; the
daemon then starts its ``nvidia-cuda-mps-server`` and tells the client which GPUs it
serves (its CUDA_VISIBLE_DEVICES, which the client sees numbered from 0) and its default
limits.

It runs as a program of its own from the standard library alone: with argv[0] renamed,
Python cannot find a virtual environment's packages. ``install`` writes it out."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
HELLO = "sim_client"  # a simulated CUDA client connecting (not a command of the real one)
NOT_FOUND = "Cannot find MPS control daemon process"
SERVER_MEMORY = 66 << 20  # what NVML lists for an MPS server on each of its GPUs (H200)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


SYSTEM_PYTHON = "/usr/bin/python3"


def install(directory: Path) -> str:
    """Write this program as ``directory/nvidia-cuda-mps-control`` (replaced only when it
    differs); returns its path. It runs on the system Python where there is one: the
    daemon starts it as the job's user, who may not reach the daemon's own Python."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = directory / CONTROL
    python = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    text = f"#!{python}\n" + Path(__file__).read_text()
    try:
        if path.read_text() == text:
            return str(path)
    except OSError:
        pass
    tmp = directory / f".{CONTROL}.{os.getpid()}"
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return str(path)


def mps_size(text: str) -> int:
    """``2G``, ``512M`` (MPS's units) as bytes."""
    text = text.strip().upper()
    unit = text[-1:] if text[-1:] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def _pipe_dir() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"


def _log_dir() -> str:
    return os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"


def _python() -> str:
    """This interpreter (sys.executable is unknown once argv[0] is renamed)."""
    return os.readlink("/proc/self/exe")


def ask(pipe_dir: str, line: str, timeout: float = 5.0) -> str:
    """One command to the control daemon at ``pipe_dir``; OSError when none listens."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(os.path.join(pipe_dir, "control"))
        s.sendall(line.encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)


class _Daemon:
    def __init__(self) -> None:
        self.limits: dict[int, int] = {}  # device ordinal -> default pinned limit, bytes
        self.threads: int | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.clients: set[int] = set()
        spec = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").strip()
        for part in filter(None, spec.split(",")):
            dev, _, size = part.rpartition("=")
            self.limits[int(dev or 0)] = mps_size(size)
        self.log = open(os.path.join(_log_dir(), "control.log"), "a", buffering=1)  # noqa: SIM115

    def say(self, text: str) -> None:
        self.log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")

    def live_clients(self) -> list[int]:
        self.clients = {p for p in self.clients if os.path.exists(f"/proc/{p}")}
        return sorted(self.clients)

    def answer(self, line: str) -> str | None:
        """The reply to one command; None to quit."""
        words = line.split()
        if not words:
            return ""
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            return None
        if cmd == "get_server_list":
            return "" if self.server is None else f"{self.server.pid}\n"
        if cmd == "get_client_list" and len(args) == 1:
            if self.server is None or args[0] != str(self.server.pid):
                return "Server not found\n"
            return "".join(f"{p}\n" for p in self.live_clients())
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.limits[int(args[0])] = mps_size(args[1])
            return ""
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            n = self.limits.get(int(args[0]))
            return "0\n" if n is None else f"{n >> 20}M\n"
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            self.threads = int(args[0])
            return ""
        if cmd == HELLO and len(args) == 1:
            if self.server is None or self.server.poll() is not None:
                # The server inherits the daemon's environment, as the real one does.
                self.server = subprocess.Popen(
                    [SERVER, os.path.abspath(__file__), "--server"],
                    executable=_python(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                self.say(f"Server {self.server.pid} has started")
            self.clients.add(int(args[0]))
            self.say(f"New client {args[0]} connected")
            return (
                json.dumps(
                    {
                        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "limits": self.limits,
                        "threads": self.threads,
                        "server": self.server.pid,
                    }
                )
                + "\n"
            )
        return f"Unrecognized command {line!r}\n"

    def serve(self) -> int:
        control = os.path.join(_pipe_dir(), "control")
        if os.path.exists(control):
            os.unlink(control)
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(control)
        srv.listen(16)
        Path(_pipe_dir(), f"{CONTROL}.pid").write_text(f"{os.getpid()}\n")
        self.say(f"Control daemon started (pid {os.getpid()})")
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.makefile().readline().strip()
                except OSError:
                    continue
                self.say(f"Control received {line!r}")
                try:
                    reply = self.answer(line)
                except ValueError:
                    reply = f"Invalid argument in {line!r}\n"
                if reply is None:
                    if self.server is not None:
                        self.server.terminate()
                        self.server.wait()
                    os.unlink(control)
                    self.say("Control daemon exited")
                    conn.sendall(b"")
                    return 0
                conn.sendall(reply.encode())


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        control = os.path.join(_pipe_dir(), "control")
        if not os.path.isdir(_pipe_dir()) or not os.path.isdir(_log_dir()):
            print(f"{CONTROL}: cannot use pipe/log directories", file=sys.stderr)
            return 1
        if os.path.exists(control):
            try:
                ask(_pipe_dir(), "get_server_list")
                print("An instance of this daemon is already running", file=sys.stderr)
                return 1
            except OSError:
                pass  # a stale endpoint: replaced
        if os.fork() == 0:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            # Renamed, Python cannot find its own library: say where it is.
            os.environ["PYTHONHOME"] = f"{sys.base_prefix}:{sys.base_exec_prefix}"
            os.execv(_python(), [CONTROL, os.path.abspath(__file__), "--serve"])
        return 0
    if argv == ["--serve"]:
        return _Daemon().serve()
    if argv == ["--server"]:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while True:
            time.sleep(3600)
    out = []
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        try:
            out.append(ask(_pipe_dir(), line.strip()))
        except OSError:
            print(NOT_FOUND, file=sys.stderr)
            return 1
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
