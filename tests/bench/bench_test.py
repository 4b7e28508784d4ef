#!/usr/bin/env python3
"""Tests of the cluster benchmark scripts (python3 stdlib only).

    bench_test.py BUILD_DIR MODE [--require-stage-metrics]

MODE local:     2 pico-workers and pico-coord (tiny synthetic llama) serving HTTP, then
                scripts/bench-cluster --short against it: exit 0, one complete CSV row per
                concurrency level, every request succeeded, the numbers positive, the
                per-stage columns filled (with --require-stage-metrics), both PNGs drawn.
MODE emulated:  scripts/emulated-cluster (2 workers in network namespaces, shaped links,
                one under a CPU quota) running bench-cluster --short inside; the links
                carried the traffic through their shaping (qdisc and byte counts in the
                script's report). Then a second one, interactive, with the delaying
                relays: a request through it, SIGINT, and nothing of it is left: no
                namespace, no process, no cgroup, no new interface in the root namespace.
                Exits 77 (ctest SKIP) when network namespaces cannot be made.
MODE placement: scripts/bench-placement on two emulated nodes (a core and half of one)
                at 1 and 2 streams, a few tokens: the four splits ran, the planned ones
                with pico-coord's prediction, every split's layers cover the model.
                Exits 77 where network namespaces cannot be made.
MODE configs:   the example cluster files in configs/ hold the keys pico-coord reads and
                layer ranges without gap or overlap.
MODE pipeline:  scripts/bench-pipeline on a tiny model, a few tokens, one round: every
                measure printed (not its value: a few tokens on a busy machine give
                any rate), and greedy chains in the chained runs only.
"""
import csv
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import shutil
import time

BUILD, MODE = sys.argv[1], sys.argv[2]
REQUIRE_STAGE_METRICS = "--require-stage-metrics" in sys.argv[3:]
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
PICO = os.path.join(BUILD, "tools/pico/pico")
SKIP = 77
tmp = tempfile.mkdtemp(prefix="pico-bench-test.")
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def make_model():
    model = os.path.join(tmp, "tiny.gguf")
    subprocess.run([PICO, "mkmodel", "--arch", "llama", "--vocab", "llama2", "--layers", "4", "--embd", "64", "--ff",
                    "128", "--heads", "4", "--kv-heads", "2", "--ctx", "512", "--seed", "8", "-o", model], check=True,
                   stdout=subprocess.DEVNULL)
    return model


def check_csv(path, label):
    """The CSV of a --short run: two rows (C = 1, 2), all requests done, numbers positive."""
    if not os.path.exists(path):
        check(False, "%s: %s written" % (label, path))
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    check([int(r["concurrency"]) for r in rows] == [1, 2], "%s: one row per concurrency level 1, 2" % label)
    for r in rows:
        c = r["concurrency"]
        check(all(r[k] != "" for k in ("prompt_tokens", "output_tokens", "requests", "ok", "failed", "wall_s",
                                       "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_max", "stream_tps_mean",
                                       "stream_tps_min", "aggregate_tps", "server_prompt_ms_mean",
                                       "server_decode_tps_mean", "load1")),
              "%s C=%s: the row is complete" % (label, c))
        check(r["prompt_tokens"] == "16" and r["output_tokens"] == "8", "%s C=%s: P=16 G=8" % (label, c))
        check(r["requests"] == c and r["ok"] == c and r["failed"] == "0",
              "%s C=%s: all %s requests succeeded (ok %s, failed %s)" % (label, c, c, r["ok"], r["failed"]))
        positive = ("wall_s", "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_max", "stream_tps_mean", "stream_tps_min",
                    "aggregate_tps", "server_prompt_ms_mean", "server_decode_tps_mean")
        check(all(r[k] and float(r[k]) > 0 for k in positive), "%s C=%s: timings positive" % (label, c))
        check(float(r["ttft_ms_p50"]) <= float(r["ttft_ms_max"]) and float(r["stream_tps_min"]) <=
              float(r["stream_tps_mean"]), "%s C=%s: p50 <= max, min <= mean" % (label, c))
        if REQUIRE_STAGE_METRICS or r["stages"]:
            check(r["stages"] == "2" and r["stage_layers"] == "0-1;2-3",
                  "%s C=%s: 2 stages, layers 0-1;2-3 (%r, %r)" % (label, c, r["stages"], r["stage_layers"]))
            for column in ("stage_compute_s", "stage_transfer_s", "stage_batches", "stage_tokens"):
                values = r[column].split(";") if r[column] else []
                check(len(values) == 2 and all(float(v) > 0 for v in values),
                      "%s C=%s: %s positive per stage (%r)" % (label, c, column, r[column]))
            check(r["logits_transfer_s"] != "" and float(r["logits_transfer_s"]) > 0,
                  "%s C=%s: logits_transfer_s positive (%r)" % (label, c, r["logits_transfer_s"]))
            # Each stage ran the prompt and the generated tokens of every request at least.
            tokens = [int(v) for v in r["stage_tokens"].split(";")]
            check(all(t >= int(c) * (16 + 7) for t in tokens), "%s C=%s: stage tokens >= C x (P + G - 1) (%s)"
                  % (label, c, r["stage_tokens"]))
        else:
            print("note: %s: this pico-coord exports no per-stage counters" % label)
    return rows


