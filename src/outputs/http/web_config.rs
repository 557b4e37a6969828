//! `--web.config.file`: TLS, basic auth and response headers in the file format of Prometheus'
//! exporter-toolkit (docs/web-configuration.md there), so one file and one secret-rotation
//! process serve node_exporter, dcgm-exporter and gpumon alike. Keys are the toolkit's; a key
//! it does not define is an error, as in the toolkit (strict YAML), and so is a setting the
//! toolkit accepts but rustls cannot honour (TLS 1.0/1.1, CBC suites, unverified client
//! certificates): refused by name rather than silently weakened or ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use rustls::ServerConfig;
use serde::Deserialize;

mod auth;
mod reload;
mod stats;
mod tls;
mod watch;
pub use auth::{Auth, Verdict};
pub use stats::ReloadStats;
pub use watch::WebConfigWatch;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    tls_server_config: Option<RawTls>,
    http_server_config: Option<RawHttp>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<RawRate>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) client_ca: Option<String>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    pub(super) client_auth_type: Option<String>,
    pub(super) client_ca_file: Option<PathBuf>,
    pub(super) client_allowed_sans: Option<Vec<String>>,
    pub(super) min_version: Option<String>,
    pub(super) max_version: Option<String>,
    pub(super) cipher_suites: Option<Vec<String>>,
    pub(super) prefer_server_cipher_suites: Option<bool>,
    pub(super) curve_preferences: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    /// HTTP/2 (the toolkit's default, with TLS). gpumon serves HTTP/1.1; scrapers fall back.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    interval: Option<String>,
    burst: Option<u32>,
}

/// A loaded, checked web config.
pub struct WebConfig {
    /// None: plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// TLS requires a client certificate verified against `client_ca_file`
    /// (`RequireAndVerifyClientCert`): authentication a reload may not take away.
    pub client_certs: bool,
    pub auth: Auth,
    /// Added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Requests admitted: one per `interval`, bursts of `burst` (the toolkit's token bucket).
    pub rate_limit: Option<Rate>,
    /// The files it read besides itself (certificate, key, client CA): a change to any of them
    /// reloads the config, as a rotated certificate must apply without a SIGHUP.
    pub files: Vec<PathBuf>,
}

