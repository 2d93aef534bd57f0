//! The `tls` feature's one piece of process-wide state: rustls's crypto provider.

/// Makes ring rustls's process-wide crypto provider, only if none is set yet.
///
/// redis-rs builds its TLS configuration with the process default provider (it takes no
/// provider of ours), and rustls can only pick one by itself when exactly one is compiled
/// in; another crate of the application may bring a second, and rustls would then panic
/// in the handshake. So this runs when a locker for `rediss://` servers is built, and
/// then only when no provider is set: a provider the application set first is kept, and
/// a locker without TLS sets nothing.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only when another thread set one in between: that one is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `e` is rustls refusing the server's certificate (an unknown CA, a wrong name).
pub(crate) fn is_certificate_error(e: &redis::RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cause {
        // redis-rs keeps its causes in an `Arc`, and a handshake's inside an `io::Error`.
        let err: &(dyn std::error::Error + 'static) = match err.downcast_ref::<Shared>() {
            Some(shared) => shared.as_ref(),
            None => err,
        };
        let rustls_error = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(_)) = rustls_error {
            return true;
        }
        cause = err.source();
    }
    false
}
