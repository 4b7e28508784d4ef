#!/usr/bin/env python3
"""A worker's profile under a CPU quota measures its sustained speed, not its burst.

  profile_quota_test.py BUILD_DIR

`pico-worker --profile -t 1` runs once freely and once in a cgroup that lets it use a
tenth of a CPU in periods of 100 ms (cgroup v2 cpu.max, else v1 cfs quota). A
forward of the test model takes well under the 10 ms the quota gives each period, so
a run alone mostly goes at full speed and a later one waits: timed by the wall clock
alone the profile under the quota came out 2 to 4 times the free one. Each time now
counts at least the CPU time it took over the quota: the profile under the quota is
6 times the free one at least (10 in theory; 13 to 16 measured), its log names the
quota, and its cache file is its own (-q0.100).
Exits 77 (skipped) where no CPU cgroup can be made (not root, no cpu controller).
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import Processes  # noqa: E402

build = sys.argv[1]
pico = os.path.join(build, "tools/pico/pico")
worker = os.path.join(build, "worker/pico-worker")
procs = Processes("pico-profile-quota-")
env = dict(os.environ, PICO_CACHE_DIR=os.path.join(procs.tmp, "cache"))
SKIP = 77


def make_cgroup(name, quota_us, period_us):
    """The directory of a new CPU cgroup, or None with the reason printed."""
    v2 = "/sys/fs/cgroup/cgroup.controllers"
    try:
        if os.path.exists(v2) and "cpu" in open(v2).read().split():
            path = "/sys/fs/cgroup/" + name
            os.mkdir(path)
            with open(path + "/cpu.max", "w") as f:
                f.write("%d %d" % (quota_us, period_us))
        elif os.path.isdir("/sys/fs/cgroup/cpu"):
            path = "/sys/fs/cgroup/cpu/" + name
            os.mkdir(path)
            with open(path + "/cpu.cfs_period_us", "w") as f:
                f.write(str(period_us))
            with open(path + "/cpu.cfs_quota_us", "w") as f:
                f.write(str(quota_us))
        else:
            print("SKIPPED: no cgroup cpu controller")
            return None
    except OSError as e:
        print("SKIPPED: cannot make a CPU cgroup: %s" % e)
        return None
    return path


def total(profile):
    """Every measure of a profile added up: each layer's and the head's."""
    s = 0.0
    for decode, per_batch in profile["layers"] + [profile["head"]]:
        s += decode + sum(per_batch)
    return s


cgroup = make_cgroup("pico-profile-quota-%d" % os.getpid(), 10000, 100000)
if cgroup is None:
    procs.close()
    sys.exit(SKIP)
try:
    model = os.path.join(procs.tmp, "m.gguf")
    subprocess.run([pico, "mkmodel", "--layers", "2", "--embd", "256", "--ff", "512", "-o", model], check=True,
                   capture_output=True, env=env, timeout=120)
    free = subprocess.run([worker, "-m", model, "--profile", "-t", "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    if free.returncode != 0 or "CPU quota" in free.stderr:
        procs.fail("the free profile: exit %d\n%s" % (free.returncode, free.stderr))
    quoted = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, worker, "-m", model,
                             "--profile", "-t", "1"], capture_output=True, text=True, env=env, timeout=300)
    if quoted.returncode != 0 or "CPU quota, 0.100 CPUs" not in quoted.stderr:
        procs.fail("the profile under the quota: exit %d, the quota not named\n%s" % (quoted.returncode, quoted.stderr))
    free_file = glob.glob(os.path.join(env["PICO_CACHE_DIR"], "profiles", "*-t1-b64.json"))
    quoted_file = glob.glob(os.path.join(env["PICO_CACHE_DIR"], "profiles", "*-t1-b64-q0.100.json"))
    if len(free_file) != 1 or len(quoted_file) != 1:
        procs.fail("the profile cache files: %s" % os.listdir(os.path.join(env["PICO_CACHE_DIR"], "profiles")))
    free_total, quoted_total = total(json.load(open(free_file[0]))), total(json.load(open(quoted_file[0])))
    ratio = quoted_total / free_total
    print("profile times added up: %.4f s free, %.4f s under a tenth of a CPU: %.2f times" %
          (free_total, quoted_total, ratio))
    if ratio < 6:
        procs.fail("under a tenth of a CPU the profile is %.2f times the free one (expected 6 at least)" % ratio)
    print("ok")
finally:
    procs.close()
    os.rmdir(cgroup)
