// The official openai client (tests/conformance/node_modules) against pico-coord:
// chat, streaming chat (with usage), completions, models, structured output (.parse).
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
process.exit(failed ? 1 : 0);
