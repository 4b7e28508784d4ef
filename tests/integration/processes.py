"""The processes of an integration test script (server_test.py, security_test.py): a
temporary folder for their logs, processes started with their stderr in a log there,
waiting for a line in a log, and the cleanup (every process killed, the folder gone)."""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    """One HTTP exchange with a local pico-coord: (status, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, text


class Processes:
    def __init__(self, prefix):
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.procs = []

    def fail(self, what):
        """Prints the last lines of every log, then fails the script."""
        print("FAIL:", what)
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                print("---", name)
                print("".join(open(os.path.join(self.tmp, name)).readlines()[-8:]))
        raise SystemExit(1)

    def start(self, args, log):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.tmp, log), "w"))
        self.procs.append(p)
        return p

    def read_log(self, log):
        return open(os.path.join(self.tmp, log)).read()

    def wait_log(self, log, pattern, proc, timeout=60):
        """The first match of pattern in the log, waiting while proc runs (fails after timeout)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.read_log(log))
            if m:
                return m
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        self.fail("%s: no '%s'" % (log, pattern))

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
