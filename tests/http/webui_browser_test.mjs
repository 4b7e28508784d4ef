// pico-coord's web UI in a real browser: headless Chromium (Debian's) driven by
// playwright-core against a running pico-coord (http_test.py's webui mode starts it with
// two workers). The chat page streams a reply into a conversation that stays after a
// reload, stop ends a stream early, the settings reach the request; the cluster page
// lists both stages with their workers and the request counts, and its activation
// heatmap fills with the tokens generated meanwhile, one row per layer. Screenshots go
// to OUT_DIR (kept as test artifacts).
//   node webui_browser_test.mjs PORT OUT_DIR
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const { chromium } = await import(pathToFileURL(join(here, '../conformance/node_modules/playwright-core/index.mjs')).href);
const [port, outDir] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
mkdirSync(outDir, { recursive: true });

let failures = 0;
function check(ok, what) {
  console.log((ok ? 'ok: ' : 'FAIL: ') + what);
  if (!ok) failures++;
}

const executablePath = process.env.PICO_CHROMIUM || '/usr/bin/chromium';
const browser = await chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  // Every request the page makes, to check what the settings put in it.
  const bodies = [];
  page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) bodies.push(JSON.parse(r.postData())); });

  await page.goto(base + '/');
  check(await page.title() === 'pico', 'the page is served at /');
  await page.fill('#set-max_tokens', '24');
  await page.dispatchEvent('#set-max_tokens', 'change');
  await page.fill('#set-temperature', '0');
  await page.dispatchEvent('#set-temperature', 'change');

  // A streamed reply: several partial renders, then the final one with its timings.
  await page.fill('#input', 'Write a poem about a fox.');
  // Each text the streaming message shows, seen in the page as it changes (polling from
  // here could miss a short reply on a busy machine).
  await page.evaluate(() => {
    window.partials = new Set();
    new MutationObserver(() => {
      const t = document.querySelector('.message.assistant.streaming .content')?.textContent;
      if (t) window.partials.add(t);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  await page.click('#send');
  await page.waitForSelector('#status:text("done")', { timeout: 60000 });
  const partials = await page.evaluate(() => window.partials.size);
  const reply = await page.locator('.message.assistant .content').last().textContent();
  const stats = await page.locator('.message.assistant .stats').last().textContent();
  check(reply.length > 0, `the reply is shown (${reply.length} characters)`);
  check(/24 tokens/.test(stats) && /tok\/s/.test(stats), `its timings are shown (${stats})`);
  check(partials >= 2, `it streamed: ${partials} partial renders`);
  check(bodies.length === 1 && bodies[0].stream === true && bodies[0].max_tokens === 24 && bodies[0].temperature === 0,
        'the request carries stream and the settings ' + JSON.stringify(bodies[0] ?? {}));
  await page.screenshot({ path: join(outDir, 'chat.png') });

  // The conversation stays in the browser.
  await page.reload();
  check(await page.locator('.message').count() === 2, 'after a reload the conversation is still there');
  check(await page.locator('#conversation-list li').count() === 1, 'and listed');

  // Stop: a long reply ends early, the page says so and keeps what came.
  await page.fill('#set-max_tokens', '4000');
  await page.dispatchEvent('#set-max_tokens', 'change');
  await page.fill('#input', 'Go on, at length.');
  await page.click('#send');
  await page.waitForFunction(() => (document.querySelector('.message.assistant.streaming .content')?.textContent ?? '').length > 0,
                             null, { timeout: 60000 });
  await page.click('#stop');
  await page.waitForSelector('#status:text("stopped")', { timeout: 30000 });
  check(await page.locator('.message').count() === 4, 'stop keeps the partial reply');

  // Regenerate replaces the last reply.
  await page.fill('#set-max_tokens', '8');
  await page.dispatchEvent('#set-max_tokens', 'change');
  await page.click('#regenerate');
  await page.waitForSelector('#status:text("done")', { timeout: 60000 });
  check(await page.locator('.message').count() === 4 && bodies.length === 3 && bodies[2].messages.length === 3,
        'regenerate sends the conversation without the last reply and replaces it');

  // Markdown: code blocks are rendered, markup in text is not executed.
  const rendered = await page.evaluate(() => renderMarkdown('# T\n\n```js\nlet a = "<b>";\n```\n- **x** <script>'));
  check(rendered.includes('<pre><code class="language-js">let a = &quot;&lt;b&gt;&quot;;</code></pre>') &&
        rendered.includes('<strong>x</strong> &lt;script&gt;'), 'markdown: code blocks, escaping');

  // The cluster page: both stages, their workers, live counters.
  await page.click('#nav-cluster');
  await page.waitForFunction(() => document.querySelectorAll('#stages tbody tr').length >= 2, null, { timeout: 15000 });
  const stages = await page.$$eval('#stages tbody tr', (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  check(stages.length === 2 && stages[0][1] === '0-0' && stages[1][1] === '1-1' && stages.every((r) => r[3] === 'up'),
        'the cluster page lists both stages, up: ' + JSON.stringify(stages));
  check(stages.every((r) => r[4].startsWith('cpu')), 'with their backends');
  // The heatmap: tokens computed while the page is open arrive with one RMS per layer
  // of the model (both stages' layers), and it updates as more come.
  const generate = (n) => fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'The fox', max_tokens: n, temperature: 0 }),
  });
  await generate(16);
  await page.waitForFunction(() => Number(document.querySelector('#heatmap').dataset.tokens) >= 16, null,
                             { timeout: 15000 });
  const first = Number(await page.getAttribute('#heatmap', 'data-tokens'));
  const info = await page.textContent('#heatmap-info');
  check(/2 layers/.test(info), 'the heatmap has a row per layer of the model: ' + info);
  await page.screenshot({ path: join(outDir, 'heatmap-1.png') });
  await generate(24);
  await page.waitForFunction((n) => Number(document.querySelector('#heatmap').dataset.tokens) >= n + 24, first,
                             { timeout: 15000 });
  const second = Number(await page.getAttribute('#heatmap', 'data-tokens'));
  check(second >= first + 24, `the heatmap updates (${first} then ${second} tokens traced)`);
  const painted = await page.evaluate(() => {
    const c = document.querySelector('#heatmap');
    const d = c.getContext('2d').getImageData(c.width - 4, 0, 4, c.height).data;
    const colors = new Set();
    for (let i = 0; i < d.length; i += 4) colors.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]);
    return colors.size;
  });
  check(painted >= 2, `its newest column is painted (${painted} colors)`);
  // Live per-stage figures while a long generation runs: compute, queue and transfer per
  // batch and tokens per second on each stage's row, and its worker's memory used / free
  // (as of the engine's last idle moment: after the generations above).
  const long = fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'The fox', max_tokens: 600, temperature: 0, ignore_eos: true }),
  });
  const live = await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('#stages tbody tr')].map((r) => [...r.cells].map((c) => c.textContent));
    return rows.length === 2 && rows.every((r) => / [MG]iB \(KV .* [MG]iB\) \/ .* [MG]iB$/.test(r[8]) && / ms$/.test(r[9]) &&
                                                  / ms$/.test(r[10]) && / ms$/.test(r[11]) && Number(r[12]) > 0) && rows;
  }, null, { timeout: 30000, polling: 200 }).then((h) => h.jsonValue()).catch(() => null);
  check(live !== null, 'each stage shows its memory used / free, compute / queue / transfer per batch and tok/s: ' +
        JSON.stringify(await page.$$eval('#stages tbody tr', (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)))));
  await page.screenshot({ path: join(outDir, 'cluster-live.png') });
  await long;
  const summary = await page.textContent('#cluster-summary');
  check(/2 worker\(s\) in 2 stage\(s\)/.test(summary) && /tokens generated/.test(summary), 'summary: ' + summary);
  await page.screenshot({ path: join(outDir, 'cluster.png') });
  // Leaving the page ends the stream: the engine stops tracing (checked by the caller
  // through /layer-trace's absence of watchers: a step after this is not traced).
  await page.click('#nav-chat');
  check(errors.length === 0, 'no script errors: ' + JSON.stringify(errors));
} finally {
  await browser.close();
}
process.exit(failures ? 1 : 0);
