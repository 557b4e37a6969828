//! The shipped Prometheus rules and Alertmanager example, as the end-to-end tests run them: the
//! files themselves with only their waits cut and their receivers pointed at the test.

use super::*;

pub const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/dashboards/alertmanager/gpumon.alertmanager.yml"
);
pub const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/dashboards/prometheus/gpumon.rules.yml"
);

pub fn example() -> String {
    std::fs::read_to_string(EXAMPLE).unwrap()
}

/// The shipped rules with each `for: Nm` given as `seconds(N)` seconds.
pub fn rules_for_test(seconds: impl Fn(u32) -> u32) -> String {
    let shipped = std::fs::read_to_string(RULES).unwrap();
    let mut out = String::new();
    for line in shipped.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        match t.strip_prefix("for:").map(str::trim) {
            Some(d) => {
                let minutes: u32 = d.strip_suffix('m').unwrap().parse().unwrap();
                out.push_str(&format!("{indent}for: {}s\n", seconds(minutes)));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The example, its inhibit rules and routes as they are, with every receiver sent to `hook`
/// and every group timing 1 s, so a notification that inhibition failed to hold back would
/// arrive within the test.
pub fn example_for_test(hook: &str) -> String {
    let shipped = example();
    let (head, receivers) = shipped
        .split_once("\nreceivers:\n")
        .expect("the example ends with its receivers");
    let mut out = String::new();
    for line in head.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        match t.split_once(':') {
            Some((k @ ("group_wait" | "group_interval"), _)) => {
                out.push_str(&format!("{indent}{k}: 1s\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str("\nreceivers:\n");
    let names: Vec<&str> = receivers
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name:"))
        .map(str::trim)
        .collect();
    assert!(names.contains(&"pager"), "receivers: {names:?}");
    for name in names {
        out.push_str(&format!(
            "  - name: {name}\n    webhook_configs:\n      - url: {hook}\n        send_resolved: false\n"
        ));
    }
    out
}

/// An alert's label, or "" where it has none.
pub fn label<'v>(a: &'v Value, name: &str) -> &'v str {
    a["labels"][name].as_str().unwrap_or("")
}

/// Retries `check` until it is Ok, for at most `wait`; Err says what is still missing, and the
/// panic gives `procs`' last output lines.
pub fn until<T>(
    wait: Duration,
    what: &str,
    procs: &[&Proc],
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let end = Instant::now() + wait;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if Instant::now() > end => {
                let tails: Vec<String> = procs.iter().map(|p| p.tail()).collect();
                panic!(
                    "timed out after {wait:?} waiting until {what}:\n{e}\n{}",
                    tails.join("\n")
                )
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
