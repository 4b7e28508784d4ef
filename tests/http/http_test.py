#!/usr/bin/env python3
"""HTTP API tests of pico-coord (python3 stdlib only).

    http_test.py BUILD_DIR MODE      MODE: local | cluster | auth | openai | prefill | limits | reasoning | hybrid
                                           | webui

webui: the web UI's files, then its pages in headless Chromium (webui_browser_test.mjs,
playwright-core) against 2 pico-workers; screenshots in BUILD_DIR/Testing/webui.

openai: the official npm client (tests/conformance/node_modules/openai) via
openai_client_test.mjs, against 2 pico-workers (chat, streaming, structured output, tool
calls, a runTools loop); fails without node or the package (scripts/setup.sh installs both).

Writes a synthetic qwen3 model (Qwen3's template), starts pico-coord on a free loopback
port (in-process, or against 2 pico-workers), and checks every endpoint: greedy text
equal to `pico run`, streaming ([DONE]), 32 concurrent streams, stop strings, n > 1,
prompt-prefix reuse (cached counts, replies equal to a fresh computation), clients that
disconnect (streaming or not, in decode, queued: their sequences are freed on every
stage), malformed requests, --api-key. prefill: a larger model (seconds of prefill) on 2
workers, clients that disconnect during prefill. limits: request validation per endpoint,
the HTTP limits (connections, queue, body, header, stop strings, write deadline, accept
back-off, Expect: 100-continue), --api-key-file and PICO_API_KEY, CORS on and off,
n_predict 0, the context reached during decode, logit_bias and n_probs. reasoning: a model
with Qwen3.5's chat template (its prompt opens a <think> block): /apply-template, and the
reply's reasoning in reasoning_content (streamed too) or left in the content
(reasoning_format none, --reasoning-format none), checked against the raw text of
/completion on the same prompt; logit_bias bans or forces </think> to make the random
model's reply deterministic.
"""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD, MODE = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
if MODE == "openai" and (shutil.which("node") is None or not os.path.exists(
        os.path.join(HERE, "../conformance/node_modules/openai/package.json"))):
    print("FAIL: node or tests/conformance/node_modules/openai is missing (run scripts/setup.sh)")
    sys.exit(1)
if MODE == "webui" and (shutil.which("node") is None or not os.path.exists(
        os.path.join(HERE, "../conformance/node_modules/playwright-core/package.json")) or
        not os.path.exists(os.environ.get("PICO_CHROMIUM", "/usr/bin/chromium"))):
    print("FAIL: node, tests/conformance/node_modules/playwright-core or chromium is missing (run scripts/setup.sh)")
    sys.exit(1)
PICO = os.path.join(BUILD, "tools/pico/pico")
COORD = os.path.join(BUILD, "coordinator/pico-coord")
WORKER = os.path.join(BUILD, "worker/pico-worker")
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
N = 24
CTX = 1024
KEY = "sekrit-key"

tmp = tempfile.mkdtemp(prefix="pico-http-test.")
procs = []
failures = []


def check(cond, what):
    if cond:
        print("ok:", what)
    else:
        print("FAIL:", what)
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, log):
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, log), "w"))
    procs.append(p)
    return p


