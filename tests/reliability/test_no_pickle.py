"""Issue 6, item 10: no pickle from the network.

* Static: no module of the HTTP layer imports a deserializer that runs code
  (pickle, marshal, dill, ...) or calls eval/exec; in the whole package pickle is
  used only by the pipeline's own pipes and worker start-up, and by the relay
  between ``serve --workers``'s HTTP processes and their hub (socketpairs, items
  already decoded by msgspec).
* Dynamic: a pickle whose loading would create a file, POSTed to every route with
  every content type, gets a 4xx and the file never appears.
* The pipes between the server and its workers are not reachable from the network:
  the server listens on its one HTTP port, the workers on nothing, and no process
  holds a Unix socket with a filesystem path (they are socketpairs).
"""

from __future__ import annotations

import ast
import os
import pickle
from collections import Counter
from pathlib import Path

from .harness import Connection, children, listening_tcp, report, run, serving, unix_socket_paths

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "microbatch"
UNSAFE_MODULES = {"pickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "__import__"}
PICKLE_ALLOWED = {  # our own processes' pipes, and the spec a worker is spawned with
    "serve/relay.py",  # serve --workers: HTTP processes and their hub, on socketpairs
    "pipeline/transport.py",
    "pipeline/worker.py",
    "pipeline/step_worker.py",  # a step-wise worker's job/result pipe pair
    "pipeline/processes.py",
    "pipeline/stage.py",
}


def imports_and_calls(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()
    calls: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.add(node.func.id)
    return modules, calls


def test_no_unsafe_deserializer_in_the_http_layer_and_pickle_only_on_our_pipes() -> None:
    findings = []
    pickle_users = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        modules, calls = imports_and_calls(path)
        if name.startswith("http/"):
            findings += [f"{name} imports {m}" for m in modules & UNSAFE_MODULES]
            findings += [f"{name} calls {c}" for c in calls & UNSAFE_CALLS]
        if modules & UNSAFE_MODULES:
            pickle_users.add(name)
    report("no pickle, static", http_findings=len(findings), pickle_users=sorted(pickle_users))
    assert not findings, findings
    assert pickle_users <= PICKLE_ALLOWED


class CreatesAFile:
    """Unpickling this creates the directory ``path`` (the proof it was loaded)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (self.path,)


ROUTES = ["/predict", "/health/live", "/health/ready", "/metrics", "/openapi.json", "/docs"]
CONTENT_TYPES = [
    None,
    "application/json",
    "application/msgpack",
    "application/x-msgpack",
    "application/vnd.msgpack",
    "application/python-pickle",
    "application/x-python-pickle",
    "application/vnd.bentoml+pickle",
    "application/octet-stream",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
    "text/plain",
]


def test_a_malicious_pickle_to_every_route_and_content_type_is_refused(tmp_path: Path) -> None:
    sentinel = tmp_path / "pickle-was-loaded"
    payload = pickle.dumps(CreatesAFile(str(sentinel)), protocol=pickle.HIGHEST_PROTOCOL)
    with serving("poison") as server:
        statuses = run(send_everywhere(server.address, payload))
    by_route = {
        route: Counter(s for (r, _), s in statuses.items() if r == route) for route in ROUTES
    }
    report(
        "no pickle, dynamic", requests=len(statuses), by_route=by_route, loaded=sentinel.exists()
    )
    assert not sentinel.exists()
    assert all(400 <= status < 500 for status in statuses.values()), statuses


async def send_everywhere(address: tuple[str, int], payload: bytes) -> dict[tuple[str, str], int]:
    """The payload as the body of a POST to every route, with each content type
    (and accepting each)."""
    statuses: dict[tuple[str, str], int] = {}
    connection = await Connection.open(address)
    for route in ROUTES:
        for content_type in CONTENT_TYPES:
            headers = {"accept": content_type or "*/*"}
            if content_type is not None:
                headers["content-type"] = content_type
            reply = await connection.request("POST", route, payload, headers)
            statuses[route, str(content_type)] = reply.status
    await connection.close()
    return statuses


def test_the_worker_pipes_are_not_reachable_from_the_network() -> None:
    with serving("poison") as server:
        pid = server.process.pid
        workers = sorted(children(pid))
        listening = {p: listening_tcp(p) for p in (pid, *workers)}
        named_sockets = {p: unix_socket_paths(p) for p in (pid, *workers)}
    report(
        "worker pipes",
        workers=len(workers),
        server_listens_on=listening[pid],
        workers_listen_on=[listening[w] for w in workers],
        unix_socket_paths=sum(len(paths) for paths in named_sockets.values()),
    )
    assert len(workers) == 2
    assert listening[pid] == [f"127.0.0.1:{server.address[1]}"]
    assert all(listening[w] == [] for w in workers)
    for paths in named_sockets.values():  # any socket with a path: only its owner may enter
        for path in paths:
            assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0, path
