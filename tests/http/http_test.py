#!/usr/bin/env python3
"""HTTP API tests of pico-coord (python3 stdlib only).

    http_test.py BUILD_DIR MODE      MODE: local | cluster | auth | openai

openai: the official npm client (tests/conformance/node_modules/openai) via
openai_client_test.mjs; fails without node or the package (scripts/setup.sh installs both).

Writes a synthetic qwen3 model (ChatML template), starts pico-coord on a free loopback
port (in-process, or against 2 pico-workers), and checks every endpoint: greedy text
equal to `pico run`, streaming ([DONE]), 32 concurrent streams, a client that
disconnects mid-stream, stop strings, malformed requests, --api-key.
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
PICO = os.path.join(BUILD, "tools/pico/pico")
COORD = os.path.join(BUILD, "coordinator/pico-coord")
WORKER = os.path.join(BUILD, "worker/pico-worker")
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


def cleanup():
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    model = os.path.join(tmp, "M.gguf")
    subprocess.run([PICO, "mkmodel", "--arch", "qwen3", "--vocab", "qwen3", "--layers", "2", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ctx", "4096", "--seed", "4",
                    "-o", model], check=True, stdout=subprocess.DEVNULL)
    coord_args = [COORD, "-m", model, "--port", "0", "-c", str(CTX), "--http-threads", "4"]
    if MODE == "cluster":
        for k, layers in enumerate(["0-0", "1-1"]):
            addr = "tcp://127.0.0.1:%d" % free_port()
            start([WORKER, "-m", model, "--layers", layers, "--listen", addr, "-t", "1"], "worker-%d.log" % k)
            coord_args += ["--worker", addr]
        coord_args += ["--parallel", "8"]  # 32 concurrent streams: 24 wait in the queue
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
        return

    api = Client(port)
    # Health, models, props.
    s, b = api.json("GET", "/health")
    check(s == 200 and b["status"] == "ok", "/health")
    s, b = api.json("GET", "/v1/models")
    check(s == 200 and b["object"] == "list" and b["data"][0]["id"] == "M", "/v1/models lists M")
    s, b = api.json("GET", "/props")
    check(s == 200 and b["default_generation_settings"]["n_ctx"] == CTX and b["chat_template"] == "chatml" and
          b["total_slots"] == (8 if MODE == "cluster" else 32), "/props")

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
    s, b = api.json("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0})
    check(s == 200 and b["content"] == ref and b["timings"]["predicted_n"] == N and b["stop_type"] == "limit",
          "/completion text, timings")
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
    freed = False
    for _ in range(100):
        s, sl = api.json("GET", "/slots")
        if s == 200 and sl == []:
            freed = True
            break
        time.sleep(0.05)
    check(freed, "the disconnected client's sequence is freed (/slots empty)")
    delta = predicted() - before
    check(delta < CTX - 100, "generation stopped after the disconnect (%d tokens)" % delta)
    for _ in range(40):  # the stages' stats are refreshed when the engine goes idle
        _, m = api.request("GET", "/metrics")
        if re.search(r'^pico:stage_sequences\{stage="\d"\} 0$', m, re.M):
            break
        time.sleep(0.05)
    for name in ["pico:requests_total", "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "pico:tokens_in_flight 0", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 'pico:stage_tokens{stage="0"}', 'pico:stage_sequences{stage="%d"} 0' % (1 if MODE == "cluster" else 0)]:
        check(name in m, "/metrics has " + name)

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
        ("POST", "/v1/chat/completions", {"messages": msgs, "n": 2}, 400),
        ("POST", "/v1/chat/completions", {"messages": msgs, "model": "gpt-nope"}, 404),
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


try:
    main()
finally:
    cleanup()
if failures:
    print("%d FAILED" % len(failures))
    sys.exit(1)
print("all passed")
