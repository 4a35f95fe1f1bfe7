"""`schedule_task` without Redis: offered and callable only with `tool:schedule_task`, always
confirmed, its question showing the task, the schedule and the next run in the user's zone;
and the offline model turning "remind me every morning at 9 to ..." into that call."""

from __future__ import annotations

from datetime import UTC, datetime

from langchain_core.messages import HumanMessage, ToolMessage

from tests.support.factories import ac
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.models.offline_model import plan_reply
from vagent_graph.tools.base import Prepared
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.tools.schedule import ScheduleTaskArgs, headline, parse_call
from vagent_graph.workflow.access import check_invocation, visible_tools
from vagent_graph.workflow.approval import approval_for
from vagent_shared.schedule_times import ParsedSchedule, ScheduleRefusal

NOW = datetime(2026, 11, 18, 10, 0, tzinfo=UTC)  # a Wednesday
REGISTRY = default_registry()
TOOL = REGISTRY.get("schedule_task")
AGENT = load_descriptor()


def everything() -> list[dict[str, object]]:
    return [t.openai_schema() for t in REGISTRY]


def question(args: ScheduleTaskArgs, tz: str) -> str:
    """The question the workflow asks for this call (confirmation.py), with the tool's headline."""
    assert TOOL is not None
    parsed = parse_call(args, NOW, tz, 900)
    assert isinstance(parsed, ParsedSchedule), parsed
    arguments = args.model_dump(mode="json")
    approval = approval_for(
        "c1", TOOL, arguments, Prepared(headline(parsed, tz)), None, confirm=True, personal=False
    )
    assert isinstance(approval, dict)
    return str(approval["question"])


def test_offered_and_callable_only_with_its_grant_and_always_confirmed() -> None:
    assert TOOL is not None and TOOL.requires_confirmation and "schedule_task" in AGENT.tools
    granted = ac("@a:x", ["tool:schedule_task"])
    ungranted = ac("@b:x", ["tool:ask_user"])
    assert "schedule_task" in {t.name for t in visible_tools(REGISTRY, AGENT, granted)}
    assert "schedule_task" not in {t.name for t in visible_tools(REGISTRY, AGENT, ungranted)}
    assert check_invocation("schedule_task", REGISTRY, AGENT, ungranted).reason == "tool_not_granted"
    assert check_invocation("schedule_task", REGISTRY, AGENT, granted).allowed
    params = TOOL.openai_schema()["function"]["parameters"]
    assert set(params["properties"]) == {"task", "at", "every", "cron"} and params["required"] == ["task"]


def test_the_question_shows_task_schedule_and_next_run_in_the_users_zone() -> None:
    args = ScheduleTaskArgs(task="List my open tickets", cron="0 9 * * 1-5")
    asked = question(args, "Europe/Oslo")
    first, *rest = asked.splitlines()
    assert first == (
        "Schedule this task every weekday at 09:00 (Europe/Oslo), next run Thu 19 Nov 2026 09:00 CET?"
    ), asked
    assert rest == ["`task`: `List my open tickets`", "`cron`: `0 9 * * 1-5`"]  # no `at`: null
    once = question(ScheduleTaskArgs(task="Call Bob", at="2026-12-01T14:00:00Z"), "UTC")
    assert once.startswith(
        "Schedule this task once on Tue 1 Dec 2026 14:00 UTC, next run Tue 1 Dec 2026 14:00 UTC?"
    )
    every = question(ScheduleTaskArgs(task="Stretch", every="2h"), "UTC")
    assert every.startswith("Schedule this task every 2 hours, next run Wed 18 Nov 2026 12:00 UTC?"), every


def test_calls_that_cannot_be_scheduled_are_refused_in_one_sentence() -> None:
    def refusal(**kw: str) -> str:
        found = parse_call(ScheduleTaskArgs(task=kw.pop("task", "Ping"), **kw), NOW, "UTC", 900)
        assert isinstance(found, ScheduleRefusal), found
        return found.message

    assert refusal(every="2h", cron="0 9 * * *") == "Give exactly one of at, every, cron."
    assert refusal() == "Give exactly one of at, every, cron."
    assert "15 minutes" in refusal(every="1m")
    assert "ISO 8601" in refusal(at="next tuesday")
    assert refusal(at="2026-11-18T09:00:00Z")  # in the past
    assert refusal(at="2028-01-01T09:00:00Z")  # more than a year ahead


def test_the_offline_model_schedules_what_it_is_asked_to() -> None:
    def call(text: str) -> dict[str, object]:
        (made,) = plan_reply([HumanMessage(content=text)], everything(), NOW).tool_calls
        assert made["name"] == "schedule_task", text
        return dict(made["args"])

    assert call("remind me every morning at 9 to water the plants") == {
        "task": "Remind me to water the plants",
        "cron": "0 9 * * *",
    }
    assert call("Remind me every weekday at 9 to check my open tickets")["cron"] == "0 9 * * 1-5"
    assert call("schedule every weekday at 09:00: list my open tickets") == {
        "task": "list my open tickets",
        "cron": "0 9 * * 1-5",
    }
    assert call("remind me in 20 minutes to call Bob") == {
        "task": "Remind me to call Bob",
        "at": "2026-11-18T10:20:00Z",
    }
    assert call("please remind me every 2 hours to stretch") == {
        "task": "Remind me to stretch",
        "every": "2h",
    }
    assert call("schedule cron 30 8 * * 1: weekly report") == {"task": "weekly report", "cron": "30 8 * * 1"}
    assert call("remind me every day at 7pm to go home")["cron"] == "0 19 * * *"
    # not offered: no call, and the tool is not named
    lacking = [t for t in everything() if t["function"]["name"] != "schedule_task"]  # type: ignore[index]
    reply = plan_reply([HumanMessage(content="remind me every morning at 9 to stretch")], lacking, NOW)
    assert not reply.tool_calls and "schedule_task" not in str(reply.content)
    # the scheduled run itself ("Remind me to ...", no time): the reminder
    due = plan_reply([HumanMessage(content="Remind me to water the plants")], everything(), NOW)
    assert not due.tool_calls and str(due.content) == "(offline model) ⏰ Reminder: water the plants."
    done = ToolMessage(
        content="Scheduled task 2 ('Stretch'), every 2 hours; next run Wed 18 Nov 2026 12:00 UTC. "
        "The user can list it with !schedules and remove it with !unschedule 2.",
        tool_call_id="x",
        name="schedule_task",
    )
    said = str(plan_reply([done], [], NOW).content)
    assert said.startswith("(offline model) Scheduled task 2") and "You can list it with !schedules" in said
