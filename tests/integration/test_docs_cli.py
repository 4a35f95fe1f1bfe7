"""`vagent docs` as an operator runs it, against the real Redis: the command itself in this
process (tests/support/vagent_cli.py: same app, environment, output and exit codes), and as a
real process where that is what an operator meets (`Docs.process`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from redis_local import free_port
from tests.support.llm_server import ScriptedLLMServer
from tests.support.vagent_cli import Ran, run_vagent

BIN = Path(sys.executable).parent
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "docs"


@dataclass
class Docs:
    """The CLI bound to one index of the test Redis."""

    redis_url: str
    index: str
    env: dict[str, str]

    def run(self, *args: str, **env: str) -> Ran:
        """`vagent docs ARGS` in this process (tests/support/vagent_cli.py)."""
        return run_vagent(["docs", *args], {**self.env, **env})

    def process(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`vagent docs ARGS` as the installed console script, in a new process."""
        return subprocess.run(
            [str(BIN / "vagent"), "docs", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ok(self, *args: str, **env: str) -> str:
        return succeeded(self.run(*args, **env))

    def listed(self, *args: str) -> dict[tuple[str, str], dict[str, object]]:
        rows = [json.loads(line) for line in self.ok("list", "--json", *args).splitlines()]
        return {(r["domain"], r["doc_id"]): r for r in rows}

    def chunk_keys(self) -> int:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return sum(1 for _ in client.scan_iter(match=f"{self.index}:chunk:*"))
        finally:
            client.close()


def succeeded(proc: Ran | subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def docs(redis_url: str) -> Iterator[Docs]:
    index = f"cli_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EMBEDDINGS_"))}
    env.update(REDIS_URL=redis_url, DOCS_INDEX=index, ENTITY_GRAPH=f"{index}_kg", LOG_LEVEL="INFO")
    yield Docs(redis_url, index, env)
    client = redis.Redis.from_url(redis_url)
    try:
        try:
            client.execute_command("FT.DROPINDEX", index)  # type: ignore[no-untyped-call]
        except redis.ResponseError:
            pass
        keys = list(client.scan_iter(match=f"{index}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Good files in all four formats."""
    for name in ("handbook.md", "notes.txt", "page.html", "report.pdf"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    return tmp_path


def test_ingest_a_folder_list_and_reingest_only_what_changed(docs: Docs, folder: Path) -> None:
    # the installed command, in its own process, writes what the graph reads
    out = succeeded(
        docs.process(
            "ingest", str(folder), "--domain", "acme", "--category", "finance", "--tags", "q3,confidential"
        )
    )
    assert "ingested 4 document(s)" in out
    listed = docs.listed()
    assert set(listed) == {("acme", d) for d in ("handbook", "notes", "page", "report")}
    assert {r["format"] for r in listed.values()} == {"markdown", "text", "html", "pdf"}
    assert all(r["tags"] == ["q3", "confidential"] and r["category"] == "finance" for r in listed.values())
    assert listed[("acme", "handbook")]["title"] == "Acme Handbook"
    total = sum(int(str(r["chunks"])) for r in listed.values())
    assert docs.chunk_keys() == total

    again = docs.ok(
        "ingest", str(folder), "--domain", "acme", "--category", "finance", "--tags", "q3,confidential"
    )
    assert "ingested 0 document(s)" in again and "4 unchanged" in again

    (folder / "notes.txt").write_text("Meeting notes\n\nThe budget was cut.\n")
    changed = docs.ok(
        "ingest", str(folder), "--domain", "acme", "--category", "finance", "--tags", "q3,confidential"
    )
    assert "ingested 1 document(s)" in changed and "3 unchanged" in changed
    assert docs.chunk_keys() == sum(int(str(r["chunks"])) for r in docs.listed().values())

    table = docs.ok("list", "--domain", "acme")
    assert "handbook" in table and "q3,confidential" in table and "Acme Handbook" in table
    assert "no documents in domain other" in docs.ok("list", "--domain", "other")


def test_a_bad_file_fails_the_batch_cleanly_with_nothing_written(docs: Docs, folder: Path) -> None:
    shutil.copy(FIXTURES / "corrupt.pdf", folder / "corrupt.pdf")
    shutil.copy(FIXTURES / "invalid-utf8.txt", folder / "invalid-utf8.txt")
    proc = docs.run("ingest", str(folder), "--domain", "acme", "--category", "hr")
    assert proc.returncode == 1
    assert "corrupt.pdf" in proc.stderr and "invalid-utf8.txt" in proc.stderr
    assert "nothing was written" in proc.stderr and "Traceback" not in proc.stderr
    assert docs.listed() == {} and docs.chunk_keys() == 0

    skipped = docs.ok("ingest", str(folder), "--domain", "acme", "--category", "hr", "--skip-bad")
    assert "ingested 4 document(s)" in skipped and "2 skipped" in skipped
    assert ("acme", "corrupt") not in docs.listed()


def test_bad_metadata_and_missing_files_are_clear_errors(docs: Docs, folder: Path) -> None:
    comma = docs.run("ingest", str(folder / "notes.txt"), "--domain", "acme", "--category", "a,b")
    assert comma.returncode == 1 and "category" in comma.stderr
    missing = docs.run("ingest", str(folder / "nope.md"), "--domain", "acme", "--category", "hr")
    assert missing.returncode == 1 and "nope.md: no such file" in missing.stderr
    two = docs.run("ingest", str(folder), "--domain", "acme", "--category", "hr", "--doc-id", "x")
    assert two.returncode == 1 and "exactly one file" in two.stderr
    usage = docs.run("ingest", str(folder))
    assert usage.returncode == 1 and "--domain" in usage.stderr
    assert docs.listed() == {}


def test_delete_by_id_and_ambiguity_across_domains(docs: Docs, folder: Path) -> None:
    notes = str(folder / "notes.txt")
    docs.ok("ingest", notes, "--domain", "acme", "--category", "hr")
    docs.ok("ingest", notes, "--domain", "globex", "--category", "hr")
    ambiguous = docs.run("delete", "notes")
    assert ambiguous.returncode == 1 and "acme, globex" in ambiguous.stderr and "--domain" in ambiguous.stderr
    assert "deleted notes (globex)" in docs.ok("delete", "notes", "--domain", "globex")
    assert "deleted notes (acme)" in docs.ok("delete", "notes")
    gone = docs.run("delete", "notes")
    assert gone.returncode == 1 and "no document 'notes'" in gone.stderr
    assert docs.chunk_keys() == 0


def test_reindex_after_an_embedding_model_change(
    docs: Docs, folder: Path, llm_server: ScriptedLLMServer
) -> None:
    docs.ok("ingest", str(folder), "--domain", "acme", "--category", "hr")
    remote = {"EMBEDDINGS_BASE_URL": llm_server.base_url, "EMBEDDINGS_MODEL": "stand-in"}
    refused = docs.run(
        "ingest", str(folder / "notes.txt"), "--domain", "acme", "--category", "hr", "--force", **remote
    )
    assert refused.returncode == 1 and "vagent docs reindex" in refused.stderr
    assert "all-MiniLM-L6-v2-onnx-int8, 384 dimensions" in docs.ok("status")
    chunks = docs.chunk_keys()
    assert f"reindexed {chunks} chunks with openai-compatible:stand-in" in docs.ok("reindex", **remote)
    status = json.loads(docs.ok("status", "--json", **remote))
    assert status["embedding_model"] == "openai-compatible:stand-in" and status["dimensions"] == 64
    assert status["chunks"] == chunks and status["documents"] == 4
    assert sum(len(r["input"]) for r in llm_server.embedding_requests) >= chunks
    again = docs.run("ingest", str(folder / "notes.txt"), "--domain", "acme", "--category", "hr", "--force")
    assert again.returncode == 1 and "stand-in" in again.stderr  # the offline model is now the stranger


def test_unreachable_redis_is_one_clear_line_without_the_password(docs: Docs, folder: Path) -> None:
    proc = docs.process("list", REDIS_URL=f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0")
    assert proc.returncode == 1
    assert proc.stderr.startswith("vagent docs: cannot reach Redis at 127.0.0.1:")
    assert "hunter2" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


def test_entities_go_to_the_entity_redis_and_documents_work_without_it(
    docs: Docs, folder: Path, module_redis_url: str
) -> None:
    """`vagent docs entities` uses ENTITY_REDIS_URL (the graph reads the entities there);
    while that Redis is away the entity commands say so in one line, and the document
    commands, which never need it, go on."""
    entity_file = str(Path(__file__).resolve().parents[1] / "fixtures" / "entities" / "org.json")
    key = f"{docs.index}_kg:acme"
    out = docs.ok("entities", "load", entity_file, "--domain", "acme", ENTITY_REDIS_URL=module_redis_url)
    assert "into domain acme" in out
    main, entities = redis.Redis.from_url(docs.redis_url), redis.Redis.from_url(module_redis_url)
    try:
        assert entities.type(key) == b"graphdata" and not main.exists(key)
        gone = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
        down = docs.process("entities", "load", entity_file, "--domain", "acme", ENTITY_REDIS_URL=gone)
        assert down.returncode == 1, down.stdout + down.stderr
        assert down.stderr.startswith("vagent docs: cannot reach the entity Redis at 127.0.0.1:"), down.stderr
        assert "(ENTITY_REDIS_URL)" in down.stderr and "Traceback" not in down.stderr
        assert "hunter2" not in down.stderr + down.stdout
        docs.ok(
            "ingest", str(folder / "notes.txt"), "--domain", "acme", "--category", "hr", ENTITY_REDIS_URL=gone
        )
        assert ("acme", "notes") in docs.listed()
        assert "had no entities" not in docs.ok(
            "entities", "delete", "--domain", "acme", ENTITY_REDIS_URL=module_redis_url
        )
        assert not entities.exists(key)
    finally:
        main.close()
        entities.close()
