//! How `gpumon status` and `gpumon tui --connect` reach a daemon: plain HTTP, or HTTPS trusting
//! the daemon's CA (with a client certificate when the daemon requires one), and basic auth.
//! The password comes from a file or the environment, never from the command line alone:
//! argv is readable by every user of the machine.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod explain;

use base64::Engine;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

/// The environment variable that may hold `user:password` (instead of a credentials file).
pub const BASIC_AUTH_ENV: &str = "GPUMON_BASIC_AUTH";

#[derive(Debug, Default, Clone, clap::Args)]
pub struct ClientArgs {
    /// CA certificate (PEM) to trust for an https:// daemon, e.g. the one that signed the
    /// certificate in its web config. Default: the Mozilla roots.
    #[arg(long, env = "GPUMON_CA_FILE", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for a daemon whose web config requires one.
    #[arg(
        long,
        env = "GPUMON_CLIENT_CERT",
        value_name = "PATH",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(
        long,
        env = "GPUMON_CLIENT_KEY",
        value_name = "PATH",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// A file holding `user:password` for basic auth (or set GPUMON_BASIC_AUTH=user:password).
    #[arg(long, env = "GPUMON_CREDENTIALS_FILE", value_name = "PATH")]
    pub credentials_file: Option<PathBuf>,
}

/// "host:port", "http://host:port[/]" or "https://host:port[/]" → the URL without a trailing
/// slash (http:// when no scheme is given); anything else is refused with the value named.
pub fn normalize_url(raw: &str) -> Result<String, String> {
    let s = raw.trim().trim_end_matches('/');
    let with_scheme = if s.contains("://") {
        s.to_string()
    } else {
        format!("http://{s}")
    };
    if !(with_scheme.starts_with("http://") || with_scheme.starts_with("https://")) {
        return Err(format!(
            "--connect {raw:?}: use http://HOST:PORT, or https://HOST:PORT for a daemon with TLS on (with --ca-file)"
        ));
    }
    match ureq::http::Uri::try_from(with_scheme.as_str()) {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => Ok(with_scheme),
        _ => Err(format!(
            "--connect {raw:?} is not a daemon address; use HOST:PORT, http://HOST:PORT or https://HOST:PORT, e.g. http://gpu-node-3:9477"
        )),
    }
}

/// An HTTP(S) client for one or more daemons, with its credentials.
#[derive(Clone)]
pub struct DaemonClient {
    agent: ureq::Agent,
    /// The `Authorization` header value.
    auth: Option<String>,
    /// What the client was given, for the advice on a failure.
    given: explain::Given,
}

impl DaemonClient {
    pub fn new(args: &ClientArgs, timeout: Duration) -> anyhow::Result<Self> {
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &args.ca_file {
            let certs = certificates(ca, "--ca-file")?;
            if certs.is_empty() {
                anyhow::bail!("--ca-file {}: holds no PEM certificate", ca.display());
            }
            tls = tls.root_certs(RootCerts::Specific(std::sync::Arc::new(certs)));
        }
        if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
            let certs = certificates(cert, "--client-cert")?;
            let key = std::fs::read(key)
                .map_err(|e| anyhow::anyhow!("--client-key {}: {e}", key.display()))
                .and_then(|pem| {
                    PrivateKey::from_pem(&pem).map_err(|_| {
                        anyhow::anyhow!("--client-key {}: not a PEM private key", key.display())
                    })
                })?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&certs, key)));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .tls_config(tls.build())
            .build()
            .new_agent();
        let env = std::env::var(BASIC_AUTH_ENV).ok();
        let given = explain::Given {
            ca_file: args.ca_file.as_ref().map(|p| p.display().to_string()),
            credentials: match (&args.credentials_file, &env) {
                (Some(f), _) => Some(format!("--credentials-file {}", f.display())),
                (None, Some(_)) => Some(BASIC_AUTH_ENV.into()),
                (None, None) => None,
            },
            client_cert: args.client_cert.is_some(),
        };
        Ok(Self {
            agent,
            auth: credentials(args.credentials_file.as_deref(), env)?,
            given,
        })
    }

    /// A client without TLS settings or credentials (the local daemon at its default address).
    pub fn plain(timeout: Duration) -> Self {
        Self {
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .build()
                .new_agent(),
            auth: None,
            given: explain::Given::default(),
        }
    }

    /// GETs `url`; a failure says what to fix (the flag, the file, the certificate).
    pub fn get(&self, url: &str) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        self.get_with(url, &[])
    }

    /// GETs `url` with extra request headers (`If-None-Match`, for one).
    pub fn get_with(
        &self,
        url: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut req = self.agent.get(url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        match &self.auth {
            Some(a) => req.header("Authorization", a).call(),
            None => req.call(),
        }
        .map_err(|e| anyhow::anyhow!(explain::explain(&e, &self.given)))
    }
}

/// The PEM certificates in `path` (other PEM items skipped).
fn certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<Certificate<'static>>> {
    let pem = std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => anyhow::bail!("{flag} {}: not PEM: {e}", path.display()),
        }
    }
    Ok(certs)
}

/// `Basic base64(user:password)` from the file (its first line) or the variable.
fn credentials(file: Option<&Path>, env: Option<String>) -> anyhow::Result<Option<String>> {
    let (text, from) = match (file, env) {
        (Some(f), _) => (
            std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("--credentials-file {}: {e}", f.display()))?,
            format!("--credentials-file {}", f.display()),
        ),
        (None, Some(v)) => (v, BASIC_AUTH_ENV.to_string()),
        (None, None) => return Ok(None),
    };
    let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if !line.contains(':') || line.starts_with(':') {
        // The value is a secret: not quoted back.
        anyhow::bail!("{from}: expected user:password on its first line");
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(line);
    Ok(Some(format!("Basic {b64}")))
}

#[cfg(test)]
mod tests;
