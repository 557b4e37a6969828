//! A failed request to a daemon in words that name the fix: the flag or file to change, or how
//! to make a certificate TLS clients accept. TLS failures come from rustls inside ureq's I/O
//! error; they are told apart by the certificate error's name, stable across rustls 0.23.

/// What the client was given, for the advice.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// `--ca-file`, as given.
    pub ca_file: Option<String>,
    /// Where the credentials came from (`--credentials-file F` or GPUMON_BASIC_AUTH).
    pub credentials: Option<String>,
    pub client_cert: bool,
}

pub fn explain(e: &ureq::Error, given: &Given) -> String {
    match e {
        ureq::Error::StatusCode(401) => match &given.credentials {
            None => format!(
                "the daemon asks for a user and password (HTTP 401): pass --credentials-file FILE holding user:password on its first line, or set {}=user:password",
                super::BASIC_AUTH_ENV
            ),
            Some(from) => format!(
                "the daemon refused the user and password from {from} (HTTP 401): check them against basic_auth_users in its web config"
            ),
        },
        ureq::Error::StatusCode(429) => "the daemon is throttling this address after failed logins (HTTP 429): wait a minute, then try again with the right credentials".into(),
        ureq::Error::StatusCode(code) => format!("the daemon answered HTTP {code}"),
        _ => match tls_error(e) {
            Some(tls) => certificate(&tls, given).unwrap_or_else(|| format!("TLS: {tls}")),
            None => e.to_string(),
        },
    }
}

/// The rustls error behind a failed handshake, in its Debug form (which names the variant).
fn tls_error(e: &ureq::Error) -> Option<String> {
    let r = match e {
        ureq::Error::Rustls(r) => r,
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<rustls::Error>()?,
        _ => return None,
    };
    Some(format!("{r:?}"))
}

/// What is wrong with the daemon's certificate, and what to do.
fn certificate(debug: &str, given: &Given) -> Option<String> {
    const RECIPE: &str = "docs/operations.md, \"Certificates\"";
    let trusted = match &given.ca_file {
        Some(f) => format!("the CA in --ca-file {f}"),
        None => "the system's CAs (no --ca-file given)".into(),
    };
    let says = if debug.contains("CaUsedAsEndEntity") {
        format!(
            "the daemon's certificate is itself a CA certificate (basicConstraints CA:TRUE, what `openssl req -x509` makes unless told otherwise), and TLS clients refuse a CA certificate as a server's: make a CA and a server certificate it signs ({RECIPE}), serve the server certificate and pass the CA with --ca-file"
        )
    } else if debug.contains("UnknownIssuer") {
        format!(
            "the daemon's certificate is not signed by {trusted}: pass the CA certificate that signed it with --ca-file ({RECIPE})"
        )
    } else if debug.contains("NotValidForName") {
        "the daemon's certificate does not name the host in --connect: connect by a name or IP in its subjectAltName, or make a certificate that names this one".into()
    } else if debug.contains("Expired") {
        "the daemon's certificate has expired: renew it (the daemon takes a new file without a restart)".into()
    } else if debug.contains("NotValidYet") {
        "the daemon's certificate is not valid yet: check the clocks of both machines".into()
    } else if debug.contains("CertificateRequired") || debug.contains("certificate required") {
        let what = if given.client_cert {
            "the daemon did not accept the client certificate given: it must be signed by the client_ca_file of its web config"
        } else {
            "the daemon requires a client certificate: pass --client-cert and --client-key"
        };
        what.into()
    } else {
        return None;
    };
    Some(format!("TLS: {says}"))
}

#[cfg(test)]
mod tests;
