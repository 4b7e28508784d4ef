#!/usr/bin/env python3
"""Worker profiles and `pico plan` with real pico-worker processes on loopback.

  placement_test.py BUILD_DIR

- `pico-worker --profile` measures, prints each kind of layer and the head, and writes
  the profile cache ($PICO_CACHE_DIR); a worker started later reads it instead of
  measuring; a corrupt cache file is measured anew, with a warning, and replaced.
- `pico plan --json` (the links between workers measured by the workers) on a
  cluster of two workers whose memory (cluster.toml `memory`)
  holds neither the whole model, one that holds no layer, and one that does not answer:
  the two are placed on ranges that tile the model within their memory, the others are
  left out saying why; the throughput objective plans a batch of --concurrency tokens
  (the one lane, no standby at every stage, takes every stream); a bad objective is
  refused.
- `--layers auto`: two workers that wait for their layers are placed and assigned by
  pico-coord (within the config's memory), load their ranges and serve: the greedy
  tokens equal the single node's; a worker with fixed layers beside one waiting is
  placed with them (or left out), the waiting one takes the rest: the same tokens;
  four workers, none holding the whole model, placed for throughput: two stand by,
  one at each stage with its range, and form a second lane: the same tokens.
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import Processes, free_port  # noqa: E402

build = sys.argv[1]
pico = os.path.join(build, "tools/pico/pico")
worker = os.path.join(build, "worker/pico-worker")
procs = Processes("pico-placement-")
env = dict(os.environ, PICO_CACHE_DIR=os.path.join(procs.tmp, "cache"))


def run(args, expect_ok=True):
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    if (r.returncode == 0) != expect_ok:
        procs.fail("%s: exit %d\n%s\n%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
    return r


def start_auto_worker(port, log):
    """A worker started with --layers auto, once it waits for its range."""
    p = subprocess.Popen([worker, "-m", model, "--layers", "auto", "--listen", "tcp://127.0.0.1:%d" % port, "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(procs.tmp, log), "w"), env=env)
    procs.procs.append(p)
    procs.wait_log(log, "waits for its range", p)
    return p


def memory_config(name, ports):
    """A cluster.toml of these workers, 45 MiB each (none holds the whole model)."""
    path = os.path.join(procs.tmp, name)
    with open(path, "w") as f:
        for port in ports:
            f.write('[[worker]]\naddress = "tcp://127.0.0.1:%d"\nmemory = "45M"\n' % port)
    return path


def start_worker(port, log, extra=()):
    p = subprocess.Popen([worker, "-m", model, "--listen", "tcp://127.0.0.1:%d" % port, *extra],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(procs.tmp, log), "w"), env=env)
    procs.procs.append(p)
    procs.wait_log(log, "listening on", p)
    return p


try:
    # 6 layers of ~2.9 MB, embeddings and head of ~31 MiB each (F32): 77 MiB in all.
    model = os.path.join(procs.tmp, "m.gguf")
    run([pico, "mkmodel", "--layers", "6", "--embd", "256", "--ff", "512", "-o", model])

    out = run([worker, "-m", model, "--profile", "-t", "2"]).stdout
    for needle in ("ms per token", "decode", "batch 8", "batch 64", "\n0-5 ", "\nhead ", "memory offered"):
        if needle not in out:
            procs.fail("--profile printed no '%s':\n%s" % (needle.strip(), out))
    cached = glob.glob(os.path.join(env["PICO_CACHE_DIR"], "profiles", "*-cpu-*-t2-b64.json"))
    if len(cached) != 1:
        procs.fail("no profile cache file for 2 threads: %s" % glob.glob(env["PICO_CACHE_DIR"] + "/**", recursive=True))
    profile = json.load(open(cached[0]))
    if len(profile["layers"]) != 6 or profile["batch"] != 64:
        procs.fail("the cached profile has %d layers, batch %s" % (len(profile["layers"]), profile["batch"]))

    port_a, port_b, port_c, port_dead = free_port(), free_port(), free_port(), free_port()
    start_worker(port_a, "a.log", ["-t", "2", "--layers", "0-2"])
    if "profile from" not in procs.read_log("a.log"):
        procs.fail("worker a measured again though the cache holds its profile")
    # A corrupt cache: measured anew, with a warning naming the file, and rewritten.
    with open(cached[0], "w") as f:
        f.write('{"version": 2, "layers": [[0.1, -1]]}')
    start_worker(port_b, "b.log", ["-t", "2"])
    log_b = procs.read_log("b.log")
    if "measuring anew" not in log_b or "kinds of layer measured" not in log_b:
        procs.fail("worker b did not measure anew over a corrupt cache:\n" + log_b)
    if len(json.load(open(cached[0]))["layers"]) != 6:
        procs.fail("the corrupt cache file was not replaced")
    start_worker(port_c, "c.log", ["-t", "1"])

    config = os.path.join(procs.tmp, "cluster.toml")
    with open(config, "w") as f:
        f.write('[[worker]]\naddress = "tcp://127.0.0.1:%d"\nmemory = "45M"\n' % port_a)
        f.write('[[worker]]\naddress = "tcp://127.0.0.1:%d"\nmemory = "1M"\n' % port_c)
        f.write('[[worker]]\naddress = "tcp://127.0.0.1:%d"\nmemory = "45M"\n' % port_b)
        f.write('[[worker]]\naddress = "tcp://127.0.0.1:%d"\n' % port_dead)
    plan = json.loads(run([pico, "plan", "-m", model, "--config", config, "--json"]).stdout)
    stages = plan["stages"]
    if plan["objective"] != "latency" or plan["batch"] != 1 or len(stages) != 2:
        procs.fail("latency plan: %s" % json.dumps(plan, indent=1))
    if {s["worker"] for s in stages} != {"tcp://127.0.0.1:%d" % port_a, "tcp://127.0.0.1:%d" % port_b}:
        procs.fail("the plan does not use exactly a and b: %s" % json.dumps(stages, indent=1))
    expected_first = 0
    for s in stages:
        if s["first_layer"] != expected_first or s["last_layer"] < s["first_layer"]:
            procs.fail("stages do not tile the layers: %s" % json.dumps(stages, indent=1))
        expected_first = s["last_layer"] + 1
        if s["memory_bytes"] > 45 << 20 or s["offered_bytes"] != 45 << 20:
            procs.fail("a stage beyond its worker's memory: %s" % json.dumps(s))
        if not s["tokens_per_second"] > 0:
            procs.fail("no predicted speed: %s" % json.dumps(s))
    if expected_first != 6 or not plan["tokens_per_second"] > 0:
        procs.fail("the plan does not cover 6 layers: %s" % json.dumps(plan, indent=1))
    # Every link between the placeable workers measured by the workers themselves.
    for src, dst in ((port_a, port_b), (port_b, port_a), (port_a, port_c)):
        key = "tcp://127.0.0.1:%d -> tcp://127.0.0.1:%d" % (src, dst)
        link = plan.get("links", {}).get(key)
        if not link or not link["bytes_per_second"] > 0 or not link["latency_seconds"] >= 0:
            procs.fail("link %s not measured: %s" % (key, json.dumps(plan["links"], indent=1)))
    left = plan["left_out"]
    if "holds no layer" not in left.get("tcp://127.0.0.1:%d" % port_c, ""):
        procs.fail("worker c (1M) not left out as holding no layer: %s" % left)
    if "no answer to hello" not in left.get("tcp://127.0.0.1:%d" % port_dead, ""):
        procs.fail("the dead worker not left out as not answering: %s" % left)

    plan = json.loads(run([pico, "plan", "-m", model, "--config", config, "--json", "--objective", "throughput",
                           "--concurrency", "16", "--parallel", "4"]).stdout)
    if plan["objective"] != "throughput" or plan["batch"] != 16 or plan["parallel"] != 4:
        procs.fail("throughput plan: %s" % json.dumps(plan, indent=1))
    # No standby at every stage (c holds no layer): the chain is the one lane, with every
    # stream, at the chain's predicted speed.
    lanes = plan["lanes"]
    if len(lanes) != 1 or [x["worker"] for x in lanes[0]["stages"]] != [x["worker"] for x in plan["stages"]] or \
            lanes[0]["sequences"] != 16 or abs(plan["lanes_tokens_per_second"] - plan["tokens_per_second"]) > 1e-6 * \
            plan["tokens_per_second"]:
        procs.fail("throughput plan's lanes: %s" % json.dumps(plan, indent=1))
    text = run([pico, "plan", "-m", model, "--config", config]).stdout
    for needle in ("predicted:", "pico-worker --layers, in order:", "left out tcp://127.0.0.1:%d" % port_c):
        if needle not in text:
            procs.fail("the printed plan has no '%s':\n%s" % (needle, text))
    bad = run([pico, "plan", "-m", model, "--config", config, "--objective", "fastest"], expect_ok=False)
    if "fastest" not in bad.stderr:
        procs.fail("a bad objective is not named: " + bad.stderr)

    # --layers auto: pico-coord places and assigns.
    coord = os.path.join(build, "coordinator/pico-coord")
    auto_a, auto_b = free_port(), free_port()
    start_auto_worker(auto_a, "auto-a.log")
    start_auto_worker(auto_b, "auto-b.log")
    auto_config = memory_config("auto.toml", (auto_a, auto_b))
    prompt = ["-p", "Once upon a time", "-n", "12", "--temp", "0", "--ctx", "256", "--parallel", "2"]
    single = run([coord, "-m", model, *prompt]).stdout
    auto = run([coord, "-m", model, "--config", auto_config, *prompt])
    if auto.stdout != single or not single:
        procs.fail("auto-placed cluster: %r, single node: %r\n%s" % (auto.stdout, single, auto.stderr))
    ranges = []
    for log in ("auto-a.log", "auto-b.log"):
        m = procs.wait_log(log, r"assigned layers (\d+)-(\d+)", procs.procs[-1])
        ranges.append((int(m.group(1)), int(m.group(2))))
        procs.wait_log(log, "listening on", procs.procs[-1])
    ranges.sort()
    if ranges[0][0] != 0 or ranges[1][1] != 5 or ranges[0][1] + 1 != ranges[1][0]:
        procs.fail("assigned ranges do not tile 0-5: %s" % ranges)
    if "placement for latency" not in auto.stderr:
        procs.fail("pico-coord does not log its placement:\n" + auto.stderr)
    # Four workers, two of them waiting for their layers, none holding the whole model:
    # the throughput placement leaves two standing by, one at each stage (assigned that
    # stage's range), and with --replicas spread (the default) they form a second lane.
    auto_d, auto_e = free_port(), free_port()
    start_auto_worker(auto_d, "auto-d.log")
    start_auto_worker(auto_e, "auto-e.log")
    four_config = memory_config("four.toml", (auto_a, auto_b, auto_d, auto_e))
    four = run([coord, "-m", model, "--config", four_config, "--objective", "throughput", *prompt])
    if four.stdout != single:
        procs.fail("four auto-placed workers: %r, single node: %r\n%s" % (four.stdout, single, four.stderr))
    for needle, count in (("stands by for stage", 2), ("with the lanes the standbys form: 2 lane(s)", 1),
                          ("run the layers as a chain of their own", 1)):
        if four.stderr.count(needle) != count:
            procs.fail("four auto-placed workers: '%s' not logged %d time(s):\n%s" % (needle, count, four.stderr))
    for log in ("auto-d.log", "auto-e.log"):
        procs.wait_log(log, r"assigned layers (\d+)-(\d+)", procs.procs[-1])
    print("four auto-placed workers: two lanes")

    # One worker with fixed layers 0-2 beside one waiting for its layers: placed
    # together, the fixed one with exactly its layers or left out; the same tokens.
    auto_c = free_port()
    p = start_auto_worker(auto_c, "auto-c.log")
    mixed = run([coord, "-m", model, "--worker", "tcp://127.0.0.1:%d" % auto_c, "--worker",
                 "tcp://127.0.0.1:%d" % port_a, *prompt])
    if mixed.stdout != single:
        procs.fail("a mixed auto / fixed cluster: %r, single node: %r\n%s" % (mixed.stdout, single, mixed.stderr))
    m = procs.wait_log("auto-c.log", r"assigned layers (\d+)-(\d+)", p)
    assigned = (int(m.group(1)), int(m.group(2)))
    fixed_placed = "tcp://127.0.0.1:%d takes layers 0-2" % port_a in mixed.stderr
    if assigned != ((3, 5) if fixed_placed else (0, 5)):
        procs.fail("mixed cluster: the waiting worker took layers %s, the fixed one %s placed:\n%s" %
                   (assigned, "is" if fixed_placed else "is not", mixed.stderr))
    print("mixed cluster: the waiting worker takes layers %d-%d, the fixed one (0-2) %s" %
          (assigned[0], assigned[1], "beside it" if fixed_placed else "left out"))
    print("ok")
finally:
    procs.close()
