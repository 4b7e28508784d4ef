// The official openai client (tests/conformance/node_modules) against pico-coord:
// chat, streaming chat (with usage), completions, models, structured output (.parse),
// tool calls (required, named, parallel, streamed) and a runTools loop.
//   node openai_client_test.mjs PORT REF_TEXT_FILE
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const { default: OpenAI } = await import(pathToFileURL(join(here, '../conformance/node_modules/openai/index.mjs')).href);
const [port, refFile] = process.argv.slice(2);
const ref = readFileSync(refFile, 'utf8');
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
let failed = 0;
const check = (cond, what) => { console.log(`${cond ? 'ok' : 'FAIL'}: openai client: ${what}`); if (!cond) failed++; };

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === 'M', 'models.list');

const messages = [{ role: 'user', content: 'Hello there' }];
const chat = await client.chat.completions.create({ model: 'M', messages, max_tokens: 8, temperature: 0 });
check(chat.choices[0].message.role === 'assistant' && chat.usage.completion_tokens > 0, 'chat.completions.create');

const stream = await client.chat.completions.create({ model: 'M', messages, max_tokens: 8, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
let text = '', usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length) { text += chunk.choices[0].delta.content ?? ''; finish = chunk.choices[0].finish_reason ?? finish; }
  if (chunk.usage) usage = chunk.usage;
}
check(text === chat.choices[0].message.content, 'streamed chat text equals the plain one');
check(usage && usage.completion_tokens === chat.usage.completion_tokens && finish !== null, 'streamed chat usage, finish_reason');

const comp = await client.completions.create({ model: 'M', prompt: 'The quick brown fox jumps over the lazy dog, and then',
                                               max_tokens: 24, temperature: 0 });
check(comp.choices[0].text === ref, 'completions.create greedy equals pico run');

// Any model name is served by the one model, as llama-server does.
const other = await client.chat.completions.create({ model: 'gpt-3.5-turbo', messages, max_tokens: 4, temperature: 0 });
check(other.choices.length === 1 && other.usage.completion_tokens > 0, 'another model name is served');
// Structured output: .parse() with a JSON schema (what zod's helpers produce, written out).
const schema = { type: 'object', additionalProperties: false, required: ['city', 'rank'],
                 properties: { city: { type: 'string', maxLength: 5 }, rank: { type: 'integer', minimum: 1, maximum: 9 } } };
const parsed = await client.chat.completions.parse({ model: 'M', messages, max_tokens: 300, temperature: 1, seed: 2,
                                                     response_format: { type: 'json_schema',
                                                                        json_schema: { name: 'place', strict: true, schema } } });
const place = parsed.choices[0].message.parsed;
check(place && Object.keys(place).sort().join() === 'city,rank' && typeof place.city === 'string' &&
      place.city.length <= 5 && Number.isInteger(place.rank) && place.rank >= 1 && place.rank <= 9,
      `chat.completions.parse with a json_schema: ${JSON.stringify(place)}`);

