use super::*;

fn io(e: rustls::Error) -> ureq::Error {
    ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[test]
fn each_failure_names_its_fix() {
    let none = Given::default();
    let with = Given {
        ca_file: Some("ca.pem".into()),
        credentials: Some("--credentials-file creds".into()),
        client_cert: false,
    };
    let unknown = io(rustls::Error::InvalidCertificate(
        rustls::CertificateError::UnknownIssuer,
    ));
    assert!(explain(&unknown, &none).contains("not signed by the system's CAs"));
    assert!(explain(&unknown, &with).contains("--ca-file ca.pem"));
    let expired = io(rustls::Error::InvalidCertificate(
        rustls::CertificateError::Expired,
    ));
    assert!(explain(&expired, &with).contains("has expired"));
    let e401 = ureq::Error::StatusCode(401);
    assert!(explain(&e401, &none).contains("--credentials-file FILE"));
    assert!(explain(&e401, &with)
        .contains("refused the user and password from --credentials-file creds"));
    assert!(explain(&ureq::Error::StatusCode(429), &none).contains("throttling"));
    // Anything else is left as ureq says it.
    let other = ureq::Error::Io(std::io::Error::other("connection refused"));
    assert_eq!(explain(&other, &none), "io: connection refused");
}
