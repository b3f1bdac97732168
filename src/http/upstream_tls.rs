//! TLS to `https://` upstream replicas: what pingora's TLS connector (rustls) needs per model —
//! the CA bundle to verify against (else the system's roots), an optional client certificate
//! (mTLS) and whether to verify at all — loaded and checked once, at start.
//!
//! Loading here rather than in pingora: pingora parses a CA or a client key only when it
//! connects, and panics on a bad one; a broken file must stop `quipu serve` (and fail
//! `--check`) with its name, not take a worker down on the first request.

use crate::config::UpstreamTls;
use pingora::tls::{sign::CertifiedKey, CryptoProvider, RootCertStore};
use pingora::utils::tls::{CertKey, WrappedX509};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

/// A model's upstream TLS, ready for its peers.
pub struct UpstreamTlsMaterial {
    /// CA certificates (DER) to verify replicas against; `None`: the system's roots.
    pub ca: Option<Arc<[WrappedX509]>>,
    /// Client certificate and key (mTLS).
    pub client: Option<Arc<CertKey>>,
    pub verify: bool,
    /// Keeps pooled connections of different trust settings apart: pingora's pool key does
    /// not include the CA.
    pub group_key: u64,
}

impl std::fmt::Debug for UpstreamTlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTlsMaterial")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("client", &self.client.is_some())
            .field("verify", &self.verify)
            .finish()
    }
}

/// The DER certificates of a PEM file, each checked to parse.
fn pem_certificates(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let shown = path.display();
    let text = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let ders: Vec<Vec<u8>> = rustls_pemfile::certs(&mut text.as_slice())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{shown} is not a PEM certificate bundle: {e}"))?;
    if ders.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    for der in &ders {
        x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("{shown} holds a certificate that does not parse: {e}"))?;
    }
    Ok(ders)
}

impl UpstreamTlsMaterial {
    /// Reads and checks the files `cfg` names.
    pub fn load(cfg: &UpstreamTls) -> Result<UpstreamTlsMaterial, String> {
        pingora::tls::install_default_crypto_provider();
        let mut group = std::collections::hash_map::DefaultHasher::new();
        let ca = match &cfg.ca {
            Some(path) => {
                let ders = pem_certificates(path)?;
                // The same check rustls makes when it trusts them.
                let mut roots = RootCertStore::empty();
                for der in &ders {
                    roots.add(der.clone().into()).map_err(|e| {
                        format!(
                            "{} holds a certificate that cannot be a CA: {e}",
                            path.display()
                        )
                    })?;
                }
                ders.hash(&mut group);
                let wrapped: Vec<WrappedX509> = ders
                    .into_iter()
                    .map(|d| WrappedX509::new(d, pingora::utils::tls::parse_x509))
                    .collect();
                Some(Arc::<[WrappedX509]>::from(wrapped))
            }
            None => None,
        };
        let client = match &cfg.client_cert {
            Some((cert, key)) => {
                let (c, k) = (cert.display().to_string(), key.display().to_string());
                let (chain, private) = pingora::tls::load_certs_and_key_files(&c, &k)
                    .map_err(|e| format!("cannot read {c} / {k}: {e}"))?
                    .ok_or_else(|| format!("no certificate in {c} or no private key in {k}"))?;
                let key_der = private.secret_der().to_vec();
                let provider = CryptoProvider::get_default()
                    .ok_or_else(|| "no TLS crypto provider installed".to_owned())?;
                let certs: Vec<Vec<u8>> = chain.iter().map(|c| c.to_vec()).collect();
                // Checks that the key belongs to the certificate (pingora would panic).
                CertifiedKey::from_der(chain, private, provider)
                    .map_err(|e| format!("{k} is not the key of {c}: {e}"))?;
                for der in &certs {
                    x509_parser::parse_x509_certificate(der)
                        .map_err(|e| format!("{c} holds a certificate that does not parse: {e}"))?;
                }
                certs.hash(&mut group);
                Some(Arc::new(CertKey::new(certs, key_der)))
            }
            None => None,
        };
        cfg.verify.hash(&mut group);
        Ok(UpstreamTlsMaterial {
            ca,
            client,
            verify: cfg.verify,
            group_key: group.finish(),
        })
    }
}
