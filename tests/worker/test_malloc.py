"""worker/malloc.py: the heap a worker keeps between steps, and the idle spell that hands it
back."""
from __future__ import annotations

import subprocess
import sys

from worker.malloc import IdleTrim

# In a fresh interpreter (mallopt's settings hold for the whole process): a 96 MB tensor,
# over glibc's largest mmap threshold, freed; its pages stay the process's until trim.
CHILD = """
import torch
from worker.malloc import keep_heap, trim
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
keep = keep_heap()
before = rss_mb()
x = torch.ones(24 << 20)
del x
kept = rss_mb() - before
trim()
print(keep, round(kept), round(rss_mb() - before))
"""


def test_a_step_sized_tensor_freed_stays_in_the_heap_until_trim():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    took, kept, after_trim = out[0] == "True", int(out[1]), int(out[2])
    assert took
    assert kept >= 90, out          # mmap'd, it would have gone back at once
    assert after_trim <= 20, out    # trim hands the free pages back


def test_idle_trim_trims_once_after_steps_when_nothing_comes():
    trims, polled = [], []

    def poll(ms, came):
        polled.append(ms)
        return came

    idle = IdleTrim(idle_s=0.5, trim_fn=lambda: trims.append(1) or True)
    idle.wait(lambda ms: poll(ms, False))
    assert trims == [] and polled == []          # no step yet: nothing to hand back, no wait
    idle.step_ran()
    idle.wait(lambda ms: poll(ms, True))
    assert trims == [] and polled == [500]       # the next batch came in time: kept
    idle.wait(lambda ms: poll(ms, False))
    assert trims == [1]                          # idle: handed back
    idle.wait(lambda ms: poll(ms, False))
    assert trims == [1] and len(polled) == 2     # once, until another step runs
