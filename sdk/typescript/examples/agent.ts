// An agent loop: the model (through the official `openai` package) calls
// an `execute_python` tool, which runs the code in a stateful Python
// context inside a microVM, until it answers in words.
//
//   OPENAI_API_KEY=... [OPENAI_BASE_URL=...] [OPENAI_MODEL=gpt-4o-mini] \
//     node build/examples/agent.js "What is the 30th Fibonacci number?"
import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";

import { CodeBox, type CellResult } from "@airlock-run/sdk";

const tools: ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "execute_python",
      description:
        "Run Python code in a sandboxed, stateful interpreter (variables persist between calls). " +
        "Returns stdout, stderr, the value of the last expression and any exception.",
      parameters: {
        type: "object",
        properties: { code: { type: "string", description: "Python source to run" } },
        required: ["code"],
      },
    },
  },
];

/** What the model sees of a cell's outcome. */
function describe(r: CellResult): string {
  const parts: string[] = [];
  if (r.stdout) parts.push(`stdout:\n${r.stdout}`);
  if (r.stderr) parts.push(`stderr:\n${r.stderr}`);
  if (r.value !== undefined) parts.push(`value: ${r.value}`);
  if (r.error) parts.push(`error:\n${r.error.traceback}`);
  if (r.timedOut) parts.push("the cell timed out and was interrupted");
  if (r.images.length) parts.push(`${r.images.length} image(s) produced`);
  return parts.join("\n") || "(no output)";
}

async function main(task: string): Promise<void> {
  const openai = new OpenAI(); // reads OPENAI_API_KEY (and OPENAI_BASE_URL if set)
  const model = process.env.OPENAI_MODEL || "gpt-4o-mini";
  await using box = new CodeBox(); // the box is removed when main returns
  const ctx = await box.createContext();
  const messages: ChatCompletionMessageParam[] = [
    { role: "system", content: "You can run Python with the execute_python tool. Use it to compute answers." },
    { role: "user", content: task },
  ];
  for (let turn = 0; turn < 10; turn++) {
    const resp = await openai.chat.completions.create({ model, messages, tools });
    const msg = resp.choices[0].message;
    messages.push(msg);
    if (!msg.tool_calls?.length) {
      console.log(msg.content);
      return;
    }
    for (const call of msg.tool_calls) {
      let content: string;
      if (call.type !== "function" || call.function.name !== "execute_python") {
        content = `unknown tool ${call.type === "function" ? call.function.name : call.type}`;
      } else {
        const { code } = JSON.parse(call.function.arguments) as { code: string };
        content = describe(await ctx.run(code, { timeout: 60 }));
      }
      messages.push({ role: "tool", tool_call_id: call.id, content });
    }
  }
  console.log("gave up after 10 turns");
}

main(process.argv[2] ?? "Compute the first 10 prime numbers and print them as a list.").catch((err) => {
  console.error(`agent failed: ${err}`);
  process.exitCode = 1;
});
