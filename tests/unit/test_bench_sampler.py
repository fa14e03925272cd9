"""The bench's process sampler counts a supervisor's child, where the worker's work is done."""

from __future__ import annotations

import subprocess
import sys
import time

from streams.bench import _ProcessSampler


def test_a_supervisors_child_is_sampled_for_rss_and_cpu() -> None:
    child = (
        "import time; x = bytearray(60_000_000); t = time.process_time()\n"
        "while time.process_time() - t < 0.4: pass\n"
        "time.sleep(30)"
    )
    # a small parent (the shell) whose child holds 60 MB and burns 0.4 s of CPU
    parent = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{child}"; true'])
    try:
        sampler = _ProcessSampler([parent.pid])
        # (the suite runs this niced beside three stacks: the child may wait long for a core)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sampler.sample()
            if sampler.rss_mb and sampler.rss_mb[-1] > 55 and sampler.cpu_s() >= 0.3:
                break
            time.sleep(0.1)
        assert max(sampler.rss_mb) > 55  # the child's, not the shell's few MB
        assert sampler.cpu_s() >= 0.3
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)  # the child first
        parent.kill()
        parent.wait()
