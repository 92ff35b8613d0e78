//! TLS on the HTTP port: the gRPC port's certificate, key and client CA (`[tls]`), with the same
//! rustls on ring that tonic uses, offering HTTP/1.1. Handshakes run in tasks of their own, so a
//! slow or silent client delays no other connection.

use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;
use crate::error::{LatheError, Result};

/// How long a client may take over its handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The rustls configuration of `tls`, as tonic builds its own for the gRPC port.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<ServerConfig>> {
    let read = |path: &str, field: &str| {
        std::fs::read(path)
            .map_err(|e| LatheError::invalid(field, format!("cannot read {path}: {e}")))
    };
    let certificates = |pem: Vec<u8>, field: &str| {
        CertificateDer::pem_reader_iter(&mut Cursor::new(pem))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| LatheError::invalid(field, format!("cannot parse PEM: {e}")))
    };
    let chain = certificates(read(&tls.cert_file, "tls.cert_file")?, "tls.cert_file")?;
    let key =
        PrivateKeyDer::from_pem_reader(&mut Cursor::new(read(&tls.key_file, "tls.key_file")?))
            .map_err(|e| LatheError::invalid("tls.key_file", format!("cannot parse PEM: {e}")))?;
    let builder = ServerConfig::builder();
    let builder = if tls.client_ca_file.is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(certificates(
            read(&tls.client_ca_file, "tls.client_ca_file")?,
            "tls.client_ca_file",
        )?);
        let verifier = WebPkiClientVerifier::builder(roots.into())
            .build()
            .map_err(|e| LatheError::invalid("tls.client_ca_file", e))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| LatheError::invalid("tls", format!("cannot configure TLS: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener that hands axum connections whose handshake has finished.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` (until this listener is dropped) and shakes hands in the background.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (sender, handshaken) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(5);
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = sender.closed() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors or memory: pause rather than spin (see `incoming`).
                        tracing::warn!(%error, "http accept failed");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(500));
                        continue;
                    }
                };
                pause = Duration::from_millis(5);
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%error, %peer, "http tls handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "http tls handshake timed out"),
                    }
                });
            }
        });
        Self { handshaken, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended: nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
