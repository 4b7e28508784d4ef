#!/usr/bin/env python3
"""Integration tests of the cluster's security and sessions: real pico-worker and
pico-coord processes on loopback.

  security_test.py BUILD_DIR MODEL_DIR CASE

CASE:
  curve     keyed workers (pico keygen, --secret-key, --authorized-keys) refuse an
            unkeyed coordinator, a coordinator whose key they do not know, and one with
            a wrong worker key, each with a clear error naming the worker (the handshake,
            not the hello timeout); a keyed 2-worker cluster gives the same greedy tokens
            as an open one, chains included, though the key files list no worker key;
            the bytes on every keyed link, coordinator to worker and worker to worker
            (relays record them), name CURVE and hold none of the plaintext an open
            cluster's links show.
  sessions  one coordinator owns a cluster: a second one (pico-coord -p) is refused as
            busy and the first serves on; --take-over takes it, and the first then fails
            its next request saying so; a killed and a stopped (SIGSTOP) owner are
            replaced by a new coordinator; a coordinator taken over gets its workers
            back once the other one is gone.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from processes import Processes, free_port

build, models, case = sys.argv[1], sys.argv[2], sys.argv[3]
PICO = os.path.join(build, "tools", "pico", "pico")
WORKER = os.path.join(build, "worker", "pico-worker")
COORD = os.path.join(build, "coordinator", "pico-coord")
MODEL = os.path.join(models, "llama.gguf")
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
run = Processes("pico-security-test.")
tmp, procs = run.tmp, run.procs
fail, start, read_log, wait_log = run.fail, run.start, run.read_log, run.wait_log







def start_worker(address, layers, log, keys=None):
    args = [WORKER, "-m", MODEL, "--layers", layers, "--listen", address, "-t", "1"]
    if keys:
        args += ["--secret-key", keys[0], "--authorized-keys", keys[1]]
    p = start(args, log)
    wait_log(log, r"listening on", p)
    return p


def run_coord(args, log, timeout=120):
    """pico-coord -p: (exit status, stdout, seconds)."""
    t0 = time.time()
    with open(os.path.join(tmp, log), "w") as err:
        r = subprocess.run([COORD, "-m", MODEL, "-p", PROMPT, "-n", "24", "--temp", "0", "--print-tokens"] + args,
                           stdout=subprocess.PIPE, stderr=err, timeout=timeout)
    return r.returncode, r.stdout.decode().strip(), time.time() - t0


def worker_args(addresses, keys=None):
    args = []
    for i, a in enumerate(addresses):
        args += ["--worker", a]
        if keys:
            args += ["--worker-key", keys[i]]
    return args


def keygen(name):
    path = os.path.join(tmp, name)
    r = subprocess.run([PICO, "keygen", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        fail("pico keygen %s: %s" % (name, r.stderr.decode()))
    public = open(path + ".public").read().strip()
    if r.stdout.decode().strip() != public:
        fail("pico keygen printed %r, wrote %r" % (r.stdout, public))
    return path


class Relay:
    """A TCP relay that records every byte it forwards, per direction."""

    def __init__(self, target_port):
        self.up, self.down = bytearray(), bytearray()  # toward the worker, back
        self.lock = threading.Lock()
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.port = self.server.getsockname()[1]
        self.target = target_port
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self.pump, args=(client, upstream, self.up), daemon=True).start()
            threading.Thread(target=self.pump, args=(upstream, client, self.down), daemon=True).start()

    def pump(self, src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.server.close()


def expect_refused(args, log, patterns, why):
    status, _, seconds = run_coord(args, log)
    text = read_log(log)
    if status == 0:
        fail("%s: accepted" % why)
    for p in patterns:
        if not re.search(p, text):
            fail("%s: the error lacks '%s': %s" % (why, p, text))
    if "no answer to hello" in text:
        fail("%s: refused by the hello timeout, not the handshake: %s" % (why, text))
    # The hello timeout is 10 s: a refusal seen in the handshake comes long before.
    if seconds > 8:
        fail("%s: refused after %.1f s" % (why, seconds))
    error = [l for l in text.splitlines() if "error" in l]
    print("%s: refused in %.2f s: %s" % (why, seconds, error[0] if error else text.strip()))


def start_http_coord(addresses, log, extra=()):
    p = start([COORD, "-m", MODEL, "--port", "0", "-c", "512"] + worker_args(addresses) + list(extra), log)
    return p, int(wait_log(log, r"listening on http://[^:]+:(\d+)", p).group(1))


def complete(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/completion", body=json.dumps({"prompt": PROMPT, "n_predict": 16, "temperature": 0}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, text


def until_accepted(args, log, why, limit=15):
    """Runs pico-coord -p until it is not refused as busy (the old owner's connection
    takes up to the heartbeat timeout to drop); returns its tokens."""
    t0 = time.time()
    attempts = 0
    while True:
        attempts += 1
        status, out, _ = run_coord(args, log)
        text = read_log(log)
        if status == 0:
            print("%s: a new coordinator got the cluster after %.2f s (%d attempt(s))" % (why, time.time() - t0, attempts))
            return out
        if "serves another coordinator" not in text:
            fail("%s: failed otherwise: %s" % (why, text))
        if time.time() - t0 > limit:
            fail("%s: still refused after %.0f s: %s" % (why, limit, text))
        time.sleep(0.2)


try:
    if case == "curve":
        coord_key, stranger_key, w0_key, w1_key = (keygen(n) for n in ("coord", "stranger", "w0", "w1"))
        if os.stat(coord_key + ".secret").st_mode & 0o077:
            fail("the secret key file is readable by others")
        r = subprocess.run([PICO, "keygen", coord_key], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode == 0 or b"exists" not in r.stderr:
            fail("pico keygen overwrote a key pair: %s" % r.stderr)
        # Only the coordinator's key: the workers accept each other through the plan.
        authorized = os.path.join(tmp, "authorized_keys")
        with open(authorized, "w") as f:
            f.write("# the coordinator\n%s\n\n" % open(coord_key + ".public").read().strip())
        open_addresses = ["tcp://127.0.0.1:%d" % free_port() for _ in range(2)]
        keyed_addresses = ["tcp://127.0.0.1:%d" % free_port() for _ in range(2)]
        start_worker(open_addresses[0], "0-1", "open-0.log")
        start_worker(open_addresses[1], "2-3", "open-1.log")
        start_worker(keyed_addresses[0], "0-1", "keyed-0.log", (w0_key + ".secret", authorized))
        start_worker(keyed_addresses[1], "2-3", "keyed-1.log", (w1_key + ".secret", authorized))
        publics = [w0_key + ".public", w1_key + ".public"]

        status, expected, _ = run_coord(worker_args(open_addresses), "open.log")
        if status != 0:
            fail("open cluster: %s" % read_log("open.log"))
        status, got, _ = run_coord(["--secret-key", coord_key + ".secret"] + worker_args(keyed_addresses, publics),
                                   "keyed.log")
        if status != 0:
            fail("keyed cluster: %s" % read_log("keyed.log"))
        if got != expected:
            fail("keyed cluster tokens %s, open %s" % (got, expected))
        if not re.search(r"chained steps [1-9]", read_log("keyed.log")):
            fail("keyed cluster: no greedy chain (the last stage could not reach the first)")
        print("keyed 2-worker cluster: the open cluster's tokens %s, chained" % got)

        expect_refused(worker_args(keyed_addresses), "unkeyed.log",
                       [re.escape(keyed_addresses[0]), "handshake", "--secret-key"], "unkeyed coordinator")
        expect_refused(["--secret-key", stranger_key + ".secret"] + worker_args(keyed_addresses, publics),
                       "stranger.log", [re.escape(keyed_addresses[0]), "authorized-keys"], "unknown coordinator key")
        if "refused a connection" not in read_log("keyed-0.log"):
            fail("the worker did not log the refused key")
        expect_refused(["--secret-key", coord_key + ".secret"] + worker_args(keyed_addresses, publics[::-1]),
                       "wrong-worker-key.log", [re.escape(keyed_addresses[0]), "--worker-key"], "wrong worker key")
        expect_refused(["--secret-key", coord_key + ".secret"] + worker_args(open_addresses, publics),
                       "keyed-to-open.log", [re.escape(open_addresses[0]), "handshake"], "keyed coordinator, open worker")
        expect_refused(["--secret-key", coord_key + ".secret", "--worker", keyed_addresses[0], "--worker-key", publics[0],
                        "--worker", keyed_addresses[1]], "mixed.log", ["one per --worker"], "a worker without a key")

        # What the links carry: a relay in front of each worker records every link, the
        # coordinator's and the workers' (the plan names the relays' addresses, so stage
        # 0 reaches stage 1 and the last stage's chain reaches stage 0 through them).
        def capture(addresses, extra, log):
            relays = [Relay(int(a.rsplit(":", 1)[1])) for a in addresses]
            status, out, _ = run_coord(worker_args(["tcp://127.0.0.1:%d" % r.port for r in relays],
                                                   publics if extra else None) + extra, log)
            for r in relays:
                r.close()
            if status != 0:
                fail("through the relays: %s" % read_log(log))
            if not re.search(r"chained steps [1-9]", read_log(log)):
                fail("through the relays: no greedy chain")
            links = []
            for r in relays:
                with r.lock:
                    links.append((bytes(r.up), bytes(r.down)))
            return out, links

        # Plaintext an open link shows: the mechanism, hello's role, the model's arch in
        # the capabilities, the routing ids of the coordinator, of stage 0's link to stage
        # 1 and of the last stage's chain (ZMTP metadata).
        markers = [b"NULL", b"coordinator", b"llama", b"coord-", b"stage-0-", b"chain-"]
        out_open, links = capture(open_addresses, [], "relay-open.log")
        seen = b"".join(up + down for up, down in links)
        for marker in markers:
            if marker not in seen:
                fail("the open links lack %r: the capture proves nothing" % marker)
        out_keyed, links = capture(keyed_addresses, ["--secret-key", coord_key + ".secret"], "relay-keyed.log")
        if out_keyed != out_open:
            fail("through the relays: keyed %s, open %s" % (out_keyed, out_open))
        for k, (up, down) in enumerate(links):
            if b"CURVE" not in up[:64] or b"CURVE" not in down[:64]:
                fail("worker %d's link greeting does not name CURVE: %r" % (k, up[:64]))
            for marker in markers:
                if marker in up or marker in down:
                    fail("worker %d's keyed links carry %r in the clear" % (k, marker))
        print("capture: the open links show %s; the keyed links (%s bytes) name CURVE and show none of them" %
              (b", ".join(markers).decode(), " + ".join(str(len(u) + len(d)) for u, d in links)))

    elif case == "sessions":
        addresses = ["tcp://127.0.0.1:%d" % free_port(), "tcp://127.0.0.1:%d" % free_port()]
        start_worker(addresses[0], "0-1", "worker-0.log")
        start_worker(addresses[1], "2-3", "worker-1.log")
        first, port = start_http_coord(addresses, "first.log")
        status, text = complete(port)
        if status != 200:
            fail("first coordinator: %d %s" % (status, text))
        expected = json.loads(text)["content"]

        status, _, seconds = run_coord(worker_args(addresses), "second.log")
        text = read_log("second.log")
        if status == 0 or "serves another coordinator" not in text or "--take-over" not in text:
            fail("a second coordinator was not refused as busy: %s" % text)
        if addresses[0] not in text:
            fail("the refusal does not name the worker: %s" % text)
        print("second coordinator: refused in %.2f s: %s" % (seconds, [l for l in text.splitlines() if "error" in l][0]))
        status, text = complete(port)
        if status != 200 or json.loads(text)["content"] != expected:
            fail("the first coordinator after the second was refused: %d %s" % (status, text))
        print("first coordinator: serves on, the same text")

        status, _, _ = run_coord(worker_args(addresses) + ["--take-over"], "take-over.log")
        if status != 0:
            fail("--take-over: %s" % read_log("take-over.log"))
        status, text = complete(port)
        if status == 200 or "taken over" not in text:
            fail("the first coordinator after a take-over: %d %s" % (status, text))
        print("first coordinator after --take-over: %d %s" % (status, text.strip()))
        # That coordinator has finished: the first one gets its workers back.
        status, text = complete(port)
        if status != 200 or json.loads(text)["content"] != expected:
            fail("the first coordinator once the other one left: %d %s" % (status, text))
        print("first coordinator once the other one left: rejoined, the same text")
        first.kill()
        first.wait()

        for how in ("killed", "stopped"):
            owner, port = start_http_coord(addresses, "owner-%s.log" % how)
            status, text = complete(port)
            if status != 200 or json.loads(text)["content"] != expected:
                fail("owner to be %s: %d %s" % (how, status, text))
            owner.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            until_accepted(worker_args(addresses), "after-%s.log" % how, "owner %s" % how)
            owner.kill()
            owner.wait()
    else:
        print("unknown case", case)
        raise SystemExit(2)
    print("PASS")
finally:
    run.close()
