// Renders chat templates as llama.cpp's Jinja path does (through @huggingface/jinja,
// node-llama-cpp's template engine), for chat_template_conformance_test.
//
// stdin: a JSON list of cases {template, messages, tools?, add_generation_prompt?,
// object_arguments?, thinking_blocks?}; stdout: a JSON list, per case {prompt} or
// {error}. llama.cpp adapts the OpenAI messages to what a template reads before it
// renders, and so does this: with object_arguments a call's `arguments` string becomes
// the object it encodes (templates that write arguments|tojson), with thinking_blocks
// an assistant's reasoning_content becomes a thinking block before its text (Ministral
// 3), and each tool is rebuilt as llama.cpp rebuilds it. bos_token is empty: pico adds
// BOS as a token, not as text.
import { Template } from "@huggingface/jinja";

function adapt(c) {
  return c.messages.map((m) => {
    const out = { ...m };
    if (c.object_arguments && Array.isArray(m.tool_calls)) {
      out.tool_calls = m.tool_calls.map((call) => ({
        ...call,
        function: { ...call.function, arguments: JSON.parse(call.function.arguments) },
      }));
    }
    if (c.thinking_blocks && m.reasoning_content) {
      out.content = [{ type: "thinking", thinking: m.reasoning_content }];
      if (m.content) out.content.push({ type: "text", text: m.content });
      delete out.reasoning_content;
    }
    return out;
  });
}

// What llama.cpp gives every template besides the request: today's date as
// date_string ("%d %b %Y") and datetime ("%b %d %Y"), local time.
function llamaCppDates() {
  const now = new Date();
  const month = now.toLocaleString("en-US", { month: "short" });
  const day = String(now.getDate()).padStart(2, "0");
  return { date_string: `${day} ${month} ${now.getFullYear()}`, datetime: `${month} ${day} ${now.getFullYear()}` };
}

let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = JSON.parse(input).map((c) => {
  try {
    const context = {
      ...llamaCppDates(),
      messages: adapt(c),
      bos_token: "",
      eos_token: "</s>",
      add_generation_prompt: c.add_generation_prompt ?? true,
    };
    // llama.cpp rebuilds each tool so: name, description ("" if none), parameters ({}).
    if (c.tools) {
      context.tools = c.tools.map((t) => ({
        type: "function",
        function: {
          name: t.function.name,
          description: t.function.description ?? "",
          parameters: t.function.parameters ?? {},
        },
      }));
    }
    return { prompt: new Template(c.template).render(context) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(results));