/// The `rate_limit` token bucket, shared by all requests (as in the toolkit).
pub struct Rate {
    pub every: Duration,
    pub burst: u32,
    state: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl Rate {
    fn new(every: Duration, burst: u32) -> Self {
        Self {
            every,
            burst,
            state: std::sync::Mutex::new((f64::from(burst), std::time::Instant::now())),
        }
    }

    /// Takes a token if there is one.
    pub fn admit(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() / self.every.as_secs_f64();
        st.0 = (st.0 + refill).min(f64::from(self.burst));
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What is wrong with the file: the key (as the file spells it) and why.
#[derive(Debug, thiserror::Error)]
#[error("web config {path}: {key}: {reason}")]
pub struct WebConfigError {
    pub path: String,
    pub key: String,
    pub reason: String,
}

impl WebConfig {
    /// Plain HTTP, no auth: what runs without `--web.config.file`.
    pub fn plain() -> Self {
        Self {
            tls: None,
            client_certs: false,
            auth: Auth::default(),
            headers: Vec::new(),
            rate_limit: None,
            files: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        Self::parse(path, &read(path)?)
    }

    /// The config `text` (read from `path`) describes; the files it names are read now.
    fn parse(path: &Path, text: &str) -> Result<Self, WebConfigError> {
        let err = |key: &str, reason: String| WebConfigError {
            path: path.display().to_string(),
            key: key.to_owned(),
            reason,
        };
        // An empty file is a valid config that changes nothing, as in the toolkit.
        let raw: RawFile = if text.trim().is_empty() {
            RawFile::default()
        } else {
            serde_norway::from_str(text).map_err(|e| err("(yaml)", e.to_string()))?
        };
        // Relative file names are relative to the config file, as in the toolkit.
        let dir = path.parent().unwrap_or(Path::new("."));
        let files = raw
            .tls_server_config
            .iter()
            .flat_map(|t| [&t.cert_file, &t.key_file, &t.client_ca_file])
            .flatten()
            .map(|f| dir.join(f))
            .collect();
        let client_certs = raw.tls_server_config.as_ref().is_some_and(|t| {
            tls_enabled(t) && t.client_auth_type.as_deref() == Some("RequireAndVerifyClientCert")
        });
        let tls = match raw.tls_server_config {
            Some(t) if tls_enabled(&t) => {
                Some(Arc::new(tls::tls_config(t, dir).map_err(|(k, r)| {
                    err(&format!("tls_server_config.{k}"), r)
                })?))
            }
            _ => None,
        };
        let users = raw.basic_auth_users.unwrap_or_default();
        for (user, hash) in &users {
            if bcrypt_cost(hash).is_none() {
                return Err(err(
                    &format!("basic_auth_users.{user}"),
                    "is not a bcrypt hash ($2a$/$2b$/$2y$...): make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`".into(),
                ));
            }
        }
        let headers = headers(raw.http_server_config.and_then(|h| h.headers))
            .map_err(|(k, r)| err(&format!("http_server_config.{k}"), r))?;
        let rate_limit = match raw.rate_limit {
            None => None,
            Some(r) => rate(r).map_err(|(k, r)| err(&format!("rate_limit.{k}"), r))?,
        };
        Ok(Self {
            tls,
            client_certs,
            auth: Auth::new(users),
            headers,
            rate_limit,
            files,
        })
    }
}

/// The config file's text.
fn read(path: &Path) -> Result<String, WebConfigError> {
    std::fs::read_to_string(path).map_err(|e| WebConfigError {
        path: path.display().to_string(),
        key: "(file)".into(),
        reason: format!("cannot read it: {e}"),
    })
}

fn tls_enabled(t: &RawTls) -> bool {
    t.cert.is_some()
        || t.key.is_some()
        || t.cert_file.is_some()
        || t.key_file.is_some()
        || t.client_ca_file.is_some()
        || t.client_ca.is_some()
        || t.client_auth_type.is_some()
}

type Bad = (&'static str, String);

/// The toolkit's allowed response headers, with the values it allows where it limits them.
fn headers(h: Option<BTreeMap<String, String>>) -> Result<Vec<(HeaderName, HeaderValue)>, Bad> {
    let mut out = Vec::new();
    for (name, value) in h.unwrap_or_default() {
        let allowed: Option<&[&str]> = match name.as_str() {
            "Content-Security-Policy" | "X-XSS-Protection" | "Strict-Transport-Security" => None,
            "X-Frame-Options" => Some(&["deny", "sameorigin"]),
            "X-Content-Type-Options" => Some(&["nosniff"]),
            _ => return Err(("headers", format!("{name:?} is not one of Content-Security-Policy, X-Frame-Options, X-Content-Type-Options, X-XSS-Protection, Strict-Transport-Security"))),
        };
        if value.is_empty() {
            continue; // "Unset if blank"
        }
        if allowed.is_some_and(|ok| !ok.iter().any(|v| v.eq_ignore_ascii_case(&value))) {
            return Err((
                "headers",
                format!(
                    "{name}: {value:?} is not allowed (only {})",
                    allowed.unwrap_or_default().join(", ")
                ),
            ));
        }
        let v = HeaderValue::from_str(&value)
            .map_err(|_| ("headers", format!("{name}: not a valid header value")))?;
        out.push((
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| ("headers", e.to_string()))?,
            v,
        ));
    }
    Ok(out)
}

fn rate(r: RawRate) -> Result<Option<Rate>, Bad> {
    let interval = match r.interval.as_deref() {
        None | Some("0") | Some("0s") => return Ok(None),
        Some(s) => humantime::parse_duration(s).map_err(|e| {
            (
                "interval",
                format!("{s:?} is not a duration like 100ms or 1s: {e}"),
            )
        })?,
    };
    if interval.is_zero() {
        return Ok(None);
    }
    Ok(Some(Rate::new(interval, r.burst.unwrap_or(1).max(1))))
}

/// The cost of a bcrypt hash, None when it is not one.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let rest = hash
        .strip_prefix("$2a$")
        .or_else(|| hash.strip_prefix("$2b$"))
        .or_else(|| hash.strip_prefix("$2y$"))
        .or_else(|| hash.strip_prefix("$2x$"))?;
    let (cost, tail) = rest.split_once('$')?;
    (tail.len() == 53).then_some(())?;
    cost.parse().ok()
}

#[cfg(test)]
mod tests;
