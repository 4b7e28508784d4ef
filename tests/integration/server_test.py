#!/usr/bin/env python3
"""Integration tests of a long-running pico-coord (the HTTP server mode) over real
pico-workers on loopback.

  server_test.py BUILD_DIR MODEL_DIR CASE

CASE:
  rejoin   kill -9 a worker under a running server: the next request fails at once
           naming the worker; restart the worker at the same address: the next request
           succeeds with the same greedy text as before, without restarting the server.
           A worker back with another model, other layers or smaller limits than the
           coordinator was sized for is refused, naming it.
           The same with a worker stopped (SIGSTOP) past the heartbeat timeout, then
           resumed.
  metrics  /metrics has the per-stage timing counters (compute, transfer, batches,
           tokens, logits transfer), in-process (transfers 0) and with 2 workers, and
           they grow with every request.
"""
import json
import os
import signal
import sys
import time

from processes import Processes, free_port, request

build, models, case = sys.argv[1], sys.argv[2], sys.argv[3]
WORKER = os.path.join(build, "worker", "pico-worker")
COORD = os.path.join(build, "coordinator", "pico-coord")
MODEL = os.path.join(models, "llama.gguf")
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
run = Processes("pico-server-test.")
tmp, procs = run.tmp, run.procs
fail, start, read_log, wait_log = run.fail, run.start, run.read_log, run.wait_log






def start_worker(address, layers, log, model=MODEL, extra=()):
    p = start([WORKER, "-m", model, "--layers", layers, "--listen", address, "-t", "1", *extra], log)
    wait_log(log, r"listening on", p)
    return p


def start_coord(workers):
    args = [COORD, "-m", MODEL, "--port", "0", "-c", "512"]
    for w in workers:
        args += ["--worker", w]
    p = start(args, "coord.log")
    return p, int(wait_log("coord.log", r"listening on http://[^:]+:(\d+)", p).group(1))


def complete(port):
    return request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0})


def metrics(port):
    status, text = request(port, "GET", "/metrics")
    if status != 200:
        fail("/metrics answered %d" % status)
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values


def stage_key(name, stage, layers):
    return '%s{stage="%d",layers="%s"}' % (name, stage, layers)


def check_timings(port, layers, remote):
    """Two requests; after each the counters are present and have grown."""
    names = ["pico_stage_compute_seconds_total", "pico_stage_transfer_seconds_total",
             "pico_stage_batches_total", "pico_stage_tokens_total"]
    before = None
    for round in range(2):
        status, text = complete(port)
        if status != 200:
            fail("completion: %d %s" % (status, text))
        m = metrics(port)
        now = {}
        for i, l in enumerate(layers):
            for n in names:
                key = stage_key(n, i, l)
                if key not in m:
                    fail("/metrics lacks %s" % key)
                now[key] = m[key]
        if "pico_logits_transfer_seconds_total" not in m:
            fail("/metrics lacks pico_logits_transfer_seconds_total")
        now["logits"] = m["pico_logits_transfer_seconds_total"]
        for key, value in now.items():
            is_transfer = "transfer" in key or key == "logits"
            if is_transfer and not remote:
                if value != 0:
                    fail("in-process: %s = %g, expected 0" % (key, value))
            elif before is None and value <= 0:
                fail("%s = %g after a request" % (key, value))
            elif before is not None and value <= before[key]:
                fail("%s did not grow: %g then %g" % (key, before[key], value))
        before = now
        print("round %d:" % round, " ".join("%s=%g" % (k.split("{")[0].replace("pico_", "") +
                                                        (k[k.find("{"):] if "{" in k else ""), v)
                                             for k, v in sorted(now.items())))
    for i in range(len(layers)):
        tokens = before[stage_key("pico_stage_tokens_total", i, layers[i])]
        batches = before[stage_key("pico_stage_batches_total", i, layers[i])]
        if tokens < batches:
            fail("stage %d: %g tokens in %g batches" % (i, tokens, batches))


try:
    if case == "rejoin":
        addresses = ["tcp://127.0.0.1:%d" % free_port(), "tcp://127.0.0.1:%d" % free_port()]
        workers = [start_worker(addresses[0], "0-1", "worker-0.log"), start_worker(addresses[1], "2-3", "worker-1.log")]
        coord, port = start_coord(addresses)
        status, text = complete(port)
        if status != 200:
            fail("before the kill: %d %s" % (status, text))
        expected = json.loads(text)["content"]
        print("before: %r" % expected)
        for victim in (0, 1):
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            t0 = time.time()
            status, text = complete(port)
            elapsed = time.time() - t0
            if status == 200:
                fail("worker %d killed: the request succeeded" % victim)
            if addresses[victim] not in text:
                fail("worker %d killed: the error does not name it: %s" % (victim, text))
            print("worker %d killed: failed in %.0f ms: %s" % (victim, elapsed * 1e3, text.strip()))
            if elapsed > 2.0:
                fail("the failure took %.1f s (limit 2 s)" % elapsed)
            if victim == 1:
                # Back with another model, with other layers, then with fewer sequences
                # than the coordinator serves (its default 32): refused, named.
                for model, layers, extra, why in (
                        (os.path.join(models, "qwen3.gguf"), "2-3", (), "serving qwen3"),
                        (MODEL, "3-3", (), "layers 3-3"),
                        (MODEL, "2-3", ("--max-sequences", "4"), "smaller limits than the coordinator was sized for")):
                    wrong = start_worker(addresses[1], layers, "worker-1-wrong.log", model, extra)
                    status, text = complete(port)
                    if status == 200 or why not in text or addresses[1] not in text:
                        fail("worker 1 back with %s: %d %s" % (why, status, text))
                    print("worker 1 back with %s: refused: %s" % (why, text.strip()))
                    wrong.kill()
                    wrong.wait()
            workers[victim] = start_worker(addresses[victim], ["0-1", "2-3"][victim], "worker-%d-again.log" % victim)
            status, text = complete(port)
            if status != 200:
                fail("worker %d restarted: the request failed: %d %s" % (victim, status, text))
            got = json.loads(text)["content"]
            if got != expected:
                fail("worker %d restarted: %r, before %r" % (victim, got, expected))
            print("worker %d restarted: the same text" % victim)
        # A hung worker (stopped past the heartbeat timeout) is lost the same way, and
        # rejoins once it runs again: same process, same address, a fresh connection.
        workers[0].send_signal(signal.SIGSTOP)
        time.sleep(1.6)
        status, text = complete(port)
        if status == 200 or addresses[0] not in text:
            fail("worker 0 hung: %d %s" % (status, text))
        print("worker 0 hung: %s" % text.strip())
        workers[0].send_signal(signal.SIGCONT)
        time.sleep(0.3)
        status, text = complete(port)
        if status != 200 or json.loads(text)["content"] != expected:
            fail("worker 0 resumed: %d %s" % (status, text))
        print("worker 0 resumed: the same text")
        if coord.poll() is not None:
            fail("pico-coord exited")
    elif case == "metrics":
        coord, port = start_coord([])
        check_timings(port, ["0-3"], remote=False)
        coord.send_signal(signal.SIGTERM)
        coord.wait()
        addresses = ["ipc://%s/w0.sock" % tmp, "ipc://%s/w1.sock" % tmp]
        start_worker(addresses[0], "0-1", "worker-0.log")
        start_worker(addresses[1], "2-3", "worker-1.log")
        coord, port = start_coord(addresses)
        check_timings(port, ["0-1", "2-3"], remote=True)
    else:
        print("unknown case", case)
        raise SystemExit(2)
    print("PASS")
finally:
    run.close()
