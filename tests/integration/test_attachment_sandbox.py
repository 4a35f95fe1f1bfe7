"""The file-reading worker as a sandbox against a parser that runs the file's code
(attachments/sandbox.py, worker.py, reading.py): through the real graph service, a "parser
exploit" gets neither the graph's keys nor a socket nor a process, the graph is closed to
its own uid from start-up, and whatever a compromised worker writes back, the graph reads
no more than an answer can hold.

The exploit: a test-only sitecustomize.py, put on the worker's PYTHONPATH by the test (the
worker keeps the graph's PYTHONPATH), replaces parse_document so that a text file beginning
"#hostile" is run as Python where the parser would run, after the sandbox is up. Nothing in
the product can do this: it takes a file on the import path, which only the operator sets.

Why the graph runs without capabilities: in production it is uid 10001 with none
(k8s/base/graph.yaml). As root with capabilities the kernel would keep a worker out of it
anyway (a process cannot read /proc of one holding capabilities it lacks), which would hide
whether the graph closed itself. So when the tests run as root, the graph is started with
an empty capability bounding set: uid 0, no capability, like production's user.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import post_sse
from vagent_graph.attachments import ReadLimits, Refused, read_attachment

CANARY = "sk-canary-5b7e0c1d9a3f4e62"  # in the graph's environment: must reach nothing
LIMITS = ReadLimits(max_bytes=2 * 1024 * 1024, timeout=30, memory_mb=512, image_max_side=256, max_chars=1000)

SITECUSTOMIZE = '''
"""Test only (tests/integration/test_attachment_sandbox.py): a parser with a code-execution
bug. A file starting with "#hostile" is run as Python where parse_document would parse it."""
import vagent_graph.knowledge.parsing as _parsing

_real = _parsing.parse_document


def _exploited(data, fmt, name, *, max_chars=None):
    if data.startswith(b"#hostile\\n"):
        scope = {}
        exec(compile(data, "<the file>", "exec"), scope)
        return scope["result"]
    return _real(data, fmt, name, max_chars=max_chars)


_parsing.parse_document = _exploited
'''

#: What a parser exploit tries, with raw syscalls through libc where Python's own functions
#: would meet the audit hook first: the result of each, "done" if it worked.
PROBE = """#hostile
import ctypes, errno, json, os, socket, struct
from vagent_graph.knowledge.parsing import ParsedDocument, Section

libc = ctypes.CDLL(None, use_errno=True)
found = {}


def tried(call):
    try:
        call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return "done"


def returned(value):
    return "done" if value >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


def read(path):
    with open(path, "rb") as f:
        found["leaked"] = f.read().decode("latin-1")


graph = os.getppid()
found["environ"] = tried(lambda: read(f"/proc/{graph}/environ"))
found["mem"] = tried(lambda: open(f"/proc/{graph}/mem", "rb").close())
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
found["socket"] = returned(fd)
if fd >= 0:
    address = struct.pack("=H", socket.AF_INET) + struct.pack(">H", PORT) + bytes([127, 0, 0, 1]) + bytes(8)
    found["connect"] = returned(libc.connect(fd, address, len(address)))
found["python_socket"] = tried(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=5).close())
pid = libc.fork()
if pid == 0:
    libc._exit(0)
found["fork"] = returned(pid)
if pid > 0:
    os.waitpid(pid, 0)
found["signal_graph"] = returned(libc.kill(graph, 0))
found["uid"] = os.getuid()
result = ParsedDocument("probe", "text", [Section((), "FINDINGS " + json.dumps(found, sort_keys=True))])
"""

#: Run argv without any capability (an empty bounding set survives exec; uid stays 0).
WITHOUT_CAPABILITIES = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in range(64):
    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
os.execv(sys.argv[1], sys.argv[1:])
"""


def capless(argv: list[str]) -> list[str]:
    """argv run as the production graph runs: no capability (nothing to drop when not root)."""
    return [sys.executable, "-c", WITHOUT_CAPABILITIES, *argv] if os.geteuid() == 0 else argv


