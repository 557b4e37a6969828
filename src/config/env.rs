//! `GPUMON_*` variables. Only some keys can be set from the environment (the ones with a flag);
//! a variable named after any other key, or misspelt (`GPUMON_LISTENN`), would otherwise be
//! ignored without a word, and the operator believes a setting is in force that is not. Both
//! are errors, as an unknown key in the config file is.

use super::{Config, ConfigError};

/// Keys that the environment can set, and the variable that sets each (the flags in cli.rs
/// read the same names; a unit test keeps the two lists equal).
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("listen", "GPUMON_LISTEN"),
    ("socket", "GPUMON_SOCKET"),
    ("nvml_lib", "GPUMON_NVML_LIB"),
    ("procfs", "GPUMON_PROCFS"),
    ("node_name", "GPUMON_NODE_NAME"),
    ("interval", "GPUMON_INTERVAL"),
    ("log_format", "GPUMON_LOG_FORMAT"),
    ("log_level", "GPUMON_LOG_LEVEL"),
    ("record.dir", "GPUMON_RECORD_DIR"),
    ("alerts.alertmanager_url", "GPUMON_ALERTMANAGER_URL"),
    ("alerts.webhook_url", "GPUMON_WEBHOOK_URL"),
    ("http.web_config_file", "GPUMON_WEB_CONFIG_FILE"),
];

/// `GPUMON_*` variables read by something other than a config key: the CLI's own flags, the
/// Python client (a trainer's environment is often the operator's shell too), and the build and
/// test scripts (their variables reach the binary a test starts). Any other `GPUMON_*` variable
/// is a typo, and an error, as an unknown key in the file is.
pub const OTHER_VARS: &[&str] = &[
    // gpumon's flags and its HTTP client (cli.rs, daemon_client.rs).
    "GPUMON_CONFIG",
    "GPUMON_BASIC_AUTH",
    "GPUMON_CA_FILE",
    "GPUMON_CLIENT_CERT",
    "GPUMON_CLIENT_KEY",
    "GPUMON_CREDENTIALS_FILE",
    // The Python client (clients/python).
    "GPUMON_JOB",
    "GPUMON_RUN_ID",
    "GPUMON_DISABLE",
    "GPUMON_ATTRIBUTION",
    "GPUMON_OOM_HISTORY",
    "GPUMON_SIGNALS",
    // Build, test and bench scripts (build.rs, scripts/, tests/, corpus/, .ci/).
    "GPUMON_BIN",
    "GPUMON_BIN_DIR",
    "GPUMON_BUNDLED_FAKE_NVML",
    "GPUMON_REQUIRE_TOOLS",
    "GPUMON_REQUIRE_TORCH",
    "GPUMON_REVISION",
    "GPUMON_SKIP_DEB",
    "GPUMON_TEST_SOURCE",
    "GPUMON_VENV_CACHE",
];

/// Every config key, as `key` or `section.key`.
pub fn all_keys() -> Vec<String> {
    // Serialised from the defaults so that a key added to Config is covered here at once;
    // the optional keys are unset by default and so are added by hand (they all have a variable).
    let mut keys: Vec<String> = ENV_KEYS.iter().map(|(k, _)| k.to_string()).collect();
    if let Ok(table) = toml::Table::try_from(Config::default()) {
        for (key, value) in table {
            match value {
                toml::Value::Table(inner) => {
                    keys.extend(inner.keys().map(|k| format!("{key}.{k}")));
                }
                _ => keys.push(key),
            }
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// An error for the first variable in `vars` that names a config key the environment cannot
/// set: `GPUMON_SECTION_KEY` or `GPUMON_KEY` (the two spellings an operator would guess).
pub fn check<I, K>(vars: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = K>,
    K: AsRef<std::ffi::OsStr>,
{
    let set: Vec<String> = vars
        .into_iter()
        .filter_map(|k| k.as_ref().to_str().map(str::to_string))
        .filter(|k| k.starts_with("GPUMON_"))
        .collect();
    if set.is_empty() {
        return Ok(());
    }
    for key in all_keys() {
        let mapped = ENV_KEYS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        for guess in guesses(&key) {
            // A leaf's spelling can be another reader's variable (kubernetes.ca_file and the
            // HTTP client's GPUMON_CA_FILE): that one is meant, not the key.
            if Some(guess.as_str()) == mapped
                || OTHER_VARS.contains(&guess.as_str())
                || !set.contains(&guess)
            {
                continue;
            }
            let reason = match mapped {
                Some(real) => format!("the variable for {key} is {real}; unset {guess}"),
                None => format!(
                    "{key} is read only from the config file (--config); set it there and unset {guess}"
                ),
            };
            return Err(ConfigError::Env {
                var: guess,
                key,
                reason,
            });
        }
    }
    match set.iter().find(|v| !known(v)) {
        Some(var) => Err(unknown(var)),
        None => Ok(()),
    }
}

fn known(var: &str) -> bool {
    ENV_KEYS.iter().any(|(_, v)| *v == var) || OTHER_VARS.contains(&var)
}

/// The error for a `GPUMON_*` variable nothing reads, naming the known ones it is closest to.
fn unknown(var: &str) -> ConfigError {
    let names = ENV_KEYS
        .iter()
        .map(|(_, v)| *v)
        .chain(OTHER_VARS.iter().copied());
    let mut close: Vec<(usize, &str)> = names
        .map(|n| (distance(var, n), n))
        .filter(|(d, _)| *d <= 3)
        .collect();
    close.sort();
    let close: Vec<&str> = close.into_iter().take(3).map(|(_, n)| n).collect();
    let reason = if close.is_empty() {
        format!(
            "gpumon reads no such variable; unset it (the config variables are {})",
            ENV_KEYS
                .iter()
                .map(|(_, v)| *v)
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!(
            "gpumon reads no such variable; did you mean {}? Correct its name or unset it",
            close.join(" or ")
        )
    };
    ConfigError::Env {
        var: var.to_string(),
        key: String::new(),
        reason,
    }
}

/// Edit distance (insertions, deletions, substitutions), for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn guesses(key: &str) -> Vec<String> {
    let upper = |s: &str| format!("GPUMON_{}", s.to_ascii_uppercase().replace('.', "_"));
    let mut out = vec![upper(key)];
    if let Some((_, leaf)) = key.split_once('.') {
        out.push(upper(leaf));
    }
    out
}

#[cfg(test)]
mod tests;
