"""A memory_stats() dict shaped like torch's (the keys the protocol names, plus one it does not)."""

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
