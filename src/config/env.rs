//! `GPUMON_*` variables. Only some keys can be set from the environment (the ones with a flag);
//! a variable named after any other key would otherwise be ignored without a word, and the
//! operator believes a setting is in force that is not.

use super::{Config, ConfigError};

/// Keys that the environment can set, and the variable that sets each (the flags in cli.rs
/// read the same names; a unit test keeps the two lists equal).
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("listen", "GPUMON_LISTEN"),
    ("socket", "GPUMON_SOCKET"),
    ("nvml_lib", "GPUMON_NVML_LIB"),
    ("procfs", "GPUMON_PROCFS"),
    ("interval", "GPUMON_INTERVAL"),
    ("log_format", "GPUMON_LOG_FORMAT"),
    ("log_level", "GPUMON_LOG_LEVEL"),
    ("record.dir", "GPUMON_RECORD_DIR"),
    ("alerts.alertmanager_url", "GPUMON_ALERTMANAGER_URL"),
    ("alerts.webhook_url", "GPUMON_WEBHOOK_URL"),
    ("http.web_config_file", "GPUMON_WEB_CONFIG_FILE"),
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
            if Some(guess.as_str()) == mapped || !set.contains(&guess) {
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
    Ok(())
}

fn guesses(key: &str) -> Vec<String> {
    let upper = |s: &str| format!("GPUMON_{}", s.to_ascii_uppercase().replace('.', "_"));
    let mut out = vec![upper(key)];
    if let Some((_, leaf)) = key.split_once('.') {
        out.push(upper(leaf));
    }
    out
}
