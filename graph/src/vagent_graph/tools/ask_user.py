"""`ask_user`: the LLM asks the human a clarifying question, optionally with options."""

from __future__ import annotations

from pydantic import BaseModel, Field

from vagent_graph.tools.base import Question, Tool, ToolContext


class AskUserArgs(BaseModel):
    question: str = Field(min_length=1, max_length=2000, description="The question to ask.")
    options: list[str] = Field(
        default_factory=list,
        max_length=10,
        description="Allowed answers, e.g. ['production', 'staging']; empty for free text.",
    )


async def _ask(args: AskUserArgs, ctx: ToolContext) -> Question:
    options = [o.strip() for o in args.options if o.strip()]
    return Question(text=args.question.strip(), options=options, kind="input")


async def _run(args: AskUserArgs, ctx: ToolContext, answer: str | None) -> str:
    return f"The user answered: {answer}"


TOOL = Tool(
    name="ask_user",
    description=(
        "Ask the user a question and wait for the answer. Use it for clarifications "
        "(give options) or for free-text input (no options)."
    ),
    args_model=AskUserArgs,
    ask=_ask,
    run=_run,
)