def check_pngs(directory, label):
    for name in ("throughput.png", "stages.png"):
        path = os.path.join(directory, name)
        if name == "stages.png" and not REQUIRE_STAGE_METRICS and not os.path.exists(path):
            continue
        ok = os.path.exists(path) and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 1000
        check(ok, "%s: %s drawn" % (label, name))


def wait_log(path, pattern, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, open(path).read())
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    print(open(path).read())
    raise SystemExit("FAIL: %s did not start" % what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local():
    """2 pico-workers and pico-coord on loopback (as scripts/local-cluster starts them)."""
    model = make_model()
    procs, workers = [], []
    try:
        for k, layers in enumerate(("0-1", "2-3")):
            address = "tcp://127.0.0.1:%d" % free_port()
            log = os.path.join(tmp, "worker-%d.log" % k)
            procs.append(subprocess.Popen([os.path.join(BUILD, "worker/pico-worker"), "-m", model, "--layers", layers,
                                           "--listen", address, "-t", "1"], stderr=open(log, "w")))
            wait_log(log, "listening on", procs[-1], "pico-worker %d" % k)
            workers += ["--worker", address]
        log = os.path.join(tmp, "coord.log")
        procs.append(subprocess.Popen([os.path.join(BUILD, "coordinator/pico-coord"), "-m", model] + workers +
                                      ["--port", "0", "-c", "512"], stderr=open(log, "w")))
        port = wait_log(log, r"listening on http://[^:]+:(\d+)", procs[-1], "pico-coord").group(1)
        csv_path, plots = os.path.join(tmp, "short.csv"), os.path.join(tmp, "plots")
        r = subprocess.run([os.path.join(ROOT, "scripts/bench-cluster"), "--url", "http://127.0.0.1:" + port, "--short",
                            "--label", "local 2 stages", "--csv", csv_path, "--plots", plots], timeout=90)
        check(r.returncode == 0, "bench-cluster --short exits 0 (%d)" % r.returncode)
        check_csv(csv_path, "local")
        check_pngs(plots, "local")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(20)


def namespaces(tag):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("pemu-%s-" % tag)]


