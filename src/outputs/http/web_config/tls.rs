//! The `tls_server_config` section as a rustls server config (ring provider).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::{Bad, RawTls};

pub(super) fn tls_config(t: RawTls, dir: &Path) -> Result<ServerConfig, Bad> {
    let join = |p: &Path| dir.join(p);
    let certs: Vec<CertificateDer<'static>> = match (&t.cert, &t.cert_file) {
        (Some(_), Some(_)) => return Err(("cert", "set both cert and cert_file; use one".into())),
        (Some(pem), None) => CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| ("cert", format!("not PEM certificates: {e}")))?,
        (None, Some(f)) => CertificateDer::pem_file_iter(join(f))
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| ("cert_file", format!("{}: {e}", join(f).display())))?,
        (None, None) => return Err(("cert_file", "missing: TLS needs a certificate".into())),
    };
    if certs.is_empty() {
        return Err(("cert_file", "holds no PEM certificate".into()));
    }
    let key = match (&t.key, &t.key_file) {
        (Some(_), Some(_)) => return Err(("key", "set both key and key_file; use one".into())),
        // The key's text is never quoted back: it is a secret.
        (Some(pem), None) => PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| ("key", "not a PEM private key".to_string()))?,
        (None, Some(f)) => PrivateKeyDer::from_pem_file(join(f))
            .map_err(|e| ("key_file", format!("{}: {e}", join(f).display())))?,
        (None, None) => {
            return Err((
                "key_file",
                "missing: TLS needs the certificate's key".into(),
            ))
        }
    };
    if t.client_allowed_sans
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        return Err((
            "client_allowed_sans",
            "is not supported by gpumon; verify clients with client_ca_file and RequireAndVerifyClientCert".into(),
        ));
    }
    let provider = Arc::new(provider(&t)?);
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| ("min_version", e.to_string()))?;
    let auth_type = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let roots = || -> Result<Arc<RootCertStore>, Bad> {
        let cas: Vec<CertificateDer<'static>> = match (&t.client_ca, &t.client_ca_file) {
            (Some(pem), None) => CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| ("client_ca", format!("not PEM certificates: {e}")))?,
            (None, Some(f)) => CertificateDer::pem_file_iter(join(f))
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| ("client_ca_file", format!("{}: {e}", join(f).display())))?,
            (Some(_), Some(_)) => {
                return Err((
                    "client_ca",
                    "set both client_ca and client_ca_file; use one".into(),
                ))
            }
            (None, None) => {
                return Err((
                    "client_ca_file",
                    format!(
                    "missing: client_auth_type {auth_type} verifies client certificates against it"
                ),
                ))
            }
        };
        let mut store = RootCertStore::empty();
        for ca in cas {
            store
                .add(ca)
                .map_err(|e| ("client_ca_file", format!("unusable CA certificate: {e}")))?;
        }
        Ok(Arc::new(store))
    };
    let verifier = |optional: bool| -> Result<_, Bad> {
        let b = WebPkiClientVerifier::builder_with_provider(roots()?, provider.clone());
        let b = if optional {
            b.allow_unauthenticated()
        } else {
            b
        };
        b.build().map_err(|e| ("client_ca_file", e.to_string()))
    };
    let builder = match auth_type {
        "NoClientCert" => builder.with_no_client_auth(),
        "RequireAndVerifyClientCert" => builder.with_client_cert_verifier(verifier(false)?),
        "VerifyClientCertIfGiven" => builder.with_client_cert_verifier(verifier(true)?),
        "RequestClientCert" | "RequireAnyClientCert" => return Err((
            "client_auth_type",
            format!("{auth_type} accepts certificates nobody verified, which gpumon does not do; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"),
        )),
        other => return Err((
            "client_auth_type",
            format!("{other:?} is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"),
        )),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        (
            "cert_file",
            format!("the certificate and key do not go together: {e}"),
        )
    })?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The ring provider, with the suites and curves the file names (Go's names).
fn provider(t: &RawTls) -> Result<CryptoProvider, Bad> {
    let mut p = rustls::crypto::ring::default_provider();
    if let Some(names) = t.cipher_suites.as_ref().filter(|n| !n.is_empty()) {
        // As in Go, the list governs TLS 1.2 only: TLS 1.3's suites are all kept.
        let tls13: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
        let mut chosen = Vec::new();
        for name in names {
            // Go also spells the ChaCha suites without the _SHA256.
            let want = if name.ends_with("_CHACHA20_POLY1305") {
                format!("{name}_SHA256")
            } else {
                name.clone()
            };
            let suite = p
                .cipher_suites
                .iter()
                .find(|s| s.tls13().is_none() && format!("{:?}", s.suite()) == want)
                .ok_or((
                    "cipher_suites",
                    format!("{name} is not available: gpumon offers TLS_ECDHE_{{ECDSA,RSA}}_WITH_{{AES_128_GCM_SHA256,AES_256_GCM_SHA384,CHACHA20_POLY1305_SHA256}}"),
                ))?;
            chosen.push(*suite);
        }
        chosen.extend(tls13);
        p.cipher_suites = chosen;
    }
    if let Some(names) = t.curve_preferences.as_ref().filter(|n| !n.is_empty()) {
        let mut groups = Vec::new();
        for name in names {
            let want = match name.as_str() {
                "X25519" => rustls::NamedGroup::X25519,
                "CurveP256" => rustls::NamedGroup::secp256r1,
                "CurveP384" => rustls::NamedGroup::secp384r1,
                other => {
                    return Err((
                        "curve_preferences",
                        format!(
                            "{other} is not available: gpumon offers X25519, CurveP256, CurveP384"
                        ),
                    ))
                }
            };
            if let Some(g) = p.kx_groups.iter().find(|g| g.name() == want) {
                groups.push(*g);
            }
        }
        p.kx_groups = groups;
    }
    Ok(p)
}

fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, Bad> {
    let rank = |key: &'static str, v: &str| match v {
        "TLS12" => Ok(2),
        "TLS13" => Ok(3),
        "TLS10" | "TLS11" => Err((
            key,
            format!("{v} is not offered (rustls speaks TLS12 and TLS13)"),
        )),
        other => Err((key, format!("{other:?} is not one of TLS12, TLS13"))),
    };
    let lo = min
        .map(|v| rank("min_version", v))
        .transpose()?
        .unwrap_or(2);
    let hi = max
        .map(|v| rank("max_version", v))
        .transpose()?
        .unwrap_or(3);
    if lo > hi {
        return Err(("min_version", "is above max_version".into()));
    }
    Ok([(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(r, _)| (lo..=hi).contains(r))
        .map(|(_, v)| v)
        .collect())
}
