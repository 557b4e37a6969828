"""A minimal stand-in for the parts of torch the client touches, injected as sys.modules['torch']."""

import types

STATS = {
    "allocated_bytes.all.current": 21474836480,
    "allocated_bytes.all.peak": 30064771072,
    "allocated_bytes.large_pool.current": 21000000000,
    "reserved_bytes.all.current": 32212254720,
    "active_bytes.all.current": 21474836480,
    "inactive_split_bytes.all.current": 268435456,
    "requested_bytes.all.current": 21400000000,
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "num_sync_all_streams": 0,
    "num_device_alloc": 120,
    "num_device_free": 3,
}


class FakeUUID:
    """Like torch's _CUDAuuid: raw bytes, and a str() without NVML's "GPU-" prefix."""

    bytes = bytes(range(0x10, 0x20))

    def __str__(self):
        h = self.bytes.hex()
        return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


class FakeOptimizer:
    def __init__(self, torch):
        self._torch = torch

    def step(self):
        for hook in list(self._torch.optim.optimizer._hooks.values()):
            hook(self, (), {})


def make():
    torch = types.ModuleType("torch")
    torch.__version__ = "2.5.1+fake"

    optimizer = types.ModuleType("torch.optim.optimizer")
    optimizer._hooks = {}

    class Handle:
        def __init__(self, key):
            self.key = key

        def remove(self):
            optimizer._hooks.pop(self.key, None)

    def register_optimizer_step_post_hook(hook):
        key = object()
        optimizer._hooks[key] = hook
        return Handle(key)

    optimizer.register_optimizer_step_post_hook = register_optimizer_step_post_hook
    optim = types.ModuleType("torch.optim")
    optim.optimizer = optimizer
    torch.optim = optim

    cuda = types.ModuleType("torch.cuda")
    cuda.initialized = True
    cuda.device = 0
    cuda.stats = dict(STATS)
    cuda.free_total = (47244640256, 85520809984)
    cuda.queued = []
    cuda.stats_calls = 0
    cuda.fail_stats = False
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: cuda.initialized
    cuda.current_device = lambda: cuda.device

    def memory_stats(device=None):
        cuda.stats_calls += 1
        if cuda.fail_stats:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return dict(cuda.stats)

    cuda.memory_stats = memory_stats
    cuda.mem_get_info = lambda device=None: cuda.free_total
    cuda.get_device_properties = lambda i: types.SimpleNamespace(name="Fake GPU", uuid=FakeUUID())
    cuda.get_allocator_backend = lambda: "native"

    def _lazy_call(fn, **kwargs):
        if cuda.initialized:
            fn()
        else:
            cuda.queued.append(fn)

    def lazy_init():
        cuda.initialized = True
        for fn in cuda.queued:
            fn()
        cuda.queued.clear()

    cuda._lazy_call = _lazy_call
    cuda.lazy_init = lazy_init
    torch.cuda = cuda

    C = types.ModuleType("torch._C")
    C.oom_observers = []
    C._cuda_attach_out_of_memory_observer = C.oom_observers.append
    torch._C = C

    torch.Optimizer = lambda: FakeOptimizer(torch)
    return torch


def raise_oom(torch, alloc=2 * 1024**3, free=100 * 1024**2, device=0):
    """What the caching allocator does on an OOM: call each observer, then raise."""
    for obs in torch._C.oom_observers:
        obs(device, alloc, 32212254720, free)
