//! TLS for the gRPC and HTTP ports from the `[tls]` files (rustls on ring, as tonic's own): the
//! server's configuration is rebuilt when the files change (`reload`), and each new connection
//! shakes hands with the newest, so a renewed certificate is served without a restart while the
//! connections already open keep theirs. Handshakes run in tasks of their own, so a slow or
//! silent client delays no other connection.

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

use super::reload::{self, Reloadable};
use crate::config::TlsConfig;
use crate::error::{LatheError, Result};

/// How long a client may take over its handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The rustls configuration of `tls` offering `alpn` (`h2` for gRPC, `http/1.1` for the HTTP
/// port), rebuilt when its files change (checked every `interval`, never when zero) until `stop`.
pub fn reloading(
    tls: &TlsConfig,
    alpn: &'static [u8],
    interval: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Arc<Reloadable<ServerConfig>>> {
    let mut files = vec![tls.cert_file.clone().into(), tls.key_file.clone().into()];
    if !tls.client_ca_file.is_empty() {
        files.push(tls.client_ca_file.clone().into());
    }
    let tls = tls.clone();
    let what = if alpn == b"h2" {
        "tls (gRPC port)"
    } else {
        "tls (HTTP port)"
    };
    reload::watch_files(what, files, interval, stop, move || {
        server_config(&tls, alpn)
    })
}

/// The rustls configuration of `tls`, as tonic would build it.
fn server_config(tls: &TlsConfig, alpn: &[u8]) -> Result<ServerConfig> {
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
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// A listener that hands out connections whose handshake has finished: to axum as its
/// `Listener`, to tonic as its incoming stream.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` (until this listener is dropped) and shakes hands in the background
    /// with the configuration `config` holds at each connection.
    pub fn new(listener: TcpListener, config: Arc<Reloadable<ServerConfig>>) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (sender, handshaken) = mpsc::channel(64);
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
                        tracing::warn!(%error, "tls accept failed");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(500));
                        continue;
                    }
                };
                pause = Duration::from_millis(5);
                let _ = stream.set_nodelay(true);
                let acceptor = TlsAcceptor::from(config.get());
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%error, %peer, "tls handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "tls handshake timed out"),
                    }
                });
            }
        });
        Self { handshaken, local }
    }

    /// The connections as tonic's `serve_with_incoming` takes them.
    pub fn into_incoming(
        self,
    ) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static {
        use futures::StreamExt;
        tokio_stream::wrappers::ReceiverStream::new(self.handshaken).map(|(stream, _)| Ok(stream))
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