// Tools. The synthetic model writes prose, so tool_choice 'required' (a grammar) is what
// makes it call: the calls must be well-formed, the same streamed, and a whole tool
// loop (runTools) must go through the server, results and all.
const weather = { type: 'object', additionalProperties: false, required: ['city', 'days'],
                  properties: { city: { type: 'string', enum: ['Oslo', 'Rome'] }, days: { type: 'integer', minimum: 1, maximum: 7 } } };
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: weather } },
               { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
const wellFormed = (call) => {
  try {
    const args = JSON.parse(call.function.arguments);
    return call.type === 'function' && typeof call.id === 'string' && call.id.length > 0 &&
      (call.function.name === 'get_time' ? typeof args === 'object' :
        call.function.name === 'get_weather' && ['Oslo', 'Rome'].includes(args.city) && Number.isInteger(args.days) &&
        args.days >= 1 && args.days <= 7);
  } catch { return false; }
};
const toolRequest = { model: 'M', messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools, tool_choice: 'required',
                      max_tokens: 300, temperature: 0 };
const called = await client.chat.completions.create(toolRequest);
const calls = called.choices[0].message.tool_calls ?? [];
check(calls.length === 1 && calls.every(wellFormed) && called.choices[0].finish_reason === 'tool_calls',
      `tool_choice required: one well-formed call, finish_reason tool_calls (${JSON.stringify(called.choices[0])})`);

const toolStream = await client.chat.completions.create({ ...toolRequest, stream: true });
const streamed = [];
let toolFinish = null;
for await (const chunk of toolStream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  for (const d of choice.delta.tool_calls ?? []) {
    streamed[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
    if (d.id) streamed[d.index].id = d.id;
    if (d.function?.name) streamed[d.index].function.name += d.function.name;
    streamed[d.index].function.arguments += d.function?.arguments ?? '';
  }
  toolFinish = choice.finish_reason ?? toolFinish;
}
check(streamed.length === 1 && wellFormed(streamed[0]) && streamed[0].function.name === calls[0]?.function.name &&
      streamed[0].function.arguments === calls[0]?.function.arguments && toolFinish === 'tool_calls',
      `streamed tool call equals the plain one (${JSON.stringify(streamed)})`);

const named = await client.chat.completions.create({ ...toolRequest, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
check(named.choices[0].message.tool_calls?.length === 1 && named.choices[0].message.tool_calls[0].function.name === 'get_weather' &&
      wellFormed(named.choices[0].message.tool_calls[0]),
      `a named tool_choice calls that tool, arguments valid (${JSON.stringify(named.choices[0].message.tool_calls)})`);
const parallel = await client.chat.completions.create({ ...toolRequest, parallel_tool_calls: true, temperature: 1, seed: 5 });
check((parallel.choices[0].message.tool_calls ?? []).length >= 1 && parallel.choices[0].message.tool_calls.every(wellFormed),
      `parallel_tool_calls: well-formed calls (${(parallel.choices[0].message.tool_calls ?? []).length})`);

let ran = 0;
try {
  const runner = client.chat.completions.runTools({
    model: 'M', messages: [{ role: 'user', content: 'Weather in Oslo?' }], tool_choice: 'required', max_tokens: 300,
    temperature: 0,
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: weather, parse: JSON.parse,
                                            function: (args) => { ran += wellFormed({ type: 'function', id: 'x', function: { name: 'get_weather', arguments: JSON.stringify(args) } }) ? 1 : 0; return { celsius: 21 }; } } }],
  }, { maxChatCompletions: 2 });
  await runner.done();
  const sent = runner.messages.map((m) => m.role).join(',');
  check(ran === 2 && sent.includes('assistant,tool,assistant,tool'),
        `runTools: the function ran on each well-formed call and its results went back (${ran} runs; ${sent})`);
} catch (e) {
  check(false, `runTools: ${e}`);
}
// The Responses API: text, its stream of typed events, structured output, a required
// function call and the call's output sent back.
const resp = await client.responses.create({ model: 'M', input: 'Hello there', instructions: 'Be brief.',
                                             max_output_tokens: 8, temperature: 0 });
check(resp.object === 'response' && resp.status === 'incomplete' && resp.output.at(-1).type === 'message' &&
      resp.output_text.length > 0 && resp.usage.output_tokens === 8,
      `responses.create: a message item, output_text (${resp.status}, ${JSON.stringify(resp.usage)})`);
const events = await client.responses.create({ model: 'M', input: 'Hello there', instructions: 'Be brief.',
                                               max_output_tokens: 8, temperature: 0, stream: true });
const types = [];
let deltas = '', numbered = true, final = null;
for await (const ev of events) {
  numbered = numbered && ev.sequence_number === types.length;
  types.push(ev.type);
  if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  if (ev.type === 'response.incomplete' || ev.type === 'response.completed') final = ev.response;
}
check(numbered && types[0] === 'response.created' && types[1] === 'response.in_progress' &&
      types.includes('response.output_item.added') && types.includes('response.output_text.done') &&
      types.at(-1) === 'response.incomplete' && deltas === resp.output_text && final?.output?.at(-1)?.content?.[0]?.text === resp.output_text,
      `responses stream: numbered events, the same text (${types.join(',')})`);
const structured = await client.responses.create({ model: 'M', input: 'A place?', max_output_tokens: 300, temperature: 1, seed: 2,
                                                   text: { format: { type: 'json_schema', name: 'place', strict: true, schema } } });
let placed = null;
try { placed = JSON.parse(structured.output_text); } catch { placed = null; }
check(placed && typeof placed.city === 'string' && placed.city.length <= 5 && Number.isInteger(placed.rank),
      `responses with text.format json_schema: ${structured.output_text}`);
const flatTools = tools.map((t) => ({ type: 'function', ...t.function }));
const respCalled = await client.responses.create({ model: 'M', input: 'Weather in Oslo?', tools: flatTools,
                                               tool_choice: 'required', max_output_tokens: 300, temperature: 0 });
const fc = respCalled.output.find((o) => o.type === 'function_call');
check(fc && fc.call_id && wellFormed({ type: 'function', id: fc.call_id, function: { name: fc.name, arguments: fc.arguments } }),
      `responses: a required call is a well-formed function_call item (${JSON.stringify(fc)})`);
if (fc) {
  const after = await client.responses.create({ model: 'M', tools: flatTools, max_output_tokens: 4, temperature: 0,
                                                input: [{ role: 'user', content: 'Weather in Oslo?' }, fc,
                                                        { type: 'function_call_output', call_id: fc.call_id, output: '{"celsius": 21}' }] });
  check(after.status === 'incomplete' && after.usage.input_tokens > respCalled.usage.input_tokens,
        `responses: the call and its output go back as input (${after.usage.input_tokens} input tokens)`);
}

// Embeddings: the client asks for base64 and decodes it.
const embedded = await client.embeddings.create({ model: 'M', input: ['one text', 'another'] });
check(embedded.data.length === 2 && embedded.data.every((d, i) => d.index === i && d.embedding.length === 64 &&
                                                          d.embedding.every(Number.isFinite)) &&
      Math.abs(Math.hypot(...embedded.data[0].embedding) - 1) < 1e-4 && embedded.usage.prompt_tokens > 0,
      `embeddings: one normalised vector of the model's width per input (${JSON.stringify(embedded.usage)})`);
process.exit(failed ? 1 : 0);
