//! TLS on the listeners: rustls through pingora's own TLS layer (`pingora::tls`,
//! `pingora::listeners::tls::Acceptor`), TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, and a
//! certificate that can be replaced while the server runs.
//!
//! **Why the handshake runs in Quipu's connection loop** ([`super::server`]) instead of
//! pingora's TLS listener (`Service::add_tls_with_settings`): pingora's listener handshakes
//! before the application sees the connection, with a fixed 60 s deadline, outside Quipu's
//! connection cap, and logs every failed handshake at `error` — a client that never finishes a
//! handshake holds a socket for a minute, and a flood of garbage becomes a flood of log lines.
//! Here the listener stays plain TCP (so graceful upgrades hand it over unchanged), the
//! connection takes its slot under `server.max_connections` first, and the handshake has
//! `server.tls_handshake_timeout_ms`; failures are counted in
//! `quipu_tls_handshake_failures_total` and logged at `debug`. The handshake itself is
//! pingora's `Acceptor::tls_handshake`, so the stream is pingora's `TlsStream` and everything
//! above it (HTTP/1.1 sessions, HTTP/2) is pingora's as well.
//!
//! **Reload without dropping connections.** The certificate is served by a [`CertStore`]
//! resolver that rustls asks on every ClientHello: [`CertStore::reload`] reads the PEM files
//! again and swaps the certified key in one atomic store, so new handshakes get the new
//! certificate and open connections keep theirs. A pair that does not load, or whose key does
//! not match the certificate, is refused and the old one stays. `quipu serve` reloads on
//! `SIGHUP` and when the files change (see `crate::server`).
//!
//! **The admin listener** (`server.admin_tls`) is pingora's own TLS listener with the same
//! [`CertStore`] as its resolver ([`CertStore::listener_settings`]), so it is reloaded with the
//! API's. What the paragraph above avoids is acceptable there: it serves a handful of operator
//! requests on an internal address, not the internet.

use arc_swap::ArcSwap;
use pingora::listeners::tls::{Acceptor, TlsSettings};
use pingora::protocols::ALPN;
use pingora::tls::{
    load_certs_and_key_files, sign::CertifiedKey, version, ClientHello, CryptoProvider,
    ResolvesServerCert, ServerConfig,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Why a certificate could not be loaded.
#[derive(Debug)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// The listener's certificate and key, reloadable.
#[derive(Debug)]
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// What the files looked like when last loaded (for [`CertStore::reload_if_changed`]).
    stamp: parking_lot::Mutex<Option<FileStamp>>,
}

/// Modification time and size of the two files: enough to tell a replaced pair.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp([(Option<SystemTime>, u64); 2]);

fn stamp(cert: &Path, key: &Path) -> Option<FileStamp> {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    Some(FileStamp([one(cert)?, one(key)?]))
}

/// Reads a PEM certificate chain and its private key (PKCS#1, PKCS#8 or SEC1) and checks that
/// they belong together.
fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let (c, k) = (cert.display(), key.display());
    let (chain, private) = load_certs_and_key_files(&c.to_string(), &k.to_string())
        .map_err(|e| TlsError(format!("cannot read {c} / {k}: {e}")))?
        .ok_or_else(|| TlsError(format!("no certificate in {c} or no private key in {k}")))?;
    let provider = CryptoProvider::get_default()
        .ok_or_else(|| TlsError("no TLS crypto provider installed".into()))?;
    let certified = CertifiedKey::from_der(chain, private, provider)
        .map_err(|e| TlsError(format!("{k} is not the key of {c}: {e}")))?;
    Ok(Arc::new(certified))
}

impl CertStore {
    /// Loads the pair; an error says which file and why.
    pub fn open(cert_path: &Path, key_path: &Path) -> Result<Arc<CertStore>, TlsError> {
        pingora::tls::install_default_crypto_provider();
        let certified = load(cert_path, key_path)?;
        Ok(Arc::new(CertStore {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: ArcSwap::new(certified),
            stamp: parking_lot::Mutex::new(stamp(cert_path, key_path)),
        }))
    }

    /// Reads the files again and serves the new pair to new handshakes; on error the old pair
    /// stays in service.
    pub fn reload(&self) -> Result<(), TlsError> {
        let certified = load(&self.cert_path, &self.key_path)?;
        self.current.store(certified);
        *self.stamp.lock() = stamp(&self.cert_path, &self.key_path);
        Ok(())
    }

    /// Reloads when either file changed since the last load (a certificate manager replaced
    /// them). Returns whether it reloaded. A pair caught half-written fails to load and is
    /// tried again on the next call.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamp(&self.cert_path, &self.key_path);
        if now.is_none() || *self.stamp.lock() == now {
            return Ok(false);
        }
        self.reload().map(|()| true)
    }

    pub fn paths(&self) -> (&Path, &Path) {
        (&self.cert_path, &self.key_path)
    }

    /// The TLS acceptor of a listener serving this certificate: TLS 1.2 and 1.3, and ALPN
    /// `h2` (when `http2`) then `http/1.1`.
    pub fn acceptor(self: &Arc<Self>, http2: bool) -> Acceptor {
        let mut config =
            ServerConfig::builder_with_protocol_versions(&[&version::TLS13, &version::TLS12])
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Acceptor::from_server_config(Arc::new(config))
    }
}

impl CertStore {
    /// Settings for pingora's TLS listener serving this certificate (and its reloads): TLS 1.2
    /// and 1.3, HTTP/1.1 only.
    pub fn listener_settings(self: &Arc<Self>) -> Result<TlsSettings, TlsError> {
        // The paths are not read: a resolver replaces them.
        let (cert, key) = self.paths();
        let mut settings =
            TlsSettings::intermediate(&cert.to_string_lossy(), &key.to_string_lossy())
                .map_err(|e| TlsError(e.to_string()))?;
        settings.set_cert_resolver(Arc::new(Resolver(self.clone())));
        settings.set_alpn(ALPN::H1);
        Ok(settings)
    }
}

/// rustls's view of a [`CertStore`]: the current pair, whatever the client asked for.
#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.load_full())
    }
}
