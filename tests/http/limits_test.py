"""http_test.py's `limits` mode: request validation and the HTTP limits of pico-coord.

Run by http_test.py (its helpers: h.check, h.start, h.Client, ...). Two servers on a
synthetic model: A with small limits, --api-key-file and --cors; B with PICO_API_KEY,
no CORS, and a low open-file limit (accept back-off).
"""
import json
import os
import resource
import socket
import subprocess
import threading
import time

ORIGIN = "https://app.example"
CTX = 2048


def authed_post(h, port, path, body):
    """h.raw_post with the API key: a request on a raw socket, to close at will."""
    sock = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s" % (path, h.KEY, len(data), data)).encode())
    return sock


def raw_exchange(port, head, body=b"", read_first=False, timeout=10):
    """Sends a request head (and maybe its body after the first answer); returns the bytes read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head)
    got = b""
    if read_first:
        try:
            got = sock.recv(65536)
        except (socket.timeout, ConnectionError):
            got = b""
        if body and got.startswith(b"HTTP/1.1 100"):
            sock.sendall(body)
            got += recv_response(sock)
    else:
        if body:
            sock.sendall(body)
        got = recv_response(sock)
    sock.close()
    return got


def recv_response(sock):
    got = b""
    try:
        while b"\r\n\r\n" not in got or (b"content-length" in got.lower() and len(got.split(b"\r\n\r\n", 1)[1]) <
                                         int(got.lower().split(b"content-length: ")[1].split(b"\r\n")[0])):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionError):
        pass
    return got


def status_of(raw):
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return -1


def cpu_seconds(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(h):
    check, tmp = h.check, h.tmp
    model = os.path.join(tmp, "M.gguf")
    subprocess.run([h.PICO, "mkmodel", "--arch", "qwen3", "--vocab", "qwen3", "--layers", "2", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ctx", "4096", "--seed", "4",
                    "-o", model], check=True, stdout=subprocess.DEVNULL)
    key_file = os.path.join(tmp, "key")
    with open(key_file, "w") as f:
        f.write(h.KEY + "\n")
    coord = h.start([h.COORD, "-m", model, "--port", "0", "-c", str(CTX), "--parallel", "4", "--max-queue", "1",
                     "--max-connections", "8", "--write-timeout", "1", "--body-limit", "65536", "--header-limit",
                     "4096", "--max-stop-strings", "4", "--max-stop-length", "16", "--api-key-file", key_file,
                     "--cors", ORIGIN], "coord.log")
    port = h.wait_port("coord.log", coord)
    api = h.Client(port, h.KEY)

    # --api-key-file, CORS.
    s, _ = h.Client(port).json("GET", "/v1/models")
    check(s == 401, "--api-key-file: no key, 401 (%d)" % s)
    s, _ = api.json("GET", "/v1/models")
    check(s == 200, "--api-key-file: the file's key, 200 (%d)" % s)
    raw = raw_exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + h.KEY.encode() +
                       b"\r\nOrigin: " + ORIGIN.encode() + b"\r\n\r\n")
    check(("access-control-allow-origin: " + ORIGIN).encode() in raw.lower(), "--cors: replies name the origin")
    raw = raw_exchange(port, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode() +
                       b"\r\nAccess-Control-Request-Method: POST\r\n\r\n")
    check(status_of(raw) == 204 and b"access-control-allow-methods" in raw.lower() and
          b"authorization" in raw.lower(), "--cors: preflight answered without a key (%r)" % raw[:60])

    validation_tests(h, api)

    # The crash: repeat_penalty 0 while another request streams.
    streamed = [None]

    def stream():
        _, ev = api.stream("/completion", {"prompt": h.PROMPT, "n_predict": 64, "stream": True, "ignore_eos": True})
        streamed[0] = ev
    t = threading.Thread(target=stream)
    t.start()
    s, b = api.json("POST", "/completion", {"prompt": "hi", "repeat_penalty": 0})
    t.join()
    check(s == 400 and "repeat_penalty" in b["error"]["message"], "repeat_penalty 0: 400 naming it (%d)" % s)
    check(streamed[0] and json.loads(streamed[0][-1])["stop"] and json.loads(streamed[0][-1])["tokens_predicted"] == 64,
          "the stream beside it completes")
    check(coord.poll() is None, "pico-coord still running")

    # Body 413, header 431, Expect: 100-continue.
    s, b = api.json("POST", "/v1/completions", None, raw=b"x" * 70000)
    check(s == 413, "body over --body-limit: 413 (%d)" % s)
    s, b = api.json("POST", "/v1/completions", {"prompt": "hi"}, headers={"X-Big": "y" * 5000})
    check(s == 431, "header over --header-limit: 431 (%d)" % s)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (h.KEY, len(body))).encode()
    raw = raw_exchange(port, head, body, read_first=True, timeout=3)
    check(raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n") and b"HTTP/1.1 200" in raw,
          "Expect: 100-continue: 100, then the answer (%r)" % raw[:40])
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nExpect: 100-continue\r\n"
            "Content-Length: 100000\r\n\r\n" % h.KEY).encode()
    raw = raw_exchange(port, head, read_first=True, timeout=3)
    check(status_of(raw) == 413, "Expect: 100-continue with a body too large: 413 before the body (%r)" % raw[:20])
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"
    raw = raw_exchange(port, head, read_first=True, timeout=3)
    check(status_of(raw) == 401, "Expect: 100-continue without the key: 401 before the body (%r)" % raw[:20])

    # Stop strings: 4 of at most 16 bytes.
    s, _ = api.json("POST", "/completion", {"prompt": "hi", "n_predict": 2, "stop": ["a", "b", "c", "d"]})
    check(s == 200, "4 stop strings: 200 (%d)" % s)
    s, b = api.json("POST", "/completion", {"prompt": "hi", "n_predict": 2, "stop": ["a", "b", "c", "d", "e"]})
    check(s == 400 and "stop" in b["error"]["message"], "5 stop strings: 400 (%d)" % s)
    s, b = api.json("POST", "/completion", {"prompt": "hi", "n_predict": 2, "stop": "x" * 17})
    check(s == 400 and "stop" in b["error"]["message"], "a 17-byte stop string: 400 (%d)" % s)

    generation_tests(h, api)
    queue_and_connection_tests(h, api, port)
    write_deadline_test(h, api, port)

    # Server B: PICO_API_KEY, no CORS, 64 open files.
    env = dict(os.environ, PICO_API_KEY="env-key")
    log = open(os.path.join(tmp, "coord-b.log"), "w")
    b_proc = subprocess.Popen([h.COORD, "-m", model, "--port", "0", "-c", "256"], stdout=subprocess.DEVNULL,
                              stderr=log, env=env,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    h.procs.append(b_proc)
    b_port = h.wait_port("coord-b.log", b_proc)
    bapi = h.Client(b_port, "env-key")
    s, _ = h.Client(b_port).json("GET", "/v1/models")
    s2, _ = bapi.json("GET", "/v1/models")
    check(s == 401 and s2 == 200, "PICO_API_KEY: 401 without, 200 with it (%d, %d)" % (s, s2))
    raw = raw_exchange(b_port, b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode() + b"\r\n\r\n")
    check(status_of(raw) == 200 and b"access-control-allow-origin" not in raw.lower(), "no --cors: no CORS header")
    raw = raw_exchange(b_port, b"OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode() + b"\r\n\r\n")
    check(status_of(raw) != 204 and b"access-control-allow" not in raw.lower(), "no --cors: no preflight answer")
    # Out of file descriptors: accept fails; the server waits before retrying instead of
    # spinning (a spinning accept loop burns a core), and serves again once they are free.
    socks = []
    for _ in range(80):
        try:
            socks.append(socket.create_connection(("127.0.0.1", b_port), timeout=2))
        except OSError:
            break
    time.sleep(0.5)
    before = cpu_seconds(b_proc.pid)
    time.sleep(2)
    used = cpu_seconds(b_proc.pid) - before
    text = open(os.path.join(tmp, "coord-b.log")).read()
    failed, resumed = text.count("accept failed"), text.count("accepting connections again")
    # Once per run of failures, not per retry (25 in these 2.5 s): a second run happens when
    # the server closes one of the test's earlier connections late (under load) and so
    # frees a file for a moment; each run is logged once and its end too.
    check(1 <= failed <= 3 and failed - resumed in (0, 1),
          "accept failures logged once per run of them (%d failed, %d resumed)" % (failed, resumed))
    check(used < 0.5, "no spinning while accept fails (%.2f s of CPU in 2 s)" % used)
    for sock in socks:
        sock.close()
    check(h.wait_until(lambda: bapi.json("GET", "/health")[0] == 200, 30), "serves again once files are free")


def validation_tests(h, api):
    """One invalid field per row over a base request that succeeds, for every endpoint:
    400 naming the field."""
    check = h.check
    msgs = [{"role": "user", "content": "hi"}]
    bases = {"/completion": {"prompt": "hi", "n_predict": 2},
             "/v1/completions": {"prompt": "hi", "max_tokens": 2},
             "/v1/chat/completions": {"messages": msgs, "max_tokens": 2}}
    for path, body in bases.items():
        s, b = api.json("POST", path, body)
        check(s == 200, "base request of %s: 200 (%d %s)" % (path, s, str(b)[:100]))
    rows = [("temperature", -1), ("top_p", 1.5), ("min_p", -0.5), ("typical_p", 2), ("top_k", -5),
            ("repeat_penalty", 0), ("presence_penalty", 3), ("frequency_penalty", -3), ("seed", -7),
            ("max_tokens", "x"), ("stop", 5), ("logit_bias", {"99999999": 1}), ("logit_bias", {"1": 500}),
            ("mirostat", 3), ("grammar", "root ::= x"), ("stream", "yes"), ("stream_options", 1),
            ("response_format", {"type": "json_schema"}), ("samplers", ["nope"]), ("cache_prompt", 1)]
    per_path = {"/completion": [("n_probs", 50), ("post_sampling_probs", "yes"), ("n_predict", -3),
                                ("prompt", [10 ** 9]), ("prompt", [-1])],
                "/v1/completions": [("n", 17), ("logprobs", 30), ("echo", True), ("prompt", [10 ** 9]),
                                    ("prompt", ["a", "b"]), ("max_tokens", 0)],
                "/v1/chat/completions": [("n", 0), ("top_logprobs", 30), ("tools", [{"type": "function"}]),
                                         ("tool_choice", "maybe"), ("messages", []),
                                         ("messages", [{"role": "robot", "content": "hi"}]),
                                         ("messages", [{"role": "user", "content": [{"type": "image_url"}]}])]}
    for path, body in bases.items():
        for field, value in rows + per_path[path]:
            s, b = api.json("POST", path, dict(body, **{field: value}))
            named = isinstance(b, dict) and field in b.get("error", {}).get("message", "")
            check(s == 400 and named, "%s %s=%s: 400 naming it (%d %s)" % (path, field, json.dumps(value)[:30], s,
                                                                            str(b)[:100]))
    s, b = api.json("POST", "/detokenize", {"tokens": [10 ** 9]})
    check(s == 400 and "tokens" in b["error"]["message"], "/detokenize: an id outside the vocabulary (%d)" % s)
    s, b = api.json("POST", "/tokenize", {"content": 5})
    check(s == 400 and "content" in b["error"]["message"], "/tokenize: content not a string (%d)" % s)
    s, b = api.json("POST", "/v1/completions", {"prompt": [1] * (CTX + 5)})
    check(s == 400 and b["error"]["type"] == "exceed_context_size_error" and
          "exceeds the available context size (%d tokens)" % CTX in b["error"]["message"],
          "a prompt over the context: llama-server's error (%s)" % str(b)[:120])


def generation_tests(h, api):
    check = h.check
    # n_predict 0: the prompt evaluated (its KV kept), no tokens; the next request reuses it.
    prompt = " ".join("word%d" % i for i in range(40))
    s, b = api.json("POST", "/completion", {"prompt": prompt, "n_predict": 0})
    check(s == 200 and b["content"] == "" and b["tokens_predicted"] == 0 and b["stop_type"] == "limit",
          "n_predict 0: no tokens (%s)" % str(b)[:100])
    s, b2 = api.json("POST", "/completion", {"prompt": prompt, "n_predict": 4})
    check(s == 200 and b2["timings"]["cache_n"] == b["tokens_evaluated"] - 1 and b2["tokens_predicted"] == 4,
          "then the same prompt reuses its KV (cache_n %s)" % b2.get("timings", {}).get("cache_n"))
    # The context reached during decode: finish_reason length. The prompt fills all but
    # 40 positions, so that the decode is short (2,000 tokens of it took over the
    # client's 120 s in a sanitized build on a loaded machine).
    s, b = api.json("POST", "/v1/completions", {"prompt": [1] * (CTX - 40), "max_tokens": -1, "ignore_eos": True,
                                                "temperature": 0})
    u = b["usage"]
    check(s == 200 and b["choices"][0]["finish_reason"] == "length" and
          CTX - u["prompt_tokens"] <= u["completion_tokens"] <= CTX - u["prompt_tokens"] + 1,
          "the context reached: finish_reason length after %d tokens" % u["completion_tokens"])
    # logit_bias: a banned token never comes; a +100 bias forces one.
    greedy = {"prompt": h.PROMPT, "n_predict": 12, "temperature": 0}
    s, ref = api.json("POST", "/completion", greedy)
    banned = ref["tokens"][0]
    s, b = api.json("POST", "/completion", dict(greedy, logit_bias=[[banned, False]]))
    check(s == 200 and banned not in b["tokens"] and b["tokens"] != ref["tokens"],
          "logit_bias false: token %d never sampled" % banned)
    s, b = api.json("POST", "/v1/completions", {"prompt": h.PROMPT, "max_tokens": 12, "temperature": 0,
                                                "logit_bias": {str(banned): -100}, "logprobs": 0})
    check(s == 200 and b["choices"][0]["text"] != ref["content"], "OpenAI logit_bias -100 changes the text")
    forced = 1000
    s, b = api.json("POST", "/completion", dict(greedy, logit_bias={str(forced): 100}))
    check(s == 200 and b["tokens"] == [forced] * 12, "logit_bias +100 forces token %d" % forced)
    # n_probs: completion_probabilities, llama-server's format.
    s, b = api.json("POST", "/completion", dict(greedy, n_probs=3))
    probs = b.get("completion_probabilities", [])
    check(s == 200 and len(probs) == 12 and [p["id"] for p in probs] == b["tokens"] and
          all(len(p["top_logprobs"]) == 3 and p["logprob"] <= 0 and "bytes" in p and "token" in p for p in probs) and
          all(p["top_logprobs"][0]["logprob"] >= p["logprob"] for p in probs),
          "n_probs 3: completion_probabilities per token")
    s, ev = api.stream("/completion", dict(greedy, n_probs=2, stream=True))
    parts = [json.loads(e) for e in ev]
    check(sum(len(p.get("completion_probabilities", [])) for p in parts) == 12, "n_probs streamed")


def queue_and_connection_tests(h, api, port):
    check = h.check
    long_gen = {"prompt": h.PROMPT, "max_tokens": CTX - 64, "temperature": 0, "ignore_eos": True}
    busy = [authed_post(h, port, "/v1/completions", long_gen) for _ in range(4)]  # --parallel 4
    check(h.wait_until(lambda: len(h.processing(api) or []) == 4), "4 slots busy")
    queued = authed_post(h, port, "/v1/completions", long_gen)  # --max-queue 1
    check(h.wait_until(lambda: h.metric(api, "llamacpp:requests_deferred") == 1), "one request queued")
    c = __import__("http.client").client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 2}),
              headers={"Authorization": "Bearer " + h.KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    check(r.status == 503 and r.getheader("Retry-After") == "1" and body["error"]["code"] == "queue_full",
          "the queue full: 503 with Retry-After (%d)" % r.status)
    for sock in busy + [queued]:
        sock.close()
    check(h.wait_until(lambda: h.processing(api) == [] and h.metric(api, "llamacpp:requests_deferred") == 0, 20),
          "the slots free again")
    # Connections: 8 open (idle); one more gets 503 and is closed.
    # The server accepts the 8 on its own time (slowly under a sanitizer): the 9th is
    # tried until it meets the cap, while the 8 stay open.
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    raw = b""
    for _ in range(40):
        raw = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        if status_of(raw) == 503:
            break
        time.sleep(0.25)
    check(status_of(raw) == 503 and b"too_many_connections" in raw and b"retry-after" in raw.lower(),
          "a connection over --max-connections: 503 (%r)" % raw[:20])
    for sock in idle:
        sock.close()
    check(h.wait_until(lambda: status_of(raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) == 200, 10),
          "served again once the connections closed")


def write_deadline_test(h, api, port):
    """A client that never reads a long stream is dropped after --write-timeout: its stream
    is cut (no [DONE]) and the connection closed, its request cancelled or over."""
    check = h.check
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"prompt": h.PROMPT, "max_tokens": CTX - 64, "temperature": 0, "ignore_eos": True,
                       "stream": True, "n": 4, "logprobs": 20})
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (h.KEY, len(body), body)).encode())
    # The socket buffers fill only once enough has been generated: minutes under a sanitizer.
    dropped = h.wait_until(lambda: "dropping a client" in open(os.path.join(h.tmp, "coord.log")).read(), 300)
    check(dropped, "the server drops the client that does not read")
    got = b""
    sock.settimeout(10)
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionError):
        pass
    sock.close()
    check(b"[DONE]" not in got, "its stream was cut (%d bytes read, no [DONE])" % len(got))
    check(h.wait_until(lambda: h.processing(api) == [], 30), "its slots are free")
