"""Self-test only (gpu-check --device cpu): gives the gpumon client allocator numbers on a machine
without CUDA. The process's resident memory stands in for allocated memory, so a trainer that
keeps tensors grows like a leak would on a GPU; the device is the one the fake NVML library lists
(GPU_CHECK_SIM_UUID) with GPU_CHECK_SIM_TOTAL bytes. Loaded through PYTHONPATH by the driver."""

import os

if os.environ.get("GPU_CHECK_SIM") == "1":
    try:
        from gpumon_client.stats import StatsSource
        from gpumon_client.testing import use_source

        class RssSource(StatsSource):
            def __init__(self):
                self.total = int(os.environ.get("GPU_CHECK_SIM_TOTAL", 16 << 30))
                self.peak = 0
                self.page = os.sysconf("SC_PAGE_SIZE")

            def _rss(self):
                with open("/proc/self/statm") as f:
                    return int(f.read().split()[1]) * self.page

            def device_info(self):
                return {"cuda_device": 0, "gpu_uuid": os.environ.get("GPU_CHECK_SIM_UUID") or None, "torch": "cpu-sim"}

            def memory_stats(self):
                rss = self._rss()
                self.peak = max(self.peak, rss)
                reserved = (rss + (2 << 20) - 1) // (2 << 20) * (2 << 20)
                return {
                    "allocated_bytes.all.current": rss,
                    "allocated_bytes.all.peak": self.peak,
                    "reserved_bytes.all.current": reserved,
                    "active_bytes.all.current": rss,
                    "num_alloc_retries": 0,
                    "num_ooms": 0,
                }

            def mem_get_info(self):
                return (max(0, self.total - self._rss()), self.total)

        use_source(RssSource())
    except Exception as exc:  # the self-test then fails visibly: no sessions
        import sys

        sys.stderr.write("gpu-check sim: could not install the simulated source: %r\n" % (exc,))
