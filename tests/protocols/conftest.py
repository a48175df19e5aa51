"""A ``microbatch serve`` child process for the protocol tests: HTTP and, when asked,
gRPC, both on free ports of 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.serve.test_server import HANG_GUARD_S
from tests.server_process import ROOT, SERVING_ON, Server, serve_command, stop


@dataclass
class Running:
    """The server's HTTP address (``host:port``), its gRPC one, and its process."""

    http: str
    grpc: str | None
    process: subprocess.Popen[str]

    @property
    def url(self) -> str:
        """The HTTP base URL."""
        return f"http://{self.http}"


@contextmanager
def serving(*targets: str, grpc: bool = False, options: tuple[str, ...] = ()) -> Iterator[Running]:
    """Start ``microbatch serve TARGET... --port 0 [--grpc-port 0]``; yield once ready."""
    extra = ["--grpc-port", "0"] if grpc else []
    process = subprocess.Popen(
        serve_command(*targets, "--port", "0", *extra, *options),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
    )
    try:
        assert process.stdout is not None
        grpc_address = None
        while True:
            line = process.stdout.readline()
            assert line, "the server exited before it announced its address"
            if line.startswith("microbatch grpc serving on "):
                grpc_address = line.removeprefix("microbatch grpc serving on ").strip()
            elif line.startswith(SERVING_ON):
                url = line.removeprefix(SERVING_ON).strip()
                break
        Server(process, url, HANG_GUARD_S).wait_ready()
        yield Running(url.removeprefix("http://"), grpc_address, process)
    finally:
        stop(process, HANG_GUARD_S)
