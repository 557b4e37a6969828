//! The commented example config, written from `Config::default()`.

use super::{Config, LogFormat, DEFAULT_CONFIG_PATH};

/// The commented example config that `gpumon config` prints and the repo ships as
/// `gpumon.example.toml`. Values come from `Config::default()`, so they cannot drift.
pub fn example() -> String {
    let d = Config::default();
    format!(
        r#"# gpumon configuration. Precedence: this file < GPUMON_* environment < command-line flags.
# Default location: {DEFAULT_CONFIG_PATH}. Unknown keys are an error, and so is a GPUMON_*
# variable for a key that has no variable (those below without one are read only from here).

# HTTP address for /metrics, /api/v1/snapshot, /healthz and /readyz.  (GPUMON_LISTEN, --listen)
listen = "{listen}"

# Trainer ingest socket. Unset: /run/gpumon/ingest.sock as root, else
# $XDG_RUNTIME_DIR/gpumon/ingest.sock (the gpumon directory is created). A path set here must be
# in an existing directory. Removed when the daemon stops.  (GPUMON_SOCKET, --socket)
# socket = "/run/gpumon/ingest.sock"

# The NVML library, loaded at run time; a path or a name the dynamic loader finds.
# (GPUMON_NVML_LIB, --nvml-lib)
nvml_lib = "{nvml_lib}"

# The host's /proc, read for process names, users and containers. In a container, mount the
# host's /proc (e.g. at /host/proc) and point this at it.  (GPUMON_PROCFS, --procfs)
procfs = "{procfs}"

# The name this node goes by in the API, alerts and recorded traces (a job's first failure is
# named by it). Unset: the kernel's hostname.  (GPUMON_NODE_NAME, --node-name)
# node_name = "gpu-node-17"

# How often NVML is polled; a scrape never calls NVML itself.  (GPUMON_INTERVAL, --interval)
interval = "{interval}"

# Log output: "text" or "json".  (GPUMON_LOG_FORMAT, --log-format)
log_format = "{log_format}"

# Log filter: a level (trace, debug, info, warn, error, off) or directives like
# "info,gpumon::sources::ingest=debug"; a word that is not a level is an error.  (GPUMON_LOG_LEVEL, --log-level)
log_level = "{log_level}"

[history]
# Points kept per GPU, one per poll ({gpu_points} = an hour at 1s).
gpu_points = {gpu_points}

[ingest]
# Open trainer connections at most; past it a connection gets `too_many_connections`.
max_connections = {max_connections}
# Lines per second per connection (bursts of twice that); past it lines are dropped and the
# connection stays open, told how many with `rate_limited` (at most once a second). A trainer
# sends one line per optimizer step.
max_lines_per_second = {max_lines_per_second}
# Seconds a new connection has to send its hello before it is closed.
hello_timeout_seconds = {hello_timeout_seconds:?}
# Seconds a connection may send nothing after its hello before it is closed (a trainer sends a
# line per step, so one stepping once a minute never trips it).
idle_timeout_seconds = {idle_timeout_seconds:?}
# Open connections one user (uid) may hold, so that one user cannot take every slot.
max_connections_per_uid = {max_connections_per_uid}
# Slots of max_connections that connections without a hello may never take, so a trainer's
# hello always finds room (connections still waiting for theirs make way for newcomers).
reserved_connections = {reserved_connections}
# Bytes all connections together may buffer past their first 4 KiB (the 16 KiB reads of a burst,
# lines up to the 64 KiB cap). Past it a connection needing more waits, and one that has sat on
# an unfinished line for a second is closed (line_stalled) to make room.
max_line_buffer_bytes = {max_line_buffer_bytes}

[http]
# HTTP connections open at most (scrapers, the TUI, the API); one more is closed at once and
# counted. Keep it well under the open-file limit so the ingest socket always has room.
connection_limit = {connection_limit}
# Seconds a client has, from connecting (or from the first byte of a later request on the same
# connection), to send a complete request head; then it is closed (reason header_timeout).
header_timeout_seconds = {header_timeout_seconds:?}
# Seconds a keep-alive connection may sit between requests before it is closed.
keepalive_timeout_seconds = {keepalive_timeout_seconds:?}
# Request line plus headers, in bytes (at least 8192); a larger head is answered 431 and closed.
max_request_head_bytes = {max_request_head_bytes}
# At shutdown, seconds that requests in flight get to finish; then every connection is closed.
shutdown_grace_seconds = {shutdown_grace_seconds:?}
# TLS, basic auth and response headers for /metrics and the API, in the web config format of
# Prometheus' exporter-toolkit (the file node_exporter's --web.config.file reads). Reloaded when
# it changes and on SIGHUP. Unset: plain HTTP.  (GPUMON_WEB_CONFIG_FILE, --web.config.file)
# web_config_file = "/etc/gpumon/web.yml"

[record]
# Record each trainer session's lines as a trace file (hello first) for `gpumon analyze`.
# Unset: nothing is recorded. An absolute path here; --record-dir and GPUMON_RECORD_DIR may
# be relative to the current directory.  (GPUMON_RECORD_DIR, --record-dir)
# dir = "/var/lib/gpumon/traces"
# A trace past this size continues in a new part file, which starts with the hello again.
max_file_bytes = {max_file_bytes}
# The oldest finished traces are deleted to keep the directory under this size...
max_total_bytes = {max_total_bytes}
# ...and under this many trace files (a flood of short sessions leaves many small ones).
max_files = {max_files}

[detect]
# near_limit also fires when headroom at the step peak (device free + reserved - peak allocated)
# stays under this many bytes. Under an allocator cap (set_per_process_memory_fraction) the
# headroom is to the cap, and the margin is at most a tenth of the cap.
headroom_margin_bytes = {headroom_margin_bytes}
# A leak is reported once the per-step floor has grown by this share of the device's memory.
leak_materiality_ratio = {leak_materiality_ratio}
# How long a crash finding (trainer gone without bye) stays firing.
crash_hold = "{crash_hold}"
# A rank of a job (the sessions of one run: same job name and run_id) that fails within this
# long after the job's first failure is its consequence: a warning naming the first, not a page.
# torchrun tears the other ranks down within seconds; raise it past NCCL's timeout to cover
# ranks the NCCL watchdog takes down.
job_cascade = "{job_cascade}"
# NVML listing memory for a process that has exited (a zombie, or no process at all) this long
# raises orphaned_memory. Past the driver's own teardown of an exited process's context.
orphan_grace = "{orphan_grace}"

[attribution]
# When a leak finding goes pending or firing, ask the trainer (only clients that announce the
# `attribution` capability) to record allocation history for a short window and report which
# lines of its code allocate the growing memory; the leak finding then names them.
enabled = {attr_enabled}
# The window lasts this many steps at most (a fast leak gets fewer: about 32 MiB of growth, at
# least 20 steps)...
window_steps = {window_steps}
# ...or this many seconds, whichever comes first. A window unanswered after twice this plus a
# minute counts as failed.
window_seconds = {window_seconds:?}
# Allocation records torch keeps while recording (at most 100000; each holds a stack).
max_entries = {max_entries}
# Allocation sites reported, largest first (1 to 20).
top = {top}
# Seconds between two requests to the same trainer, at least.
cooldown_seconds = {cooldown_seconds:?}

[oom]
# When an OOM is likely (a near_limit finding fires, or a leak's forecast puts the OOM within
# arm_eta_seconds), ask the trainer (only clients that announce the `oom_history` capability) to
# keep allocation history recording, so the OOM, when it comes, is explained with its lines.
# Recording slows each step (about a fifth on a short H100 step): it is capped in time.
arm = {oom_arm}
# Arm when a leak's OOM forecast is within this many seconds.
arm_eta_seconds = {arm_eta_seconds:?}
# One arming lasts at most this many seconds (ended sooner when the risk has passed).
arm_seconds = {arm_seconds:?}
# Allocation records torch keeps while armed (at most 100000; each holds a stack).
max_entries = {oom_max_entries}
# For near_limit, after this many steps recorded the trainer reports what was live at the step's
# peak, by allocation site (0: not asked).
peak_after_steps = {peak_after_steps}
# Seconds between two armings of the same trainer, at least.
rearm_seconds = {rearm_seconds:?}

[alerts]
# Firing and resolved findings always go to the log. They can also go to:
# Alertmanager (v2 API), e.g. "http://127.0.0.1:9093".  (GPUMON_ALERTMANAGER_URL, --alertmanager-url)
# alertmanager_url = "http://127.0.0.1:9093"
# A JSON webhook (POST).  (GPUMON_WEBHOOK_URL, --webhook-url)
# webhook_url = "http://127.0.0.1:8080/gpumon"
# Firing findings are sent to Alertmanager again this often.
resend_interval = "{resend_interval}"

[kubernetes]
# GPU processes and trainer sessions in Kubernetes pods carry pod and namespace labels. The pod
# UID comes from the process's cgroup; names come from the kubelet's pods API at this URL, read
# again (at most every 30s) when a pod or container not seen before appears. `${{NAME}}` is taken
# from the environment. Unset: the pod label is the pod UID and namespace is empty.
# kubelet_url = "https://${{NODE_IP}}:10250"
# Bearer token sent to the kubelet (the pod's service-account token; it needs `get` on
# nodes/pods, or nodes/proxy before Kubernetes 1.33). Read at every request.
token_file = "{token_file}"
# CA bundle that verifies the kubelet's serving certificate (signed by the cluster CA when the
# kubelet runs with serverTLSBootstrap).
ca_file = "{ca_file}"
# The kubelet's certificate is self-signed (kubeadm's default without serverTLSBootstrap):
# skip verifying it. The token then goes to whatever answers at kubelet_url.
insecure_skip_verify = {insecure_skip_verify}
"#,
        listen = d.listen,
        nvml_lib = d.nvml_lib,
        procfs = d.procfs.display(),
        interval = humantime::format_duration(d.interval),
        log_format = match d.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        },
        log_level = d.log_level,
        gpu_points = d.history.gpu_points,
        max_connections = d.ingest.max_connections,
        max_lines_per_second = d.ingest.max_lines_per_second,
        hello_timeout_seconds = d.ingest.hello_timeout_seconds,
        idle_timeout_seconds = d.ingest.idle_timeout_seconds,
        max_connections_per_uid = d.ingest.max_connections_per_uid,
        reserved_connections = d.ingest.reserved_connections,
        max_line_buffer_bytes = d.ingest.max_line_buffer_bytes,
        connection_limit = d.http.connection_limit,
        header_timeout_seconds = d.http.header_timeout_seconds,
        keepalive_timeout_seconds = d.http.keepalive_timeout_seconds,
        max_request_head_bytes = d.http.max_request_head_bytes,
        shutdown_grace_seconds = d.http.shutdown_grace_seconds,
        max_file_bytes = d.record.max_file_bytes,
        max_total_bytes = d.record.max_total_bytes,
        max_files = d.record.max_files,
        headroom_margin_bytes = d.detect.headroom_margin_bytes,
        leak_materiality_ratio = d.detect.leak_materiality_ratio,
        crash_hold = humantime::format_duration(d.detect.crash_hold),
        job_cascade = humantime::format_duration(d.detect.job_cascade),
        orphan_grace = humantime::format_duration(d.detect.orphan_grace),
        attr_enabled = d.attribution.enabled,
        window_steps = d.attribution.window_steps,
        window_seconds = d.attribution.window_seconds,
        max_entries = d.attribution.max_entries,
        top = d.attribution.top,
        cooldown_seconds = d.attribution.cooldown_seconds,
        oom_arm = d.oom.arm,
        arm_eta_seconds = d.oom.arm_eta_seconds,
        arm_seconds = d.oom.arm_seconds,
        oom_max_entries = d.oom.max_entries,
        peak_after_steps = d.oom.peak_after_steps,
        rearm_seconds = d.oom.rearm_seconds,
        resend_interval = humantime::format_duration(d.alerts.resend_interval),
        token_file = d.kubernetes.token_file.display(),
        ca_file = d.kubernetes.ca_file.display(),
        insecure_skip_verify = d.kubernetes.insecure_skip_verify,
    )
}
