// One round trip through the gateway with LangGraph's JavaScript SDK, as a web client makes it:
// create a thread (or reuse THREAD_ID), stream a run with the values and messages-tuple modes,
// print every step as one JSON line on stdout. Driven by tests/integration/test_gateway_js_sdk.py.
//
// Environment: GATEWAY_URL, GATEWAY_TOKEN (the person's Matrix access token, sent as the API
// key), ASSISTANT_ID, QUESTION, THREAD_ID (optional). The token is never printed.
// Exit status: 0 when the stream ended, 1 with an {"kind": "error"} line when a call failed.
import { Client } from "@langchain/langgraph-sdk";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const emit = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);

try {
  const client = new Client({ apiUrl: env("GATEWAY_URL"), apiKey: env("GATEWAY_TOKEN") });
  const threadId = process.env.THREAD_ID || (await client.threads.create()).thread_id;
  emit({ kind: "thread", thread_id: threadId });
  const stream = client.runs.stream(threadId, env("ASSISTANT_ID"), {
    input: { messages: [{ type: "human", content: env("QUESTION") }] },
    streamMode: ["values", "messages-tuple"],
  });
  for await (const part of stream) {
    emit({ kind: "event", event: part.event, data: part.data });
  }
  emit({ kind: "done" });
} catch (error) {
  emit({ kind: "error", status: error?.status ?? null, name: error?.name, message: String(error?.message) });
  process.exitCode = 1;
}