def capabilities(pid: int) -> int:
    found = re.search(r"^CapEff:\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert found
    return int(found.group(1), 16)


@dataclass(frozen=True)
class Graph:
    process: GraphProcess
    #: reads_environ_of the graph right after it started, before it read any file.
    environ_at_start: str


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("hostile-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return site


@pytest.fixture(scope="module")
def graph(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    _llm_session: ScriptedLLMServer,
    hostile_site: Path,
) -> Iterator[Graph]:
    tmp = tmp_path_factory.mktemp("sandbox")
    g = GraphProcess(
        redis_url,
        tmp,
        _llm_session.base_url,
        PYTHONPATH=str(hostile_site),
        VAGENT_TEST_CANARY=CANARY,
        ATTACHMENT_MAX_TOKENS="2000",
    )
    g.argv = capless(g.argv)
    g.start()
    try:
        assert g.proc is not None
        assert capabilities(g.proc.pid) == 0  # as in production
        yield Graph(g, reads_environ_of(g.proc.pid))
    finally:
        g.stop()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port on 127.0.0.1 that nothing in the test connects to."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def nothing_connected(server: socket.socket) -> bool:
    """Checked after the worker ended: a connection would be in the backlog by now."""
    server.setblocking(False)
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def reads_environ_of(pid: int) -> str:
    """A fresh process of the graph's uid, without capabilities, reading /proc/<pid>/environ:
    "read" or the error's name."""
    code = (
        "import errno, sys\n"
        "try:\n"
        f"    open('/proc/{pid}/environ', 'rb').read()\n"
        "except OSError as e:\n"
        "    sys.exit(errno.errorcode[e.errno])\n"
        "print('read')\n"
    )
    done = subprocess.run(capless([sys.executable, "-c", code]), capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip()


async def ask_with_file(graph: GraphProcess, llm: ScriptedLLMServer, name: str, data: bytes) -> str:
    """Send a turn with the file; the text of the user message the model was given."""
    sid = new_session()
    llm.push_text("Noted.")
    body = message_body(sid, "what is in this file?", ac(sid.user_id, []))
    body["attachments"] = [{"name": name, "data": base64.b64encode(data).decode()}]
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as client:
        await post_sse(client, "/api/v1/process_message", body, graph.headers)
    users = [m for m in llm.requests[-1]["messages"] if m["role"] == "user"]
    return str(users[-1]["content"])


def findings(text: str) -> dict[str, Any]:
    found = re.search(r"FINDINGS (\{.*?\})", text)
    assert found, text[:2000]
    return dict(json.loads(found.group(1)))


# --- through the real graph service ------------------------------------------------------------


def test_the_graph_is_closed_to_its_own_uid_from_start_up(graph: Graph) -> None:
    """Before any file is read: a process of the same uid without capabilities (what a
    worker is) cannot read the graph's environment, though it can read a dumpable one's."""
    assert graph.environ_at_start == "EACCES"
    ordinary = "import sys; print('up', flush=True); sys.stdin.read()"
    with subprocess.Popen(
        capless([sys.executable, "-c", ordinary]), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as plain:
        try:
            assert plain.stdout is not None and plain.stdout.readline() == b"up\n"  # exec'd, capless
            assert reads_environ_of(plain.pid) == "read"  # the same reader, on an ordinary process
        finally:
            assert plain.stdin is not None
            plain.stdin.close()


async def test_a_parser_running_the_files_code_gets_no_key_no_network_and_no_process(
    graph: Graph, llm_server: ScriptedLLMServer, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    shown = await ask_with_file(
        graph.process, llm_server, "notes.txt", PROBE.replace("PORT", str(port)).encode()
    )
    found = findings(shown)
    assert found["environ"] == "EACCES" and found["mem"] == "EACCES"
    assert "leaked" not in found and CANARY not in shown and "test-service-token" not in shown
    assert found.get("connect", found["socket"]) != "done" and found["python_socket"] != "done"
    assert nothing_connected(listener)
    assert found["fork"] in ("EPERM", "EAGAIN")
    assert found["signal_graph"] == "EPERM"


def test_the_probe_finds_what_an_unconfined_process_can_do(
    hostile_site: Path, listener: socket.socket
) -> None:
    """The same probe outside the worker's walls (a plain child of this test): it connects
    and forks, so its "EACCES", "EPERM" above are the walls' doing, not the probe's."""
    port = listener.getsockname()[1]
    run = (
        "import json, sys\n"
        "import vagent_graph.knowledge.parsing as p\n"
        "doc = p.parse_document(sys.stdin.buffer.read(), 'text', 'x')\n"
        "print(doc.sections[0].text)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(hostile_site)}
    done = subprocess.run(
        [sys.executable, "-c", run],
        input=PROBE.replace("PORT", str(port)).encode(),
        capture_output=True,
        env=env,
        check=True,
    )
    found = findings(done.stdout.decode())
    assert found["connect"] == "done" and found["python_socket"] == "done" and found["fork"] == "done"
    assert not nothing_connected(listener)


#: sandbox.confine as a root graph's worker runs it, where Python loads from a directory
#: nobody can read ("/" here: this machine's own Python may live under /root).
ROOT_WORKER = """
import errno, json, os, sys
from vagent_graph.attachments.sandbox import confine

secret = sys.argv[1]
sys.path[:] = ["/"]
walls = confine(256, 5)


def tried(path):
    try:
        open(path, "rb").read()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "done"


walls["secret_file"] = tried(secret)
walls["environ"] = tried(f"/proc/{os.getppid()}/environ")
print(json.dumps(walls))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a root graph's worker: only root can start one")
def test_a_root_graphs_worker_runs_as_nobody(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text(CANARY)
    secret.chmod(0o600)
    done = subprocess.run([sys.executable, "-c", ROOT_WORKER, str(secret)], capture_output=True, check=True)
    walls = json.loads(done.stdout)
    assert walls["uid"] == 65534 and walls["capabilities"] is False
    assert walls["secret_file"] == "EACCES" and walls["environ"] == "EACCES"


# --- what a compromised worker sends back --------------------------------------------------------


WRITE_ANSWER = """#hostile
import os, stat
assert stat.S_ISFIFO(os.fstat(3).st_mode)  # the answer's pipe (worker.main: os.dup(1))
{body}
os._exit(0)
"""


@pytest.fixture
def exploitable(hostile_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started by this test process run the hostile parser."""
    monkeypatch.setenv("PYTHONPATH", str(hostile_site))


@pytest.mark.usefixtures("exploitable")
async def test_an_answer_without_end_is_cut_off_not_read() -> None:
    """32 MB and no end (the worker then waits for ever): the graph stops reading at the
    bound and kills it, instead of reading on until the timeout."""
    endless = WRITE_ANSWER.format(
        body="import signal\nfor _ in range(512):\n    os.write(3, b'x' * 65536)\n"
        "while True:\n    signal.pause()"
    )
    with pytest.raises(Refused) as refused:
        await read_attachment("notes.txt", endless.encode(), LIMITS)
    assert refused.value.reason == "it could not be read (the file may be damaged)"  # not a timeout


@pytest.mark.usefixtures("exploitable")
async def test_a_document_answer_over_the_cap_is_cut_to_it() -> None:
    text = "y" * 30_000  # well under the answer's byte bound for 1,000 characters, 30 times the cap
    answer = json.dumps({"ok": True, "text": text, "pages": None, "pages_read": None, "chars": 30_000})
    hostile = WRITE_ANSWER.format(body=f"os.write(3, {answer.encode()!r})")
    read = await read_attachment("notes.txt", hostile.encode(), LIMITS)
    assert read.text == "y" * (LIMITS.max_chars + 1)


async def test_the_bound_leaves_room_for_the_largest_real_image() -> None:
    """Transparent noise as PNG: the largest scaled copy there is (4.006 bytes a pixel)."""
    side = 1024
    noise = Image.frombytes("RGBA", (side, side), random.Random(7).randbytes(side * side * 4))
    out = io.BytesIO()
    noise.save(out, "PNG")
    limits = replace(LIMITS, max_bytes=8 * 1024 * 1024, image_max_side=side)
    read = await read_attachment("noise.png", out.getvalue(), limits)
    assert read.image_mime == "image/png" and len(read.image) >= side * side * 4