def wait_port(log, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(r"listening on http://[^:]+:(\d+)", open(os.path.join(tmp, log)).read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    print(open(os.path.join(tmp, log)).read())
    raise SystemExit("pico-coord did not start")


class Client:
    def __init__(self, port, key=None):
        self.port, self.key = port, key

    def request(self, method, path, body=None, raw=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, text

    def json(self, method, path, body=None, **kw):
        status, text = self.request(method, path, body, **kw)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def stream(self, path, body):
        """Returns (status, list of data payloads) of an SSE response."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        c.request("POST", path, body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        events = []
        for line in r.read().decode("utf-8", "replace").split("\n"):
            if line.startswith("data: "):
                events.append(line[6:])
        c.close()
        return r.status, events


def raw_post(port, path, body):
    """Sends a request on a raw socket (to close it at will); returns the socket."""
    sock = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s" % (path, len(data), data)).encode())
    return sock


def metric(api, name):
    _, m = api.request("GET", "/metrics")
    return float(re.search(r"^%s (\S+)$" % re.escape(name), m, re.M).group(1))


def processing(api):
    """The slots of running requests (/slots also lists idle ones kept for prefix reuse)."""
    s, sl = api.json("GET", "/slots")
    return [x for x in sl if x["is_processing"]] if s == 200 else None


def wait_until(cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def stages_hold_only_kept(api):
    """Idle engine: every stage holds exactly the kept sequences (none of a cancelled request)."""
    def ok():
        if processing(api):
            return False
        _, m = api.request("GET", "/metrics")
        kept = int(float(re.search(r"^pico:kept_sequences (\S+)$", m, re.M).group(1)))
        seqs = [int(float(v)) for v in re.findall(r'^pico:stage_sequences\{stage="\d+"\} (\S+)$', m, re.M)]
        _, sl = api.json("GET", "/slots")
        return bool(seqs) and all(v == kept for v in seqs) and len(sl) == kept
    return wait_until(ok, 20)


def cleanup(show_logs=False):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    if show_logs:  # the processes' own account of a failure, before their folder goes
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                lines = open(os.path.join(tmp, name), errors="replace").read().splitlines()
                print("--- %s (last %d of %d lines)" % (name, min(40, len(lines)), len(lines)))
                print("\n".join(lines[-40:]))
    shutil.rmtree(tmp, ignore_errors=True)


def prefill_main():
    """Clients gone during a long prefill (streaming or not): the prefill stops (no token is
    ever sampled) and the sequence is freed on both workers."""
    model = os.path.join(tmp, "big.gguf")
    subprocess.run([PICO, "mkmodel", "--arch", "llama", "--vocab", "llama2", "--layers", "4", "--embd", "384", "--ff",
                    "1024", "--heads", "6", "--kv-heads", "2", "--ctx", "4096", "--type", "f16", "--tied", "--seed",
                    "3", "-o", model], check=True, stdout=subprocess.DEVNULL)
    coord_args = [COORD, "-m", model, "--port", "0", "-c", "4096"]
    for k, layers in enumerate(["0-1", "2-3"]):
        addr = "tcp://127.0.0.1:%d" % free_port()
        start([WORKER, "-m", model, "--layers", layers, "--listen", addr, "-t", "1"], "worker-%d.log" % k)
        coord_args += ["--worker", addr]
    coord = start(coord_args, "coord.log")
    port = wait_port("coord.log", coord)
    api = Client(port)
    prompt = " ".join("w%d" % i for i in range(850))  # about 3300 tokens: seconds of prefill
    for path, body in [("/v1/completions", {"prompt": prompt, "max_tokens": 8, "stream": True}),
                       ("/completion", {"prompt": prompt, "n_predict": 8}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8})]:
        predicted = metric(api, "llamacpp:tokens_predicted_total")
        cancelled = metric(api, "pico:requests_cancelled_total")
        sock = raw_post(port, path, body)
        in_prefill = wait_until(lambda: any(x["state"] == "prefill" for x in processing(api) or []))
        sock.close()
        what = "%s%s gone in prefill" % (path, " (stream)" if body.get("stream") else "")
        check(in_prefill, what + ": it was in prefill")
        check(wait_until(lambda: processing(api) == [], 60), what + ": its request stops")
        check(metric(api, "llamacpp:tokens_predicted_total") == predicted, what + ": the prefill never finished")
        check(metric(api, "pico:requests_cancelled_total") == cancelled + 1, what + ": counted as cancelled")
        check(stages_hold_only_kept(api) and metric(api, "pico:kept_sequences") == 0,
              what + ": both workers freed its sequence")
    s, b = api.json("POST", "/completion", {"prompt": "Hello", "n_predict": 4})
    check(s == 200 and b["tokens_predicted"] == 4, "the server serves after the cancelled prefills")


WHITESPACE = " \t\n\r\v\f"  # what pico strips around reasoning (C's isspace)


def chat_stream_parts(api, body):
    """(status, reasoning, content, events) of a streamed chat: the deltas concatenated."""
    s, ev = api.stream("/v1/chat/completions", dict(body, stream=True))
    chunks = [json.loads(e) for e in ev[:-1]] if ev and ev[-1] == "[DONE]" else []
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    return (s, "".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            chunks)


def reasoning_main():
    """Qwen3.5's template: the prompt opens <think>; the reply's reasoning is separated as
    llama-server separates it."""
    model = os.path.join(tmp, "R.gguf")
    template = os.path.join(SOURCE, "engine", "tokenizer", "testdata", "Qwen3.5-4B.jinja")
    subprocess.run([PICO, "mkmodel", "--arch", "qwen3", "--vocab", "qwen3", "--layers", "2", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ctx", "4096", "--seed", "4",
                    "--chat-template", template, "-o", model], check=True, stdout=subprocess.DEVNULL)
    coord = start([COORD, "-m", model, "--port", "0", "-c", str(CTX)], "coord.log")
    api = Client(wait_port("coord.log", coord))
    s, b = api.json("GET", "/props")
    check(s == 200 and b["chat_template"] == "qwen3.5" and
          b["default_generation_settings"]["params"]["reasoning_format"] == "deepseek",
          "/props: the qwen3.5 format, reasoning_format deepseek (%s)" % str(b)[:200])

    # The prompts, written from the template's text.
    messages = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}]
    history = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    thinking, not_thinking = history + "<think>\n", history + "<think>\n\n</think>\n\n"
    s, b = api.json("POST", "/apply-template", {"messages": messages})
    check(s == 200 and b["prompt"] == thinking, "/apply-template opens the think block (%r)" % b)
    s, b = api.json("POST", "/apply-template", {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}})
    check(s == 200 and b["prompt"] == not_thinking, "/apply-template with enable_thinking false closes it (%r)" % b)
    s, t = api.json("POST", "/tokenize", {"content": "</think>"})
    check(s == 200 and len(t["tokens"]) == 1, "</think> is one token (%s)" % t)
    close_id = t["tokens"][0]

    def raw(prompt, bias):
        """The greedy reply's raw text, through /completion (llama.cpp's: never split)."""
        s, b = api.json("POST", "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True,
                                                "logit_bias": [[close_id, bias]]})
        check(s == 200 and b["tokens_predicted"] == 8, "/completion on the chat prompt (%d)" % s)
        return b["content"]

    ban, force = {str(close_id): -100}, {str(close_id): 100}
    chat = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    s, ptok = api.json("POST", "/tokenize", {"content": thinking, "add_special": True})

    # </think> banned: the block never closes, the whole reply is reasoning.
    text = raw(thinking, False)
    check("</think>" not in text and text.strip(WHITESPACE), "the reply's raw text never closes the block (%r)" % text)
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=ban))
    m = b["choices"][0]["message"] if s == 200 else {}
    check(s == 200 and m.get("reasoning_content") == text.strip(WHITESPACE) and m.get("content") == "",
          "forced open, never closed: all reasoning, no content (%r)" % m)
    check(s == 200 and b["usage"]["prompt_tokens"] == len(ptok["tokens"]),
          "the chat prompt is the rendered template (%d tokens)" % len(ptok["tokens"]))
    s, reasoning, content, chunks = chat_stream_parts(api, dict(chat, logit_bias=ban))
    check(s == 200 and reasoning == text.strip(WHITESPACE) and content == "" and
          chunks[0]["choices"][0]["delta"].get("role") == "assistant",
          "streamed: the same reasoning in delta.reasoning_content, no content (%r, %r)" % (reasoning, content))

    # reasoning_format none: the raw text is the content.
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=ban, reasoning_format="none"))
    m = b["choices"][0]["message"] if s == 200 else {}
    check(s == 200 and m.get("content") == text and "reasoning_content" not in m,
          "reasoning_format none: the raw text in content (%r)" % m)
    s, reasoning, content, _ = chat_stream_parts(api, dict(chat, logit_bias=ban, reasoning_format="none"))
    check(s == 200 and content == text and reasoning == "", "reasoning_format none, streamed (%r)" % content)
    # deepseek-legacy: separated in a whole reply, inline between the tags when streamed.
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=ban, reasoning_format="deepseek-legacy"))
    check(s == 200 and b["choices"][0]["message"].get("reasoning_content") == text.strip(WHITESPACE),
          "deepseek-legacy: reasoning_content in a whole reply")
    s, reasoning, content, _ = chat_stream_parts(api, dict(chat, logit_bias=ban, reasoning_format="deepseek-legacy"))
    check(s == 200 and content == "<think>" + text.strip(WHITESPACE) + "</think>" and reasoning == "",
          "deepseek-legacy streamed: inline between the tags (%r)" % content)

    # </think> forced: every token closes; the first one ends an empty block, the rest is content.
    text = raw(thinking, 100)
    check(text == "</think>" * 8, "forced </think>: the raw reply (%r)" % text)
    after = text[len("</think>"):].lstrip(WHITESPACE)
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=force))
    m = b["choices"][0]["message"] if s == 200 else {}
    check(s == 200 and m.get("content") == after and "reasoning_content" not in m,
          "an empty block closed: the rest is content, no reasoning_content (%r)" % m)
    s, reasoning, content, _ = chat_stream_parts(api, dict(chat, logit_bias=force))
    check(s == 200 and content == after and reasoning == "", "streamed: the same content (%r)" % content)

    # enable_thinking false: the prompt closed the block; the reply is content as it comes.
    text = raw(not_thinking, 100)
    s, b = api.json("POST", "/v1/chat/completions",
                    dict(chat, logit_bias=force, chat_template_kwargs={"enable_thinking": False}))
    m = b["choices"][0]["message"] if s == 200 else {}
    check(s == 200 and m.get("content") == text and "reasoning_content" not in m,
          "enable_thinking false: the reply is content, tags and all (%r)" % m)
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=force, reasoning_effort="none"))
    check(s == 200 and b["choices"][0]["message"].get("content") == text, "reasoning_effort none: the same")

    # /v1/completions keeps the raw text too.
    s, b = api.json("POST", "/v1/completions", {"prompt": thinking, "max_tokens": 8, "temperature": 0,
                                                "ignore_eos": True, "logit_bias": force, "reasoning_format": "deepseek"})
    check(s == 200 and b["choices"][0]["text"] == "</think>" * 8, "/v1/completions: the raw text")

    # Bad values: 400 naming the field.
    for body, named in [(dict(chat, reasoning_format="thinky"), "reasoning_format"),
                        (dict(chat, chat_template_kwargs={"enable_thinking": "false"}), "chat_template_kwargs.enable_thinking"),
                        (dict(chat, chat_template_kwargs={"add_vision_id": True}), "chat_template_kwargs.add_vision_id"),
                        (dict(chat, chat_template_kwargs=[]), "chat_template_kwargs"),
                        (dict(chat, reasoning_effort="high"), "reasoning_effort"),
                        (dict(chat, messages=[{"role": "assistant", "content": "A"}]), "messages")]:
        s, b = api.json("POST", "/v1/chat/completions", body)
        check(s == 400 and b["error"].get("param") == named, "400 naming %s (%d %s)" % (named, s, str(b)[:160]))
    s, b = api.json("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                                                "chat_template_kwargs": {"enable_thinking": 1}})
    check(s == 400, "/apply-template: a bad enable_thinking is 400 (%d)" % s)

    # --reasoning-format none: the server's default; a request may still ask for deepseek.
    coord.terminate()
    coord.wait(10)
    coord = start([COORD, "-m", model, "--port", "0", "-c", str(CTX), "--reasoning-format", "none"], "coord-none.log")
    api = Client(wait_port("coord-none.log", coord))
    text = raw(thinking, False)
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=ban))
    m = b["choices"][0]["message"] if s == 200 else {}
    check(s == 200 and m.get("content") == text and "reasoning_content" not in m,
          "--reasoning-format none: the raw text in content (%r)" % m)
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logit_bias=ban, reasoning_format="deepseek"))
    check(s == 200 and b["choices"][0]["message"].get("reasoning_content") == text.strip(WHITESPACE),
          "--reasoning-format none, a request's deepseek separates")
    r = subprocess.run([COORD, "-m", model, "--port", "0", "--reasoning-format", "bogus"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode != 0 and "reasoning-format" in r.stderr + r.stdout,
          "--reasoning-format bogus is refused (%d: %s)" % (r.returncode, (r.stderr + r.stdout)[-200:]))


def hybrid_main():
    """A hybrid model (qwen35: Gated DeltaNet and gated attention layers) on 2 workers, the
    split inside the linear layers: its recurrent state cannot be cut back, so a prompt
    sharing a prefix with a kept sequence restarts from the newest checkpoint at or
    below the common prefix, and its reply equals a fresh one; /slots and /metrics show
    the checkpoints."""
    model = os.path.join(tmp, "hybrid.gguf")
    subprocess.run([PICO, "mkmodel", "--arch", "qwen35", "--vocab", "qwen3", "--layers", "4", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ssm-state", "64", "--ssm-groups",
                    "2", "--ssm-value-heads", "4", "--full-attention-interval", "4", "--ctx", "4096", "--seed", "8",
                    "-o", model], check=True, stdout=subprocess.DEVNULL)
    coord_args = [COORD, "-m", model, "--port", "0", "-c", str(CTX), "--checkpoint-every", "32",
                  "--checkpoint-every-gen", "8", "--checkpoint-max", "3"]
    for k, layers in enumerate(["0-1", "2-3"]):
        addr = "tcp://127.0.0.1:%d" % free_port()
        start([WORKER, "-m", model, "--layers", layers, "--listen", addr, "-t", "1"], "worker-%d.log" % k)
        coord_args += ["--worker", addr]
    coord = start(coord_args, "coord.log")
    api = Client(wait_port("coord.log", coord))
    shared = " ".join("item%d" % i for i in range(60))
    first, second = shared + " and the first ending", shared + " but a second, other ending"
    ta, tb = tokens_of(api, first), tokens_of(api, second)
    common = common_prefix(ta, tb)
    s, a = api.json("POST", "/completion", {"prompt": first, "n_predict": 20, "temperature": 0})
    check(s == 200 and a["tokens_predicted"] == 20, "hybrid: /completion")
    # The reply goes out as its last token is sampled; the sequence is kept, and the stages
    # report it, once its last step is back: /slots and /metrics settle a moment later.
    check(stages_hold_only_kept(api), "hybrid: the engine settles with the sequence kept")
    s, sl = api.json("GET", "/slots")
    kept = [x for x in sl if not x["is_processing"]]
    cps = kept[0]["checkpoints"] if kept and "checkpoints" in kept[0] else {}
    positions = cps.get("positions", [])
    # Marked after positions 32, 64, ..., the prompt's end and every 8 generated tokens,
    # 3 kept, the newest always among them.
    check(len(positions) == 3 and cps.get("count") == 3 and positions[-1] == len(ta) + 16 and
          all(p % 32 == 0 or p == len(ta) or (p - len(ta)) % 8 == 0 for p in positions) and cps.get("bytes", 0) > 0,
          "hybrid: /slots shows the kept sequence's checkpoints (%r, prompt %d)" % (cps, len(ta)))
    check(metric(api, "pico:checkpoints") == 3 and metric(api, "pico:checkpoint_bytes") == cps.get("bytes"),
          "hybrid: /metrics counts the checkpoints")
    # Each worker's own memory report: its recurrent state (checkpoints included) within
    # all its sequence state, and the checkpoints it holds adding up to the coordinator's count.
    _, m = api.request("GET", "/metrics")
    per_stage = lambda name: [float(v) for v in re.findall(r'^%s\{stage="\d+"\} (\S+)$' % re.escape(name), m, re.M)]
    state, recurrent, held = (per_stage("pico:stage_kv_bytes"), per_stage("pico:stage_recurrent_bytes"),
                              per_stage("pico:stage_checkpoint_bytes"))
    # (Stage 0 holds layers 0-1, both linear: no KV; stage 1 the attention layer 3's KV too.)
    check(len(state) == 2 and all(s >= r > c > 0 for s, r, c in zip(state, recurrent, held)) and
          state[0] == recurrent[0] and state[1] > recurrent[1] and sum(held) == cps.get("bytes"),
          "hybrid: each worker reports its KV, recurrent state and checkpoints (%r %r %r)" % (state, recurrent, held))
    want = max([p for p in positions if p <= common] or [0])
    s, b = api.json("POST", "/completion", {"prompt": second, "n_predict": 12, "temperature": 0})
    check(s == 200 and want > 0 and b["timings"]["cache_n"] == want and b["timings"]["prompt_n"] == len(tb) - want,
          "hybrid: the reuse restarts at the newest checkpoint within the common prefix (cache_n %d, checkpoint %d, "
          "common prefix %d)" % (b["timings"]["cache_n"], want, common))
    s, fresh = api.json("POST", "/completion", {"prompt": second, "n_predict": 12, "temperature": 0,
                                                "cache_prompt": False})
    check(fresh["timings"]["cache_n"] == 0 and b["content"] == fresh["content"] and b["tokens_predicted"] == 12,
          "hybrid: the reused reply equals the fresh one (%r vs %r)" % (b["content"], fresh["content"]))
    # A chat continued: its next turn's prompt extends the first (prompt + reply), so the
    # reuse goes back to a checkpoint of the reply.
    chat = {"messages": [{"role": "user", "content": shared}], "max_tokens": 16, "temperature": 0}
    s, c1 = api.json("POST", "/v1/chat/completions", chat)
    turn2 = dict(chat, messages=chat["messages"] + [c1["choices"][0]["message"], {"role": "user", "content": "more"}])
    s, c2 = api.json("POST", "/v1/chat/completions", turn2)
    s, c3 = api.json("POST", "/v1/chat/completions", dict(turn2, cache_prompt=False))
    check(c2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and
          c3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and
          c2["choices"][0]["message"]["content"] == c3["choices"][0]["message"]["content"],
          "hybrid chat: the second turn reuses %d tokens, same reply as fresh" %
          c2["usage"]["prompt_tokens_details"]["cached_tokens"])


def main():
    if MODE == "hybrid":
        hybrid_main()
        return
    if MODE == "prefill":
        prefill_main()
        return
    if MODE == "reasoning":
        reasoning_main()
        return
    if MODE == "limits":
        import limits_test
        limits_test.run(sys.modules[__name__])
        return
    model = os.path.join(tmp, "M.gguf")
    subprocess.run([PICO, "mkmodel", "--arch", "qwen3", "--vocab", "qwen3", "--layers", "2", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ctx", "4096", "--seed", "4",
                    "-o", model], check=True, stdout=subprocess.DEVNULL)
    # Embeddings pool the last token's hidden state: what node-llama-cpp's embedding
    # context returns for a model without a pooling type (embedding_tests).
    coord_args = [COORD, "-m", model, "--port", "0", "-c", str(CTX), "--http-threads", "4", "--pooling", "last"]
    workers = []
    # Slot files: each worker's own directory (the in-process stage's is pico-coord's).
    slot_dirs = [os.path.join(tmp, "slots-%d" % k) for k in range(2)]
    for d in slot_dirs:
        os.makedirs(d)
    if MODE in ("cluster", "openai", "webui"):  # the openai client and the browser against a 2-worker cluster
        for k, layers in enumerate(["0-0", "1-1"]):
            addr = "tcp://127.0.0.1:%d" % free_port()
            args = [WORKER, "-m", model, "--layers", layers, "--listen", addr, "-t", "1",
                    "--slot-save-path", slot_dirs[k]]
            workers.append((start(args, "worker-%d.log" % k), args))
            coord_args += ["--worker", addr]
        coord_args += ["--parallel", "8"]  # 32 concurrent streams: 24 wait in the queue
    elif MODE == "local":
        coord_args += ["--parallel", "4"]  # few slots: the queued-cancel test fills them all
        coord_args += ["--slot-save-path", slot_dirs[0]]
        slot_dirs = slot_dirs[:1]
    if MODE == "auth":
        coord_args += ["--api-key", KEY]
    coord = start(coord_args, "coord.log")
    port = wait_port("coord.log", coord)
    print("pico-coord on port", port)

    if MODE == "openai":
        ref = subprocess.run([PICO, "run", "-m", model, "-p", PROMPT, "-n", str(N), "--temp", "0"], check=True,
                             capture_output=True, text=True).stdout
        with open(os.path.join(tmp, "ref.txt"), "w") as f:
            f.write(ref[:-1] if ref.endswith("\n") else ref)
        r = subprocess.run(["node", os.path.join(HERE, "openai_client_test.mjs"), str(port), os.path.join(tmp, "ref.txt")])
        check(r.returncode == 0, "the openai client test")
        return

    if MODE == "webui":
        webui_tests(port)
        return

    if MODE == "auth":
        anon, good, bad = Client(port), Client(port, KEY), Client(port, "wrong")
        s, b = anon.json("GET", "/v1/models")
        check(s == 401 and b["error"]["code"] == "invalid_api_key", "no key: 401 (%d)" % s)
        s, b = bad.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        check(s == 401, "wrong key: 401 (%d)" % s)
        s, b = good.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        check(s == 200 and b["usage"]["completion_tokens"] == 2, "right key: 200 (%d)" % s)
        s, _ = anon.json("GET", "/health")
        check(s == 200, "/health needs no key (%d)" % s)
        msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        s, b = anon.json("POST", "/v1/messages", msg, headers={"x-api-key": KEY})
        check(s == 200 and b["usage"]["output_tokens"] == 2, "Anthropic's x-api-key: 200 (%d)" % s)
        s, b = anon.json("POST", "/v1/messages", msg, headers={"x-api-key": "wrong"})
        check(s == 401, "a wrong x-api-key: 401 (%d)" % s)
        return

    api = Client(port)
    # Health, models, props.
    s, b = api.json("GET", "/health")
    check(s == 200 and b["status"] == "ok", "/health")
    s, b = api.json("GET", "/v1/models")
    check(s == 200 and b["object"] == "list" and b["data"][0]["id"] == "M", "/v1/models lists M")
    # llama-server's system_fingerprint and timings on chat replies, streamed or not.
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    s, b = api.json("POST", "/v1/chat/completions", hi)
    check(s == 200 and b["system_fingerprint"].startswith("pico-") and
          b["timings"]["predicted_n"] == b["usage"]["completion_tokens"] and
          b["timings"]["prompt_n"] + b["timings"]["cache_n"] == b["usage"]["prompt_tokens"],
          "chat: system_fingerprint and timings")
    s, ev = api.stream("/v1/chat/completions", dict(hi, stream=True))
    chunks = [json.loads(e) for e in ev if e != "[DONE]"]
    ends = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    check(s == 200 and chunks and all(c["system_fingerprint"].startswith("pico-") for c in chunks) and len(ends) == 1 and
          ends[0]["timings"]["predicted_n"] == b["usage"]["completion_tokens"], "chat stream: fingerprint, timings at the end")
    for path, name in (("/v1/models/M", "M"), ("/v1/models/gpt-4o", "gpt-4o"), ("/models/a%2Fb", "a/b")):
        s, b = api.json("GET", path)
        check(s == 200 and b["object"] == "model" and b["id"] == name, "%s is served (any name)" % path)
    s, b = api.json("GET", "/props")
    check(s == 200 and b["default_generation_settings"]["n_ctx"] == CTX and b["chat_template"] == "qwen3" and
          b["total_slots"] == (8 if MODE == "cluster" else 4), "/props")
    params = b["default_generation_settings"]["params"]
    check(abs(params["temperature"] - 0.8) < 1e-6 and params["top_k"] == 40 and params["n_predict"] == -1 and
          "n_ctx" not in params and isinstance(params["samplers"], list), "/props: the default params (%s)" % params)
    s, refused = api.json("POST", "/props", {"n_ctx": 1})
    check(s == 501 and refused["error"]["type"] == "not_supported_error", "POST /props: not supported, as llama-server")
    slots_total = b["total_slots"]

    # Greedy text equals `pico run`.
    ref = subprocess.run([PICO, "run", "-m", model, "-p", PROMPT, "-n", str(N), "--temp", "0"], check=True,
                         capture_output=True, text=True).stdout
    ref = ref[:-1] if ref.endswith("\n") else ref
    greedy = {"model": "M", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
    s, b = api.json("POST", "/v1/completions", greedy)
    check(s == 200 and b["object"] == "text_completion", "/v1/completions 200")
    text = b["choices"][0]["text"]
    check(text == ref, "greedy /v1/completions equals pico run (%r vs %r)" % (text, ref))
    check(b["usage"]["completion_tokens"] == N and b["choices"][0]["finish_reason"] == "length", "usage and length")

    s, ev = api.stream("/v1/completions", dict(greedy, stream=True, stream_options={"include_usage": True}))
    check(s == 200 and ev and ev[-1] == "[DONE]", "streamed completion ends with [DONE]")
    chunks = [json.loads(e) for e in ev[:-1]]
    check("".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ref, "streamed text equals pico run")
    check(chunks[-1]["usage"]["completion_tokens"] == N and chunks[-2]["choices"][0]["finish_reason"] == "length",
          "stream usage chunk and finish_reason")

    # llama.cpp /completion with text and with token ids.
    # /completions (no v1) is llama-server's native endpoint too, not the OpenAI one.
    s, b = api.json("POST", "/completions", {"prompt": PROMPT, "n_predict": N, "temperature": 0})
    check(s == 200 and b.get("content") == ref and "choices" not in b, "/completions: llama-server's native shape")
    s, b = api.json("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0})
    check(s == 200 and b["content"] == ref and b["timings"]["predicted_n"] == N and b["stop_type"] == "limit",
          "/completion text, timings")
    word = ref[len(ref) // 2:len(ref) // 2 + 3]  # a stop string the greedy text holds
    s, b = api.json("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                            "stop": ["\u0001never", word]})
    check(s == 200 and b["content"] == ref[:ref.find(word)] and b["stop_type"] == "word" and b["stopping_word"] == word,
          "/completion: stop_type word, stopping_word %r (%r)" % (word, b.get("stopping_word")))
    s, t = api.json("POST", "/tokenize", {"content": PROMPT, "add_special": True})
    check(s == 200 and len(t["tokens"]) > 5, "/tokenize")
    s, b = api.json("POST", "/completion", {"prompt": t["tokens"], "n_predict": N, "temperature": 0})
    check(s == 200 and b["content"] == ref, "/completion with token ids")
    s, d = api.json("POST", "/detokenize", {"tokens": t["tokens"]})
    check(s == 200 and d["content"].endswith(PROMPT), "/detokenize round trip (%r)" % d)
    s, ev = api.stream("/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0, "stream": True})
    parts = [json.loads(e) for e in ev]
    check(s == 200 and parts[-1]["stop"] and "".join(p["content"] for p in parts) == ref, "/completion stream")

    # Stop strings: cut before the stop string, never emitted, across token boundaries.
    if len(ref) > 12:
        stop = ref[5:9]
        s, b = api.json("POST", "/v1/completions", dict(greedy, stop=[stop, "\u00ff\u00ff"]))
        got = b["choices"][0]["text"]
        check(got == ref[:ref.find(stop)] and b["choices"][0]["finish_reason"] == "stop",
              "stop string %r: %r" % (stop, got))
        s, ev = api.stream("/v1/completions", dict(greedy, stop=stop, stream=True))
        got = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1])
        check(got == ref[:ref.find(stop)], "streamed stop string: %r" % got)

    # Chat, plain and streamed; logprobs.
    chat = {"model": "M", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 8, "temperature": 0, "seed": 1, "top_k": 5, "min_p": 0.01, "presence_penalty": 0.1,
            "frequency_penalty": 0.1, "top_p": 0.9}
    s, b = api.json("POST", "/v1/chat/completions", chat)
    check(s == 200 and b["object"] == "chat.completion" and b["choices"][0]["message"]["role"] == "assistant",
          "/v1/chat/completions")
    ctext = b["choices"][0]["message"]["content"]
    s, ev = api.stream("/v1/chat/completions", dict(chat, stream=True))
    check(ev[-1] == "[DONE]", "streamed chat ends with [DONE]")
    chunks = [json.loads(e) for e in ev[:-1]]
    check(chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant",
          "first chat chunk carries the role")
    check("".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ctext, "streamed chat text")
    s, b = api.json("POST", "/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=3))
    lp = b["choices"][0]["logprobs"]["content"]
    check(len(lp) >= 1 and len(lp[0]["top_logprobs"]) == 3 and lp[0]["logprob"] <= 0, "chat logprobs")
    s, b = api.json("POST", "/v1/completions", dict(greedy, logprobs=2))
    check(len(b["choices"][0]["logprobs"]["tokens"]) == N, "completion logprobs")

    # 32 concurrent streams give the text of one alone (greedy, batch invariance).
    results = [None] * 32

    def one(i):
        _, ev = api.stream("/v1/completions", dict(greedy, stream=True))
        results[i] = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1]) if ev and ev[-1] == "[DONE]" else None

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(r == ref for r in results), "32 concurrent streams equal the single one")

    # A client that disconnects mid-stream: its sequence is cancelled and freed.
    def predicted():
        _, m = api.request("GET", "/metrics")
        return int(float(re.search(r"^llamacpp:tokens_predicted_total (\S+)", m, re.M).group(1)))

    before = predicted()
    sock = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": PROMPT, "max_tokens": CTX, "temperature": 0, "stream": True, "ignore_eos": True})
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(4096)
    sock.close()
    freed = wait_until(lambda: processing(api) == [], 5)
    check(freed, "the disconnected client's sequence is freed (no slot processing)")
    delta = predicted() - before
    check(delta < CTX - 100, "generation stopped after the disconnect (%d tokens)" % delta)
    check(stages_hold_only_kept(api), "every stage holds only the kept sequences after the disconnect")
    _, m = api.request("GET", "/metrics")
    for name in ["pico:requests_total", "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "pico:tokens_in_flight 0", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 'pico:stage_tokens{stage="0"}', 'pico:stage_sequences{stage="%d"}' % (1 if MODE == "cluster" else 0),
                 "llamacpp:prompt_tokens_cached_total", "pico:kept_sequences", "pico:requests_cancelled_total",
                 'pico:stage_info{stage="0",layers="0-', 'backend="cpu"', 'pico:stage_device_memory_bytes{stage="0"} 0']:
        check(name in m, "/metrics has " + name)

    prefix_reuse_tests(api)
    progress_tests(api)
    n_choices_tests(api, ref, greedy)
    sampler_tests(api, ref, greedy)
    grammar_tests(api)
    tool_tests(api)
    anthropic_tests(api, port)
    embedding_tests(api, model)
    infill_tests(api)
    slot_file_tests(api, slot_dirs)
    cancel_tests(api, port, slots_total)

    # Malformed requests: status and an OpenAI-style error object, and the server lives on.
    msgs = [{"role": "user", "content": "hi"}]
    table = [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", b"[]", 400),
        ("POST", "/v1/chat/completions", {}, 400),
        ("POST", "/v1/chat/completions", {"messages": "hi"}, 400),
        ("POST", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": "ten"}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 0}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "temperature": "hot"}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "stop": 5}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "n": 0}, 400),
        ("POST", "/v1/completions", {"prompt": "hi", "n": 17}, 400),
        ("POST", "/v1/completions", {"prompt": "hi", "n": "two"}, 400),
        ("POST", "/completion", {"prompt": "hi", "cache_prompt": 1}, 400),
        ("POST", "/v1/completions", {"prompt": 5}, 400),
        ("POST", "/v1/completions", {"prompt": []}, 400),
        ("POST", "/v1/completions", {"max_tokens": 4}, 400),
        ("POST", "/v1/completions", {"prompt": [1] * (CTX + 10)}, 400),
        ("POST", "/v1/completions", {"prompt": [10**9]}, 400),
        ("POST", "/v1/completions", {"prompt": [2**40]}, 400),
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2**40, "logprobs": 99}, 400),
        ("POST", "/v1/completions", b"[" * 200000 + b"]" * 200000, 400),
        ("POST", "/v1/chat/completions", {"messages": [{"role": 5, "content": "hi"}]}, 400),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
        ("POST", "/completion", {"prompt": "hi", "stream": "yes"}, 400),
        ("POST", "/tokenize", {}, 400),
        ("POST", "/detokenize", {"tokens": [-1]}, 400),
        ("POST", "/detokenize", {"tokens": "abc"}, 400),
        ("GET", "/v1/nope", None, 404),
        ("GET", "/v1/chat/completions", None, 405),
        ("POST", "/v1/completions", b"x" * (9 << 20), 413),
    ]
    for method, path, body, want in table:
        raw = body if isinstance(body, bytes) else None
        try:
            s, b = api.json(method, path, None if raw is not None else body, raw=raw)
        except (ConnectionError, http.client.HTTPException) as e:
            s, b = -1, str(e)
        ok = s == want and isinstance(b, dict) and {"message", "type", "code"} <= set(b.get("error", {}))
        check(ok, "%s %s %s -> %d (got %d %s)" % (method, path, (raw or json.dumps(body).encode())[:40], want, s,
                                                str(b)[:120]))
    s, _ = api.json("GET", "/health")
    check(s == 200, "alive after the malformed requests")
    check(coord.poll() is None, "pico-coord still running")
    if workers:
        restarted_worker_tests(api, workers[1])


def restarted_worker_tests(api, worker):
    """A worker restarted while idle rejoins without the kept sequences' KV: the engine
    forgets them instead of continuing a sequence the worker no longer has."""
    body = {"prompt": PROMPT + " once more", "n_predict": 8, "temperature": 0}
    s, first = api.json("POST", "/completion", body)
    s, again = api.json("POST", "/completion", body)
    check(again["timings"]["cache_n"] > 0, "before the restart the prompt is reused")
    proc, args = worker
    proc.terminate()
    proc.wait(10)
    # /health answers 503 naming the lost stage, noticed while idle (no request needed).
    lost = [None]

    def health_lost():
        s, b = api.json("GET", "/health")
        lost[0] = (s, b)
        return s == 503
    check(wait_until(health_lost, 20) and "stage 1" in lost[0][1]["error"]["message"] and
          lost[0][1]["error"]["type"] == "unavailable_error", "/health: 503 naming the lost stage (%s)" % str(lost[0])[:160])
    start(args, "worker-restarted.log")
    check(wait_until(lambda: "listening" in open(os.path.join(tmp, "worker-restarted.log")).read(), 30),
          "the worker restarted")
    check(wait_until(lambda: api.json("GET", "/health")[0] == 200, 30), "/health: 200 once the worker rejoined")
    s, after = api.json("POST", "/completion", body)
    check(s == 200 and after["timings"]["cache_n"] == 0 and after["content"] == first["content"],
          "after the restart: nothing reused, the same reply (%d %s)" % (s, str(after)[:100]))
    s, later = api.json("POST", "/completion", body)
    check(s == 200 and later["timings"]["cache_n"] > 0 and later["content"] == first["content"],
          "then reused again")
    check(stages_hold_only_kept(api), "every stage holds only the kept sequences after the restart")


def webui_tests(port):
    """The web UI's files as served, and the pages in headless Chromium (webui_browser_test.mjs)."""
    api = Client(port)
    s, page = api.request("GET", "/")
    check(s == 200 and "<title>pico</title>" in page, "/ serves the page")
    for name in ("app.js", "markdown.js", "style.css"):
        s, body = api.request("GET", "/ui/" + name)
        check(s == 200 and len(body) > 100, "/ui/%s is served" % name)
    s, _ = api.request("GET", "/ui/nope.js")
    check(s == 404, "an unknown file: 404")
    out_dir = os.path.join(BUILD, "Testing", "webui")
    r = subprocess.run(["node", os.path.join(HERE, "webui_browser_test.mjs"), str(port), out_dir])
    check(r.returncode == 0, "the browser test (screenshots in %s)" % out_dir)
    # What the cluster page reads: per stage its compute / queue / transfer totals and its
    # worker's memory (asked when the engine is next idle, so a moment after the requests).
    def measured():
        s, c = api.json("GET", "/cluster")
        return s == 200 and all(st["batches"] > 0 and st["tokens"] >= st["batches"] and st["compute_seconds"] > 0 and
                                st["queue_seconds"] + st["transfer_seconds"] > 0 and st["memory"] and
                                st["memory"]["used_bytes"] > 0 and st["memory"]["free_bytes"] > 0 and
                                st["memory"]["kv_bytes"] >= 0 for st in c["stages"]) and c
    check(wait_until(lambda: bool(measured()), 10), "/cluster: each stage's timings and memory")
    view = measured()
    # Each worker's link to the coordinator as measured at start (the lanes' choice and the
    # placement count it).
    links = [w["link"] for st in view["stages"] for w in st["workers"]] if view else []
    check(links and all(link and link["latency_ms"] >= 0 and link["megabytes_per_second"] > 0 for link in links),
          "/cluster: each worker's measured link %s" % links)
    free = [metric(api, 'pico:stage_free_memory_bytes{stage="%d"}' % i) for i in range(len(view["stages"]) if view else 0)]
    check(view and len(free) == 2 and all(f > 0 for f in free), "/metrics: each stage's free memory %s" % free)


def progress_tests(api):
    """return_progress (llama-server's): while a long prompt is evaluated, streamed answers
    without text carry prompt_progress {total, cache, processed, time_ms}: first at the
    start, then after each step of the prompt, processed growing to the total."""
    prompt = " ".join("p%d" % i for i in range(250))  # more than one step of prompt tokens
    n_prompt = len(tokens_of(api, prompt))
    for path, body in (("/completion", {"prompt": prompt, "n_predict": 2, "cache_prompt": False}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}),
                       ("/v1/completions", {"prompt": prompt, "max_tokens": 2, "cache_prompt": False})):
        body = dict(body, stream=True, return_progress=True, temperature=0)
        s, ev = api.stream(path, body)
        events = [json.loads(e) for e in ev if e != "[DONE]"]
        progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        first_text = next((i for i, e in enumerate(events) if
                           e.get("content") or (e.get("choices") and (e["choices"][0].get("text") or
                                                                      e["choices"][0].get("delta", {}).get("content")))),
                          len(events))
        total = progress[-1]["total"] if progress else -1
        check(s == 200 and len(progress) >= 3 and all(p["total"] == total for p in progress) and
              total >= n_prompt - 1 and progress[0]["processed"] == progress[0]["cache"] and
              progress[-1]["processed"] == total and
              all(a["processed"] < b["processed"] and a["time_ms"] <= b["time_ms"] for a, b in zip(progress, progress[1:])) and
              all("prompt_progress" not in e for e in events[first_text:]),
              "%s return_progress: %s" % (path, [(p["processed"], p["total"]) for p in progress]))
        if path == "/v1/chat/completions" and progress:
            chunk = next(e for e in events if "prompt_progress" in e)
            check(chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"]["role"] == "assistant",
                  "a chat progress chunk is a chunk with the assistant's role")
    s, ev = api.stream("/completion", {"prompt": prompt, "n_predict": 2, "stream": True})
    check(s == 200 and not any("prompt_progress" in e for e in ev), "no prompt_progress unless asked")
    # A prompt whose prefix is reused: the first report counts it as processed already.
    s, ev = api.stream("/completion", {"prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True})
    progress = [json.loads(e)["prompt_progress"] for e in ev if "prompt_progress" in e]
    check(s == 200 and progress and progress[0]["cache"] > 0 and progress[0]["processed"] == progress[0]["cache"] and
          progress[-1]["processed"] == progress[-1]["total"], "return_progress after a reused prefix: %s" %
          [(p["cache"], p["processed"], p["total"]) for p in progress])


def tokens_of(api, text):
    _, t = api.json("POST", "/tokenize", {"content": text, "add_special": True})
    return t["tokens"]


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def prefix_reuse_tests(api):
    """A request sharing a long prefix with a kept sequence computes only the rest, and its
    greedy reply equals a fresh computation's (cache_prompt false)."""
    shared = " ".join("item%d" % i for i in range(120))
    first, second = shared + " and the first ending", shared + " but a second, other ending"
    s, a = api.json("POST", "/completion", {"prompt": first, "n_predict": N, "temperature": 0})
    check(s == 200, "/completion with a long prompt")
    ta, tb = tokens_of(api, first), tokens_of(api, second)
    common = common_prefix(ta, tb)
    cached_before = metric(api, "llamacpp:prompt_tokens_cached_total")
    computed_before = metric(api, "llamacpp:prompt_tokens_total")
    s, b = api.json("POST", "/completion", {"prompt": second, "n_predict": N, "temperature": 0})
    t = b["timings"]
    check(s == 200 and t["cache_n"] == common and t["prompt_n"] == len(tb) - common and
          b["tokens_evaluated"] == len(tb),
          "shared prefix: cache_n %d == %d, prompt_n %d == %d" % (t["cache_n"], common, t["prompt_n"], len(tb) - common))
    check(b["tokens_cached"] == len(tb) + b["tokens_predicted"] - 1, "tokens_cached: the positions held (%d)" %
          b["tokens_cached"])
    check(metric(api, "llamacpp:prompt_tokens_cached_total") - cached_before == common and
          metric(api, "llamacpp:prompt_tokens_total") - computed_before == len(tb) - common,
          "/metrics counts the reused and the computed prompt tokens")
    s, fresh = api.json("POST", "/completion", {"prompt": second, "n_predict": N, "temperature": 0,
                                                "cache_prompt": False})
    check(fresh["timings"]["cache_n"] == 0 and fresh["timings"]["prompt_n"] == len(tb), "cache_prompt false: no reuse")
    check(b["content"] == fresh["content"] and b["tokens_predicted"] == N,
          "a reply with a reused prefix equals the fresh one (%r vs %r)" % (b["content"], fresh["content"]))
    # The whole prompt kept: only its last token is computed (for its logits).
    s, again = api.json("POST", "/completion", {"prompt": second, "n_predict": N, "temperature": 0})
    check(again["timings"]["cache_n"] == len(tb) - 1 and again["timings"]["prompt_n"] == 1 and
          again["content"] == fresh["content"], "the same prompt again: %d cached, 1 computed, same reply" %
          again["timings"]["cache_n"])
    # A prompt sharing only a few tokens (under a tenth of it) starts afresh rather than cut
    # a kept sequence (the next check finds the kept one whole).
    unrelated = "item0 " + " ".join("other%d" % i for i in range(40))
    tu = tokens_of(api, unrelated)
    s, u = api.json("POST", "/completion", {"prompt": unrelated, "n_predict": 2})
    check(0 < common_prefix(tu, tb) and 10 * common_prefix(tu, tb) < len(tu) and u["timings"]["cache_n"] == 0,
          "a short common prefix (%d of %d tokens) is not reused" % (common_prefix(tu, tb), len(tu)))
    # OpenAI endpoints report it in usage.prompt_tokens_details.cached_tokens.
    s, c = api.json("POST", "/v1/completions", {"prompt": second, "max_tokens": N, "temperature": 0})
    check(s == 200 and c["usage"]["prompt_tokens_details"]["cached_tokens"] == len(tb) - 1 and
          c["choices"][0]["text"] == fresh["content"], "/v1/completions: cached_tokens %d, same text" %
          c["usage"]["prompt_tokens_details"]["cached_tokens"])
    chat = {"messages": [{"role": "system", "content": shared}, {"role": "user", "content": "Hello there"}],
            "max_tokens": 8, "temperature": 0}
    s, c1 = api.json("POST", "/v1/chat/completions", chat)
    chat["messages"][1]["content"] = "Something else"
    s, c2 = api.json("POST", "/v1/chat/completions", chat)
    s, c3 = api.json("POST", "/v1/chat/completions", dict(chat, cache_prompt=False))
    check(c2["usage"]["prompt_tokens_details"]["cached_tokens"] > 120 and
          c3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and
          c2["choices"][0]["message"]["content"] == c3["choices"][0]["message"]["content"],
          "chat: the shared system prompt is reused (%d tokens), same reply as fresh" %
          c2["usage"]["prompt_tokens_details"]["cached_tokens"])
    s, sl = api.json("GET", "/slots")
    idle = [x for x in sl if not x["is_processing"]]
    check(idle and all(x["state"] == "idle" and x["n_past"] > 0 for x in idle), "/slots lists the kept sequences")


def n_choices_tests(api, ref, greedy):
    """n > 1: one sequence per choice, each with its index, streamed and not."""
    s, b = api.json("POST", "/v1/completions", dict(greedy, n=3))
    ch = b["choices"]
    check(s == 200 and [c["index"] for c in ch] == [0, 1, 2] and all(c["text"] == ref for c in ch) and
          b["usage"]["completion_tokens"] == 3 * N, "n=3 greedy: three choices equal to pico run")
    sampled = dict(greedy, n=4, temperature=1.5, seed=7)
    s, b1 = api.json("POST", "/v1/completions", sampled)
    s, b2 = api.json("POST", "/v1/completions", sampled)
    texts = [c["text"] for c in b1["choices"]]
    check(texts == [c["text"] for c in b2["choices"]] and len(set(texts)) > 1,
          "n=4 sampled with a seed: reproducible, choices differ")
    s, ev = api.stream("/v1/completions", dict(sampled, stream=True, stream_options={"include_usage": True}))
    chunks = [json.loads(e) for e in ev[:-1]]
    got = ["", "", "", ""]
    finished = set()
    for c in chunks:
        for x in c["choices"]:
            got[x["index"]] += x["text"]
            if x["finish_reason"]:
                finished.add(x["index"])
    check(ev[-1] == "[DONE]" and got == texts and finished == {0, 1, 2, 3} and
          chunks[-1]["usage"]["completion_tokens"] == 4 * N, "n=4 streamed: same texts, every index finishes")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0, "n": 2}
    s, b = api.json("POST", "/v1/chat/completions", chat)
    check(s == 200 and len(b["choices"]) == 2 and b["choices"][0]["message"] == b["choices"][1]["message"],
          "chat n=2")
    s, ev = api.stream("/v1/chat/completions", dict(chat, stream=True))
    chunks = [json.loads(e) for e in ev[:-1]]
    roles = sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role"))
    text = ["", ""]
    for c in chunks:
        text[c["choices"][0]["index"]] += c["choices"][0]["delta"].get("content", "")
    check(roles == [0, 1] and text == [b["choices"][0]["message"]["content"]] * 2, "chat n=2 streamed")


def sampler_tests(api, ref, greedy):
    """llama.cpp's other samplers through the API (DRY too): each runs, seeded runs repeat, and
    XTC at temperature 0 moves the pick off the arg max (so the coordinator did not
    take the last stage's arg max for it)."""
    for extra in ({"mirostat": 1, "mirostat_tau": 4}, {"mirostat": 2, "mirostat_eta": 0.2},
                  {"xtc_probability": 0.5, "xtc_threshold": 0.05}, {"dynatemp_range": 0.5, "dynatemp_exponent": 2},
                  {"top_n_sigma": 1.0}, {"samplers": ["top_n_sigma", "xtc", "temperature"], "xtc_probability": 1},
                  {"dry_multiplier": 0.8, "dry_allowed_length": 1}, {"dry_multiplier": 2, "dry_sequence_breakers": ["a"]}):
        body = dict(greedy, temperature=1.0, seed=11, ignore_eos=True, **extra)
        s1, b1 = api.json("POST", "/v1/completions", body)
        s2, b2 = api.json("POST", "/v1/completions", body)
        check(s1 == 200 and s2 == 200 and b1["usage"]["completion_tokens"] == N and
              b1["choices"][0]["text"] == b2["choices"][0]["text"], "sampler %s: runs, seeded runs repeat" % extra)
    s, b = api.json("POST", "/v1/completions", dict(greedy, ignore_eos=True, xtc_probability=1, xtc_threshold=0))
    check(s == 200 and b["choices"][0]["text"] != ref, "XTC at temperature 0 excludes the greedy pick")
    # post_sampling_probs: the sampler chain's candidates renormalised. With top_k 2 at
    # most 2 are left, their probabilities sum to 1, and the pick is one of them with its
    # probability; greedy leaves one candidate of probability 1.
    body = {"prompt": PROMPT, "n_predict": 6, "n_probs": 3, "post_sampling_probs": True, "top_k": 2,
            "temperature": 1.0, "seed": 4, "ignore_eos": True}
    s, b = api.json("POST", "/completion", body)
    probs = b.get("completion_probabilities", []) if s == 200 else []
    ok = len(probs) == 6
    for p in probs:
        tops = p.get("top_probs", [])
        mine = [t["prob"] for t in tops if t["id"] == p["id"]]
        ok = ok and "logprob" not in p and 1 <= len(tops) <= 2 and abs(sum(t["prob"] for t in tops) - 1) < 1e-4 and \
            mine == [p["prob"]] and p["prob"] > 0
    check(ok, "post_sampling_probs with top_k 2: the chain's probabilities (%s)" % (probs[:2] if s == 200 else b))
    s, b = api.json("POST", "/completion", dict(body, temperature=0))
    probs = b.get("completion_probabilities", []) if s == 200 else []
    check(len(probs) == 6 and all(p["prob"] == 1 and [t["id"] for t in p["top_probs"]] == [p["id"]] for p in probs),
          "post_sampling_probs greedy: one candidate of probability 1")


# A schema whose documents are bounded (strings, integers and arrays have limits), so a
# model writing gibberish still closes them within max_tokens.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", 7]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2},
        "ok": {"type": "boolean"},
        "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
    "$defs": {
        "tag": {"type": "string", "enum": ["a", "b\"c"]},
        "pet": {"type": "object", "properties": {"legs": {"type": "integer", "minimum": 0, "maximum": 8}},
                "required": ["legs"], "additionalProperties": False},
    },
}


def person_errors(doc):
    """What makes `doc` invalid against PERSON_SCHEMA (written by hand: no validator
    package is needed); an empty list when it validates."""
    errors = []
    if not isinstance(doc, dict):
        return ["not an object"]
    for key in ("name", "age", "role"):
        if key not in doc:
            errors.append("no " + key)
    errors += ["unknown key " + k for k in doc if k not in PERSON_SCHEMA["properties"]]
    if "name" in doc and not (isinstance(doc["name"], str) and len(doc["name"]) <= 6):
        errors.append("name")
    if "age" in doc and not (type(doc["age"]) is int and 0 <= doc["age"] <= 150):
        errors.append("age")
    if "role" in doc and not (doc["role"] in ("admin", "user") or (type(doc["role"]) is int and doc["role"] == 7)):
        errors.append("role")
    if "tags" in doc and not (isinstance(doc["tags"], list) and len(doc["tags"]) <= 2 and
                              all(t in ("a", 'b"c') for t in doc["tags"])):
        errors.append("tags")
    if "ok" in doc and type(doc["ok"]) is not bool:
        errors.append("ok")
    if "pet" in doc and doc["pet"] is not None:
        pet = doc["pet"]
        if not (isinstance(pet, dict) and set(pet) == {"legs"} and type(pet["legs"]) is int and 0 <= pet["legs"] <= 8):
            errors.append("pet")
    return errors


def grammar_tests(api):
    """Grammar-constrained sampling: GBNF on /completion and chat, JSON Schema through
    json_schema and response_format; what comes back always parses and validates (the
    model writes gibberish: only the constraint can make it so)."""
    yes_no = 'root ::= ("yes" | "no") "." # a comment\n'
    for seed in range(4):
        s, b = api.json("POST", "/completion", {"prompt": "Is it?", "n_predict": 16, "grammar": yes_no,
                                                "temperature": 1.5, "seed": seed})
        check(s == 200 and b["content"] in ("yes.", "no.") and b["stop_type"] == "eos",
              "grammar yes/no (seed %d): %r" % (seed, b.get("content") if s == 200 else b))
    s, b = api.json("POST", "/completion", {"prompt": "Is it?", "n_predict": 8, "grammar": 'root ::= "a" | "b'})
    check(s == 400 and b["error"]["param"] == "grammar" and "line 1, column" in b["error"]["message"],
          "an invalid grammar is 400 naming the position (%s)" % b)
    s, b = api.json("POST", "/completion", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {}})
    check(s == 400, "grammar and json_schema together: 400 (%d)" % s)
    docs = []
    for seed in range(6):
        body = {"messages": [{"role": "user", "content": "Who?"}], "max_tokens": 400, "temperature": 1.0,
                "seed": seed, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "person", "strict": True,
                                                                  "schema": PERSON_SCHEMA}}}
        s, b = api.json("POST", "/v1/chat/completions", body)
        content = b["choices"][0]["message"]["content"] if s == 200 else None
        try:
            doc = json.loads(content)
        except (TypeError, ValueError):
            doc = None
        check(s == 200 and b["choices"][0]["finish_reason"] == "stop" and doc is not None and not person_errors(doc),
              "response_format json_schema (seed %d): valid (%r, %s)" % (seed, content, doc and person_errors(doc)))
        docs.append(content)
    check(len(set(docs)) > 1, "the constrained documents differ by seed")
    s, b = api.json("POST", "/completion", {"prompt": "{", "n_predict": 400, "json_schema": PERSON_SCHEMA, "seed": 3,
                                            "temperature": 1.0})
    check(s == 200 and not person_errors(json.loads(b["content"])), "json_schema on /completion: valid")
    s, ev = api.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "Who?"}], "max_tokens": 400,
                                                "seed": 5, "temperature": 1.0, "stream": True, "response_format": {
                                                    "type": "json_schema", "json_schema": {"schema": PERSON_SCHEMA}}})
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in ev
                   if e != "[DONE]" and json.loads(e)["choices"])
    check(s == 200 and docs[5] == text, "streamed: the same document as unstreamed (%r)" % text)
    s, b = api.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                                                     "response_format": {"type": "json_object"}})
    check(s == 200 and b["choices"][0]["message"]["content"].startswith("{"), "json_object: an object starts")
    s, b = api.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                     "response_format": {"type": "json_schema", "json_schema": {
                                                         "schema": {"$ref": "https://example.com/s.json"}}}})
    check(s == 400 and "json_schema" in b["error"]["param"], "a remote $ref is 400 (%s)" % b)


ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["a", "b"],
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def tool_tests(api):
    """Tool calls under tool_choice auto: the model's text is free, but once it opens a
    call (<tool_call>, forced here by logit_bias: the synthetic model would not) the
    call follows the tools' grammar (a lazy grammar) and comes back as tool_calls; the
    same streamed. tool_choice none leaves the tools out. (The openai client's tests
    cover required, named, parallel and a runTools loop.)"""
    s, t = api.json("POST", "/tokenize", {"content": "<tool_call>", "parse_special": True})
    check(s == 200 and len(t["tokens"]) == 1, "<tool_call> is one token of the qwen3 vocabulary (%s)" % t)
    opening = t["tokens"][0]
    body = {"messages": [{"role": "user", "content": "Add 2 and 3"}], "tools": [ADD_TOOL], "max_tokens": 200,
            "temperature": 0, "logit_bias": {str(opening): 100}}
    s, b = api.json("POST", "/v1/chat/completions", body)
    calls = b["choices"][0]["message"].get("tool_calls") if s == 200 else None
    args = None
    try:
        args = json.loads(calls[0]["function"]["arguments"])
    except (TypeError, ValueError, IndexError, KeyError):
        pass
    check(s == 200 and len(calls or []) == 1 and calls[0]["function"]["name"] == "add" and
          isinstance(args, dict) and sorted(args) == ["a", "b"] and all(isinstance(v, int) for v in args.values()) and
          b["choices"][0]["finish_reason"] == "tool_calls" and b["choices"][0]["message"]["content"] is None,
          "tool_choice auto: an opened call follows the grammar (%s)" % (b["choices"][0] if s == 200 else b))
    s, _, content, chunks = chat_stream_parts(api, body)
    streamed = {}
    for c in chunks:
        for d in (c["choices"][0]["delta"].get("tool_calls") or []) if c.get("choices") else []:
            entry = streamed.setdefault(d["index"], {"name": "", "arguments": "", "id": None})
            entry["id"] = d.get("id", entry["id"])
            entry["name"] += d.get("function", {}).get("name", "")
            entry["arguments"] += d.get("function", {}).get("arguments", "")
            entry["pieces"] = entry.get("pieces", 0) + (1 if d.get("function", {}).get("arguments") else 0)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    check(len(streamed) == 1 and streamed[0].get("pieces", 0) > 1,
          "streamed: the call's arguments come in pieces as they are generated (%d)" % streamed.get(0, {}).get("pieces", 0))
    check(s == 200 and content == "" and len(streamed) == 1 and streamed[0]["name"] == "add" and streamed[0]["id"] and
          calls and streamed[0]["arguments"] == calls[0]["function"]["arguments"] and finish == ["tool_calls"],
          "streamed: the same call in delta.tool_calls (%s, %s)" % (streamed, finish))
    # none: the tools stay out of the prompt, nothing is parsed.
    s, with_tools = api.json("POST", "/apply-template", {"messages": body["messages"], "tools": [ADD_TOOL]})
    s2, without = api.json("POST", "/apply-template", {"messages": body["messages"], "tools": [ADD_TOOL],
                                                      "tool_choice": "none"})
    check(s == 200 and s2 == 200 and "<tools>" in with_tools["prompt"] and "<tools>" not in without["prompt"],
          "/apply-template renders the tools, not with tool_choice none")
    s, b = api.json("POST", "/v1/chat/completions", dict(body, tool_choice="none", max_tokens=4))
    check(s == 200 and "tool_calls" not in b["choices"][0]["message"], "tool_choice none: no calls")
    # A history of calls and results is taken (and a result without its call id is not).
    history = [{"role": "user", "content": "Add 2 and 3"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    s, b = api.json("POST", "/v1/chat/completions", {"messages": history, "tools": [ADD_TOOL], "max_tokens": 4})
    check(s == 200, "a tool loop's history is taken (%s)" % (b if s != 200 else ""))
    s, b = api.json("POST", "/v1/chat/completions", {"messages": history[:2] + [{"role": "tool", "content": "5"}],
                                                     "max_tokens": 4})
    check(s == 400 and b["error"]["param"] == "messages[2].tool_call_id", "a result without tool_call_id: 400 (%s)" % b)
    s, b = api.json("POST", "/v1/chat/completions", dict(body, tool_choice={"type": "function", "function": {"name": "mul"}}))
    check(s == 400 and b["error"]["param"] == "tool_choice", "a tool_choice naming no tool: 400 (%s)" % b)


def anthropic_stream(port, body, headers=None):
    """(status, [(event name, data)]) of a streamed /v1/messages."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/messages", body=json.dumps(body).encode(),
              headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    r = c.getresponse()
    events, name = [], None
    for line in r.read().decode("utf-8", "replace").split("\n"):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
            name = None
    c.close()
    return r.status, events


def anthropic_tests(api, port):
    """Anthropic's Messages API: the reply of the chat endpoint in Anthropic's shape, its
    stream's events in Anthropic's order, stop reasons, token counting, refusals."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Tell me"}]}]
    s, chat = api.json("POST", "/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief"},
                                                                   {"role": "user", "content": "Tell me"}],
                                                      "max_tokens": 12, "temperature": 0})
    text = chat["choices"][0]["message"]["content"]
    body = {"model": "claude-sonnet-4-5", "system": "Be brief", "messages": msgs, "max_tokens": 12, "temperature": 0}
    s, b = api.json("POST", "/v1/messages", body)
    check(s == 200 and b["type"] == "message" and b["role"] == "assistant" and b["id"].startswith("msg_") and
          b["content"][-1] == {"type": "text", "text": text} and b["stop_reason"] == "max_tokens" and
          b["stop_sequence"] is None and b["usage"]["output_tokens"] == 12 and
          b["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"], "/v1/messages: the chat reply (%s)" % b)
    s, ev = anthropic_stream(port, dict(body, stream=True))
    names = [n for n, _ in ev]
    streamed = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta" and d["delta"]["type"] == "text_delta")
    check(s == 200 and names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"] and
          all(n == d["type"] for n, d in ev) and streamed == text and
          ev[-2][1]["delta"]["stop_reason"] == "max_tokens" and ev[-2][1]["usage"]["output_tokens"] == 12 and
          names.count("content_block_start") == names.count("content_block_stop") >= 1,
          "/v1/messages stream: events in order, the same text (%s)" % names[:4])
    if len(text) > 4:
        word = text[2:4]
        s, b = api.json("POST", "/v1/messages", dict(body, stop_sequences=["\u0001x", word]))
        check(s == 200 and b["stop_reason"] == "stop_sequence" and b["stop_sequence"] == word and
              b["content"][-1]["text"] == text[:text.find(word)], "/v1/messages: stop_sequence (%s)" % b)
    s, b = api.json("POST", "/v1/messages/count_tokens", {"model": "x", "system": "Be brief", "messages": msgs})
    check(s == 200 and b == {"input_tokens": chat["usage"]["prompt_tokens"]}, "/v1/messages/count_tokens (%s)" % b)
    for bad, param in (({"messages": msgs}, "max_tokens"),
                       ({"messages": [], "max_tokens": 4}, "messages"),
                       ({"messages": [{"role": "tool", "content": "x"}], "max_tokens": 4}, "messages[0].role"),
                       ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 4},
                        "messages[0].content[0]"),
                       ({"messages": msgs, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "w"}]},
                        "tools[0].type"),
                       ({"messages": msgs, "max_tokens": 4, "tools": [{"name": "f g", "input_schema": {}}]},
                        "tools[0].name"),
                       ({"messages": msgs, "max_tokens": 4, "tool_choice": {"type": "sometimes"}}, "tool_choice.type")):
        s, b = api.json("POST", "/v1/messages", bad)
        check(s == 400 and b["error"]["param"] == param, "/v1/messages refuses %s (%d %s)" % (param, s, b))
    # Tools: tool_choice any makes the model call (a grammar); the call is a tool_use
    # block (streamed: its start, its input as input_json_delta, its stop), stop_reason
    # tool_use; a history of tool_use and tool_result blocks is taken.
    add = {"name": "add", "description": "Adds", "input_schema": ADD_TOOL["function"]["parameters"]}
    tool_body = {"messages": msgs, "max_tokens": 200, "temperature": 0, "tools": [add], "tool_choice": {"type": "any"}}
    s, b = api.json("POST", "/v1/messages", tool_body)
    uses = [c for c in b.get("content", []) if c["type"] == "tool_use"] if s == 200 else []
    check(s == 200 and b["stop_reason"] == "tool_use" and len(uses) >= 1 and uses[0]["name"] == "add" and
          uses[0]["id"].startswith("toolu_") and sorted(uses[0]["input"]) == ["a", "b"],
          "/v1/messages tool_choice any: a tool_use block (%s)" % b)
    s, ev = anthropic_stream(port, dict(tool_body, stream=True))
    starts = [d["content_block"] for n, d in ev if n == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    inputs = {}
    for n, d in ev:
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
            inputs[d["index"]] = inputs.get(d["index"], "") + d["delta"]["partial_json"]
    check(s == 200 and uses and len(starts) == len(uses) == len(inputs) and starts[0]["name"] == "add" and
          [json.loads(inputs[k]) for k in sorted(inputs)] == [u["input"] for u in uses] and
          ev[-2][1]["delta"]["stop_reason"] == "tool_use",
          "/v1/messages stream: the same tool_use blocks (%s)" % inputs)
    history = msgs + [{"role": "assistant", "content": [{"type": "text", "text": "Adding."},
                                                        {"type": "tool_use", "id": "toolu_1", "name": "add",
                                                         "input": {"a": 2, "b": 3}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]}]
    s, b = api.json("POST", "/v1/messages", {"messages": history, "max_tokens": 4, "tools": [add]})
    check(s == 200 and b["type"] == "message", "/v1/messages: a history of tool_use and tool_result (%s)" % b)


def embedding_tests(api, model):
    """/v1/embeddings and /embedding (--pooling last): the last token's hidden state after
    the output norm, against node-llama-cpp's embedding of the same tokens; shapes and
    errors as llama-server's."""
    import base64
    import math
    import struct
    tokens = tokens_of(api, "Embeddings are vectors of the hidden state")
    r = subprocess.run(["node", os.path.join(SOURCE, "tests/conformance/reference.mjs"), "embed", model,
                        json.dumps(tokens)], capture_output=True, text=True)
    if r.returncode != 0:
        check(False, "node-llama-cpp's embedding of the prompt: " + r.stderr[-400:])
        return
    ref = json.loads(r.stdout)
    ref_tokens, ref_vec = ref["tokens"], ref["embedding"]
    s, b = api.json("POST", "/v1/embeddings", {"model": "any-name", "input": ref_tokens, "embd_normalize": -1})
    check(s == 200 and b.get("object") == "list" and b.get("model") == "any-name", "/v1/embeddings answers a list: %s" % str(b)[:300])
    if s != 200:
        return
    item = b["data"][0]
    vec = item["embedding"]
    check(item["object"] == "embedding" and item["index"] == 0 and len(vec) == 64, "an embedding of the model's width")
    check(b["usage"] == {"prompt_tokens": len(ref_tokens), "total_tokens": len(ref_tokens)}, "usage counts the input's tokens")
    norm = math.sqrt(sum(x * x for x in ref_vec))
    diff = max(abs(a - c) for a, c in zip(vec, ref_vec)) / norm
    dot = sum(a * c for a, c in zip(vec, ref_vec)) / (norm * math.sqrt(sum(a * a for a in vec)))
    check(diff < 2e-3 and dot > 0.99999,
          "the embedding is llama.cpp's (max difference %.2e of its norm, cosine %.7f)" % (diff, dot))
    # The default normalisation: euclidean, the same direction.
    _, d = api.json("POST", "/v1/embeddings", {"input": ref_tokens})
    unit = d["data"][0]["embedding"]
    check(abs(sum(x * x for x in unit) - 1) < 1e-5 and max(abs(u - v / norm) for u, v in zip(unit, vec)) < 2e-3,
          "embd_normalize defaults to the euclidean norm")
    # Several inputs, in order; base64 is the same floats.
    texts = ["first input", [1, 2, 3], "third"]
    _, many = api.json("POST", "/v1/embeddings", {"input": texts})
    _, encoded = api.json("POST", "/v1/embeddings", {"input": texts, "encoding_format": "base64"})
    check([x["index"] for x in many["data"]] == [0, 1, 2], "one embedding per input, in order")
    _, one = api.json("POST", "/v1/embeddings", {"input": "third"})
    check(many["data"][2]["embedding"] == one["data"][0]["embedding"], "an input's embedding does not depend on the others")
    floats = list(struct.unpack("<64f", base64.b64decode(encoded["data"][1]["embedding"])))
    check(encoded["data"][1].get("encoding_format") == "base64" and
          floats == [struct.unpack("<f", struct.pack("<f", x))[0] for x in many["data"][1]["embedding"]],
          "base64 holds the same F32 values")
    # llama-server's own shape: a list of {index, embedding: [[...]]}.
    for path, body in (("/embedding", {"content": "first input"}), ("/embeddings", {"content": "first input"}),
                       ("/v1/embeddings", {"content": "first input"})):
        s, e = api.json("POST", path, body)
        check(s == 200 and isinstance(e, list) and e[0]["index"] == 0 and len(e[0]["embedding"]) == 1 and
              e[0]["embedding"][0] == many["data"][0]["embedding"], path + " with 'content': llama-server's list")
    for body, param in (({}, "input"), ({"input": []}, "input"), ({"input": "x", "dimensions": 3}, "dimensions"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": "x", "embd_normalize": 1.5}, "embd_normalize"), ({"input": "x", "top_k": 3}, "top_k"),
                        ({"input": ["ok", [99999999]]}, "input[1]"), ({"input": " hello" * (CTX + 10)}, None)):
        s, e = api.json("POST", "/v1/embeddings", body)
        check(s == 400 and (param is None or e["error"].get("param") == param),
              "a bad embeddings request is refused naming %s: %s" % (param, str(e)[:200]))


def infill_tests(api):
    """/infill: a /completion of [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID] (the context
    here is too small for extra chunks: llama-server keeps them to what is left past a
    batch of 2048); the layout itself is request_parsing_test's."""
    def ids(text, special=False):
        _, t = api.json("POST", "/tokenize", {"content": text, "add_special": False, "parse_special": special})
        return t["tokens"]
    prefix, suffix = "def add(a, b):\n    ", "\n    return c\n"
    prompt = ids("<|fim_prefix|>", True) + ids(prefix) + ids("<|fim_suffix|>", True) + ids(suffix) + \
        ids("<|fim_middle|>", True)
    check(len(prompt) == len(ids(prefix)) + len(ids(suffix)) + 3, "the FIM tokens are single tokens")
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 8, "temperature": 0,
            "input_extra": [{"filename": "util.py", "text": "x = 1"}]}
    s, fill = api.json("POST", "/infill", body)
    _, plain = api.json("POST", "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0})
    check(s == 200 and fill.get("tokens_evaluated") == len(prompt) and fill["content"] == plain["content"],
          "/infill completes the fill-in-the-middle prompt: %s" % str(fill)[:200])
    _, streamed = api.stream("/infill", dict(body, stream=True))
    text = "".join(json.loads(e).get("content", "") for e in streamed if e.startswith("{"))
    check(text == plain["content"], "/infill streams the same text")
    for bad, param in (({"input_suffix": "x"}, "input_prefix"), ({"input_prefix": "x"}, "input_suffix"),
                       (dict(body, input_extra=[{"text": 5}]), "input_extra[0].text")):
        s, e = api.json("POST", "/infill", bad)
        check(s == 400 and e["error"].get("param") == param, "/infill refuses a bad request naming %s" % param)


def slot_file_tests(api, slot_dirs):
    """POST /slots/{id}?action=save|restore|erase: each stage writes its own layers to its
    own directory; a restored slot is continued by a request with its prefix, with the
    reply of a fresh computation."""
    prompt = "Slots on disk keep a conversation for later: zebra quartz"
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0}
    _, first = api.json("POST", "/completion", body)
    # A reply goes out before the step that finished it updates /slots (ASan widens it).
    check(wait_until(lambda: processing(api) == [], 10), "the request's slot is idle after its reply")
    _, slots = api.json("GET", "/slots")
    idle = [x for x in slots if x["state"] == "idle"]
    mine = max(idle, key=lambda x: x["id"])
    s, saved = api.json("POST", "/slots/%d?action=save" % mine["id"], {"filename": "conv.bin"})
    check(s == 200 and saved["id_slot"] == mine["id"] and saved["n_saved"] == mine["n_past"] and saved["n_written"] > 0 and
          "save_ms" in saved["timings"], "a slot is saved: %s" % saved)
    check(all(os.path.getsize(os.path.join(d, "conv.bin")) > 0 for d in slot_dirs),
          "each stage wrote its file in its own directory (%d)" % len(slot_dirs))
    for x in idle:  # nothing kept: the reply below can only come from the restored slot
        s, e = api.json("POST", "/slots/%d?action=erase" % x["id"])
        check(s == 200 and e["id_slot"] == x["id"] and e["n_erased"] == x["n_past"], "an idle slot is erased")
    _, slots = api.json("GET", "/slots")
    check(not [x for x in slots if x["state"] == "idle"], "no idle slot is left")
    s, restored = api.json("POST", "/slots/0?action=restore", {"filename": "conv.bin"})
    check(s == 200 and restored["n_restored"] == saved["n_saved"] and restored["n_read"] > 0, "the slot is restored: %s" % restored)
    _, slots = api.json("GET", "/slots")
    check([(x["id"], x["n_past"]) for x in slots if x["state"] == "idle"] == [(restored["id_slot"], saved["n_saved"])],
          "the restored slot is idle with its positions")
    _, again = api.json("POST", "/completion", body)
    check(wait_until(lambda: processing(api) == [], 10), "the continued slot is idle after its reply")
    check(again["tokens_cached"] > 0 and again["content"] == first["content"],
          "a request continues the restored slot, with the same reply (%d cached)" % again["tokens_cached"])
    with open(os.path.join(slot_dirs[0], "junk.bin"), "wb") as f:
        f.write(b"not a slot file at all")
    if len(slot_dirs) > 1:  # stage 0's file in stage 1's directory: another layer range
        shutil.copy(os.path.join(slot_dirs[0], "conv.bin"), os.path.join(slot_dirs[1], "swapped.bin"))
        shutil.copy(os.path.join(slot_dirs[0], "conv.bin"), os.path.join(slot_dirs[0], "swapped.bin"))
        s, e = api.json("POST", "/slots/0?action=restore", {"filename": "swapped.bin"})
        check(s == 400 and "holds layers 0-0" in e["error"]["message"], "another layer range's file is refused: %s" % e)
    for path, req, named in (("/slots/0?action=restore", {"filename": "missing.bin"}, "no such file"),
                             ("/slots/0?action=restore", {"filename": "junk.bin"}, "not a slot file"),
                             ("/slots/0?action=restore", {"filename": "../conv.bin"}, "not a plain file name"),
                             ("/slots/0?action=restore", {}, "filename"),
                             ("/slots/99999?action=save", {"filename": "x.bin"}, "no idle slot 99999"),
                             ("/slots/0?action=copy", {"filename": "x.bin"}, "Invalid action"),
                             ("/slots/abc?action=save", {"filename": "x.bin"}, "not a slot id")):
        s, e = api.json("POST", path, req)
        check(s == 400 and named in e["error"]["message"], "%s %s is refused naming '%s': %s" % (path, req, named, e))
    _, slots = api.json("GET", "/slots")
    check(len([x for x in slots if x["state"] == "idle"]) == 1, "a refused restore leaves no slot behind")


def cancel_tests(api, port, slots_total):
    """Clients that disconnect while their request waits in the queue, or without streaming:
    the request is cancelled and its sequence freed on every stage."""
    long_gen = {"prompt": PROMPT, "max_tokens": CTX - 64, "temperature": 0, "ignore_eos": True}
    # The slots of the requests before settle first: a reply goes out before the engine's
    # step that finished it updates /slots (a window ASan widens).
    check(wait_until(lambda: processing(api) == [], 10), "no request processing before the cancel tests")
    # Non-streaming, in decode.
    cancelled = metric(api, "pico:requests_cancelled_total")
    predicted = metric(api, "llamacpp:tokens_predicted_total")
    sock = raw_post(port, "/v1/completions", long_gen)
    check(wait_until(lambda: any(x["n_decoded"] > 0 for x in processing(api) or [])), "non-streaming request decoding")
    # Its slot shows its parameters and where its generation stands, as llama-server's.
    running = [x for x in processing(api) or [] if x["n_decoded"] > 0]
    check(len(running) == 1 and running[0]["params"]["n_predict"] == CTX - 64 and
          running[0]["params"]["temperature"] == 0 and running[0]["params"]["ignore_eos"] is True and
          running[0]["next_token"][0]["n_remain"] == CTX - 64 - running[0]["next_token"][0]["n_decoded"] and
          running[0]["next_token"][0]["has_next_token"] is True and
          running[0]["n_prompt_tokens_processed"] == running[0]["n_prompt_tokens"] - running[0]["n_prompt_tokens_cache"],
          "/slots: a running request's params and next_token (%s)" % str(running)[:300])
    sock.close()
    check(wait_until(lambda: processing(api) == [], 10), "non-streaming client gone: its request stops")
    check(metric(api, "pico:requests_cancelled_total") == cancelled + 1 and
          metric(api, "llamacpp:tokens_predicted_total") - predicted < CTX - 200,
          "non-streaming client gone: cancelled, generation stopped")
    check(stages_hold_only_kept(api), "non-streaming client gone: no stage keeps its sequence")
    # A request whose text has a newline (a grammar puts one first): has_new_line.
    newline = dict(long_gen, grammar='root ::= "\\n" [a-z]+')
    sock = raw_post(port, "/completion", newline)
    check(wait_until(lambda: any(x["next_token"][0]["has_new_line"] and x["n_decoded"] > 1
                                 for x in processing(api) or [])), "/slots: has_new_line once a newline is out")
    sock.close()
    check(wait_until(lambda: processing(api) == [], 10), "its client gone: the request stops")
    # Queued: every slot busy, one more waits; it leaves the queue when its client goes.
    busy = [raw_post(port, "/v1/completions", dict(long_gen, stream=(i % 2 == 0))) for i in range(slots_total)]
    check(wait_until(lambda: len(processing(api) or []) == slots_total), "all %d slots busy" % slots_total)
    admitted = metric(api, "pico:requests_total")
    cancelled = metric(api, "pico:requests_cancelled_total")
    queued = raw_post(port, "/completion", {"prompt": "queued " + PROMPT, "n_predict": 4})
    check(wait_until(lambda: metric(api, "llamacpp:requests_deferred") == 1), "one request queued")
    queued.close()
    check(wait_until(lambda: metric(api, "llamacpp:requests_deferred") == 0, 10), "the queued client gone: dequeued")
    check(metric(api, "pico:requests_cancelled_total") == cancelled + 1 and
          metric(api, "pico:requests_total") == admitted, "the queued request was cancelled, never admitted")
    for b in busy:
        b.close()
    check(wait_until(lambda: processing(api) == [], 10), "the busy clients gone: every slot free")
    check(stages_hold_only_kept(api), "no stage keeps a cancelled sequence")


completed = False
try:
    main()
    completed = True
finally:
    cleanup(show_logs=bool(failures) or not completed)
if failures:
    print("%d FAILED" % len(failures))
    sys.exit(1)
print("all passed")
