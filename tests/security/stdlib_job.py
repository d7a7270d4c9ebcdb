"""A GPU job any user may run for the multi-user tests: the machine's python3 with the
standard library alone, holding 1 GiB on GPU 0 of examples/idle-2gpu.json for
argv[1] seconds, registered with the simulated driver as gpuwarden.sim.job does."""

from __future__ import annotations

JOB_PY = "/usr/bin/python3"  # one every user may run (the job needs the stdlib only)

# As gpuwarden.sim.job registers what it holds with the simulated driver (sim/registry.py),
# with the standard library alone: 1 GiB on GPU 0 of idle-2gpu.json, for argv[1] seconds.
JOB = """
import json, os, sys, time
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
btime = next(int(l.split()[1]) for l in open("/proc/stat") if l.startswith("btime"))
start = btime + int(stat[19]) / os.sysconf("SC_CLK_TCK")
alloc = os.path.join(os.environ["GPUWARDEN_SIM_STATE"], "alloc", f"{os.getpid()}.json")
with open(alloc, "w") as f:
    json.dump({"pid": os.getpid(), "start_time": start, "leak": False, "command": "job",
               "gpus": {"GPU-00000000-0000-4000-8000-000000000000": 1 << 30}}, f)
time.sleep(float(sys.argv[1]))
os.unlink(alloc)
"""