def processes_using(path):
    """Pids whose command line names `path` (the test's own model or temp dir)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if path in cmdline:
            pids.append(int(pid))
    return pids


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def check_gone(tag, model, links_before, label):
    check(namespaces(tag) == [], "%s: no namespace pemu-%s-* left (%s)" % (label, tag, namespaces(tag)))
    check(processes_using(model) == [], "%s: no process of the cluster left (%s)" % (label, processes_using(model)))
    left = [d for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/cpu") if os.path.isdir(base)
            for d in os.listdir(base) if d.startswith("pemu-%s-" % tag)]
    check(left == [], "%s: no cgroup left (%s)" % (label, left))
    new_links = root_links() - links_before
    check(not any(name.startswith(("w0", "w1", "coord", "eth0", "br0", "probe")) for name in new_links),
          "%s: no interface of it in the root namespace (%s)" % (label, sorted(new_links)))


def test_emulated():
    probe = subprocess.run(["ip", "netns", "add", "pemu-probe%d" % os.getpid()], capture_output=True, text=True)
    if probe.returncode != 0:
        print("SKIPPED: network namespaces cannot be made here: " + probe.stderr.strip())
        sys.exit(SKIP)
    subprocess.run(["ip", "netns", "del", "pemu-probe%d" % os.getpid()])
    model = make_model()
    script = os.path.join(ROOT, "scripts/emulated-cluster")
    env = dict(os.environ, PICO_BUILD=BUILD)
    links_before = root_links()

    # 1. bench-cluster --short inside, over a Wi-Fi node (half a core) and a 1 GbE node.
    tag = "t%d" % (os.getpid() % 10000)
    csv_path, plots = os.path.join(tmp, "emu.csv"), os.path.join(tmp, "plots")
    r = subprocess.run([script, "-m", model, "--tag", tag, "--port", "0", "--coord-link", "1gbe",
                        "--node", "pi:cores=0:threads=1:cpu=0.5:link=wifi", "--node", "pc:cores=1:link=1gbe",
                        "--coord-arg=-c", "--coord-arg=512", "--",
                        os.path.join(ROOT, "scripts/bench-cluster"), "--short", "--label", "emulated",
                        "--csv", csv_path, "--plots", plots], env=env, capture_output=True, text=True, timeout=100)
    print(r.stderr)
    if r.returncode == SKIP:
        print("SKIPPED: emulated-cluster could not make namespaces")
        sys.exit(SKIP)
    check(r.returncode == 0, "emulated-cluster -- bench-cluster --short exits 0 (%d)" % r.returncode)
    check_csv(csv_path, "emulated")
    check_pngs(plots, "emulated")
    shaping = re.search(r"shaping links with (\w+)", r.stderr)
    check(shaping is not None and shaping.group(1) in ("netem", "relay"), "links shaped with netem or relay")
    kind = {"netem": "netem", "relay": "tbf"}.get(shaping.group(1) if shaping else "", "?")
    for node in ("pi (link wifi)", "pc (link 1gbe)", "coordinator (link 1gbe)"):
        m = re.search(re.escape(node) + r": node->switch (\d+) bytes, switch->node (\d+) bytes, qdisc (\w+)", r.stderr)
        check(m is not None and int(m.group(1)) > 10000 and int(m.group(2)) > 10000 and m.group(3) == kind,
              "the traffic of %s went through its %s-shaped link (%s)" % (node, kind, m.group(0) if m else None))
    check_gone(tag, model, links_before, "after the command")

    # 2. Interactive, with the delaying relays; a request; SIGINT; nothing left.
    # Node b runs on Vulkan device 0 where there is one (lavapipe on any CPU).
    tag2 = "u%d" % (os.getpid() % 10000)
    devices = subprocess.run([PICO, "inspect", "--devices"], capture_output=True, text=True).stdout
    b_backend = "vulkan/0" if re.search(r"^vulkan 0: .*, usable$", devices, re.M) else "cpu"
    proc = subprocess.Popen([script, "-m", model, "--tag", tag2, "--port", "0", "--shaping", "relay",
                             "--node", "a:link=wifi:layers=0-2:backend=cpu",
                             "--node", "b:link=5ms/1ms/50mbit:layers=3-3:backend=" + b_backend],
                            env=env, stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "emu2.log"), "w"), text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        line = proc.stdout.readline() if ready else ""
        m = re.match(r"PICO_URL=(\S+) NETNS=(\S+)", line)
        check(m is not None, "interactive emulated-cluster prints its URL (%r)" % line)
        if m:
            check(len(namespaces(tag2)) == 4, "hub, coordinator and 2 worker namespaces exist")
            client = ("import json,sys,urllib.request;"
                      "r=urllib.request.urlopen(urllib.request.Request(sys.argv[1]+'/completion',"
                      "json.dumps({'prompt':'Hello','n_predict':4,'ignore_eos':True}).encode(),"
                      "{'Content-Type':'application/json'}),timeout=60);"
                      "print(json.load(r)['timings']['predicted_n'])")
            out = subprocess.run(["ip", "netns", "exec", m.group(2), sys.executable, "-c", client, m.group(1)],
                                 capture_output=True, text=True, timeout=60)
            check(out.stdout.strip() == "4", "a request through the relayed links generated 4 tokens (%r %r)"
                  % (out.stdout, out.stderr[-300:]))
            blocked = subprocess.run([sys.executable, "-c", "import urllib.request,sys;"
                                      "urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)", m.group(1)],
                                     capture_output=True)
            check(blocked.returncode != 0, "the coordinator is not reachable from the root namespace")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
        check(code == 130, "SIGINT stops it (exit %d)" % code)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = open(os.path.join(tmp, "emu2.log")).read()
    check(re.search(r"emulated-cluster: b: .*backend %s" % re.escape(b_backend), log) is not None,
          "node b's worker runs on backend %s" % b_backend)
    for node in ("a (link wifi)", "b (link 5ms/1ms/50mbit)"):
        m = re.search(re.escape(node) + r": .* qdisc (\w+), relay (\d+) bytes", log)
        check(m is not None and m.group(1) == "tbf" and int(m.group(2)) > 1000,
              "relay and tbf of %s carried the traffic (%s)" % (node, m.group(0) if m else None))
    check_gone(tag2, model, links_before, "after SIGINT")


def test_configs():
    """configs/*.toml: the keys pico-coord reads (coordinator/cluster_config.cpp), layer ranges that
    cover 0..N-1 in pipeline order without gap or overlap."""
    import tomllib
    directory = os.path.join(ROOT, "configs")
    files = sorted(f for f in os.listdir(directory) if f.endswith(".toml"))
    check(len(files) >= 4, "configs/ has the example files (%s)" % files)
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            config = tomllib.load(f)
        check(set(config) <= {"scheduler", "worker"}, "%s: only [scheduler] and [[worker]]" % name)
        scheduler = config.get("scheduler", {})
        check(set(scheduler) <= {"micro_batch", "max_batch_tokens", "activations", "chain_steps"} and
              scheduler.get("activations", "f32") in ("f32", "f16", "q8_0") and
              all(isinstance(scheduler.get(k, 1), int) and scheduler.get(k, 1) > 0
                  for k in ("micro_batch", "max_batch_tokens")) and
              isinstance(scheduler.get("chain_steps", 0), int) and scheduler.get("chain_steps", 0) >= 0,
              "%s: [scheduler] keys and values" % name)
        workers = config.get("worker", [])
        ranges = [tuple(map(int, w["layers"].split("-"))) for w in workers if "layers" in w]
        check(workers and all(re.match(r"^tcp://[^:]+:\d+$", w.get("address", "")) for w in workers),
              "%s: every worker has a tcp address" % name)
        check(len(ranges) == len(workers) and ranges[0][0] == 0 and all(a <= b for a, b in ranges) and
              all(ranges[i + 1][0] == ranges[i][1] + 1 for i in range(len(ranges) - 1)),
              "%s: layer ranges contiguous from 0 (%s)" % (name, ranges))


def test_pipeline():
    model = make_model()
    env = dict(os.environ, PICO_BUILD=BUILD, TMPDIR=tmp)
    run = subprocess.run([os.path.join(ROOT, "scripts/bench-pipeline"), "-m", model, "--n1", "4", "--n2", "24",
                          "--repeat", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=200)
    out = run.stdout
    print(out, flush=True)
    check(run.returncode == 0, "bench-pipeline exits 0")

    def number(pattern):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None
    # Rates are differences of two short runs: on a loaded machine they may come out
    # anything, even negative; what is checked is that each measure is there.
    rate = r"(-?[\d.]+|nan|inf)"
    for label, pattern in (("single node", r"single node, 1 thread: +%s tok/s" % rate),
                           ("2 stages", r"2 stages x 1 thread, 1 stream: +%s tok/s +ratio" % rate),
                           ("without chains", r"the same without greedy chains: +%s tok/s +ratio" % rate),
                           ("8 streams", r"2 stages, 8 streams aggregate: +%s tok/s +ratio" % rate),
                           ("median interval", r"median time between two tokens: single node +([\d.]+) us")):
        value = number(pattern)
        check(value is not None, "bench-pipeline prints %s (%s)" % (label, value))
    chained = re.search(r"^2 stages, per step: logits transfer .*, (\d+) of (\d+) steps chained", out, re.M)
    unchained = re.search(r"^2 stages without chains, per step: logits transfer .*, (\d+) of", out, re.M)
    check(chained is not None and int(chained.group(1)) > 0, "the greedy stream ran in chains")
    check(unchained is not None and int(unchained.group(1)) == 0, "--chain-steps 0 ran no chain")
    check(re.search(r"one hop, embd 2048 F32, ipc: [\d.]+ us", out) is not None, "one hop measured")


def test_placement():
    model = make_model()
    r = subprocess.run([os.path.join(ROOT, "scripts/bench-placement"), "-m", model, "--node", "a:cores=0:cpu=1",
                        "--node", "b:cores=1:cpu=0.5", "--streams", "2", "-p", "8", "-g", "8"],
                       env=dict(os.environ, PICO_BUILD=BUILD), capture_output=True, text=True, timeout=200)
    print(r.stdout, r.stderr)
    if r.returncode == SKIP:
        print("SKIPPED: network namespaces cannot be made here")
        sys.exit(SKIP)
    check(r.returncode == 0, "bench-placement exits 0 (%d)" % r.returncode)
    rows = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(planned-latency|planned-throughput|bytes|equal) +((?:\d+-\d+ ?)+) +(\d+) +([\d.]+) +([\d.]+) *(.*)$",
                     line)
        if m:
            rows[(m.group(1), int(m.group(3)))] = m
    for key in (("planned-latency", 1), ("bytes", 1), ("equal", 1), ("planned-throughput", 2), ("bytes", 2),
                ("equal", 2)):
        m = rows.get(key)
        check(m is not None and float(m.group(4)) > 0, "%s at %d stream(s): a positive tok/s" % key)
        if m:
            ranges = [tuple(map(int, x.split("-"))) for x in m.group(2).split()]
            covered = ranges[0][0] == 0 and ranges[-1][1] == 3 and all(
                b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))
            check(covered, "%s: layers %s cover 0-3" % (key[0], m.group(2).strip()))
            decode = re.match(r"([\d.]+) ", m.group(6))
            check(decode is not None and float(decode.group(1)) > 0,
                  "%s at %d stream(s): a positive decode tok/s (%s)" % (key + (m.group(6),)))
            if key[0].startswith("planned"):
                check(len(re.findall(r"[\d.]+ \([+-]\d+ %\)", m.group(6))) == 2,
                      "%s: the prediction against tok/s and against decode (%s)" % (key[0], m.group(6)))


def main():
    try:
        {"local": test_local, "emulated": test_emulated, "configs": test_configs, "pipeline": test_pipeline,
         "placement": test_placement}[MODE]()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("%d checks failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
