"""The `make run` demo, minus Matrix: the demo knowledge ingested with `vagent docs ingest
--manifest`, the graph service on its offline model, and the AcContexts the development
provider gives alice, bob, carol and admin from the demo policy. The same question gets
different, cited answers from only what each may read; with carol in the room, alice gets
only what carol may read; another tenant's documents never appear."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.factories import message_body, new_session
from tests.support.graph_process import TOKEN, GraphProcess
from tests.support.sse import post_sse
from vagent_dev.acp import context_for, load_policy
from vagent_shared.access import AcContext
from vagent_shared.events import TextFinal
from vagent_shared.knowledge import Audience, AudienceMember

ROOT = Path(__file__).resolve().parents[2]
POLICY = load_policy(ROOT / "deploy/dev/acp-policy.yaml")
MANIFEST = ROOT / "deploy/dev/knowledge/manifest.yaml"


def demo_user(name: str) -> AcContext:
    ctx = context_for(POLICY, f"@{name}:localhost", "localhost").ac
    assert ctx is not None
    return ctx


@pytest.fixture(scope="module")
def graph(
    redis_url: str, module_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """As `make run` has it: the entities in a Redis of their own (ENTITY_REDIS_URL)."""
    index = f"demo_{uuid.uuid4().hex[:8]}"
    env = {
        "REDIS_URL": redis_url,
        "ENTITY_REDIS_URL": module_redis_url,
        "DOCS_INDEX": index,
        "ENTITY_GRAPH": f"{index}_kg",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "vagent"), "docs", "ingest", "--manifest", str(MANIFEST)],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ingested 13 document\(s\)", proc.stdout), proc.stdout
    assert "loaded 23 entities" in proc.stdout and "into domain acme" in proc.stdout
    with GraphProcess(redis_url, tmp_path_factory.mktemp("demo"), **env) as g:  # the offline model
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
        yield c


async def ask(client: httpx.AsyncClient, who: str, text: str, audience: Audience | None = None) -> str:
    body = message_body(new_session(f"@{who}:localhost"), text, demo_user(who))
    if audience is not None:
        body["audience"] = audience.model_dump(mode="json", by_alias=True)
    events = await post_sse(client, "/api/v1/process_message", body, {"Authorization": f"Bearer {TOKEN}"})
    return [e for e in events if isinstance(e, TextFinal)][-1].content


def sources(answer: str) -> set[str]:
    """The doc ids of the answer's "Sources:" list."""
    _, _, listed = answer.partition("\nSources:\n")
    return set(re.findall(r"\(`([^`]+)`\)$", listed, re.M))


def with_carol() -> Audience:
    return Audience(
        members=[AudienceMember(user_id="@carol:localhost", ac_context=demo_user("carol"))], member_count=3
    )


async def test_the_same_question_gets_different_cited_answers(client: httpx.AsyncClient) -> None:
    for question in ("What were the Q3 results?", "What was the Q3 revenue?"):
        alice = await ask(client, "alice", question)
        bob = await ask(client, "bob", question)
        assert alice.startswith("(offline model) From the documents you may read:")
        assert {"q3-2026-financials", "q3-2026-press-summary"} <= sources(alice)
        assert "q3-2026-press-summary" in sources(bob) and "q3-2026-financials" not in sources(bob)
        assert "FIN-Q3-2026" not in bob and "18.4" not in bob
    assert "EUR 18.4 million" in alice and "more than 20 percent" in bob


async def test_with_carol_in_the_room_alice_gets_only_what_carol_may_read(client: httpx.AsyncClient) -> None:
    alone = await ask(client, "alice", "What is the per diem?")
    assert "travel-executive-addendum" in sources(alone)
    in_room = await ask(client, "alice", "What is the per diem?", with_carol())
    carol = await ask(client, "carol", "What is the per diem?")
    assert sources(in_room) and sources(in_room) <= {"travel-policy", "employee-handbook", "security-policy"}
    assert "travel-executive-addendum" not in in_room and "120" not in in_room
    assert sources(in_room) == sources(carol)


async def test_exact_codes_are_found_for_those_who_may_read_them(client: httpx.AsyncClient) -> None:
    bob = await ask(client, "bob", "What happened in INC-0042?")
    assert "runbook-db-failover" in sources(bob)
    carol = await ask(client, "carol", "What happened in INC-0042?")
    assert "runbook-db-failover" not in sources(carol) and "INC-0042" not in carol


async def test_another_tenant_never_appears_even_for_a_superuser(client: httpx.AsyncClient) -> None:
    for question in ("What were the Q3 results?", "What is the per diem?", "ACME-FIN-Q3-2026"):
        answer = await ask(client, "admin", question)
        assert not any(s.startswith("acme") for s in sources(answer)), answer
        assert "USD" not in answer


async def test_a_path_through_a_forbidden_entity_is_not_revealed(client: httpx.AsyncClient) -> None:
    question = "How is Ana Costa connected to Fabrikam Health?"
    alice = await ask(client, "alice", question)
    assert "NIGHTJAR" in alice and "Fabrikam Health" in alice
    for answer in (await ask(client, "carol", question), await ask(client, "alice", question, with_carol())):
        assert "Ana Costa" in answer
        assert "NIGHTJAR" not in answer and "Fabrikam" not in answer
