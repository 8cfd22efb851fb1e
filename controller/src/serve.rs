//! The controller's HTTP endpoints, on a minimal hyper 1 HTTP/1 server (hyper is in the tree
//! through kube, so no web framework comes with it), as Cluster API's managers lay theirs out:
//!
//! - the health probes, `GET /healthz` (the process serves requests) and `GET /readyz` (the
//!   caches of ByoHosts, Leases and ByoMachines are filled, so reconciles see the whole pool),
//!   plain HTTP on `--health-probe-address` (default `:9440`), for the kubelet;
//! - `GET /metrics` (OpenMetrics text) on `--metrics-address` (default `:8443`): over HTTPS, each
//!   request's bearer token authenticated and authorized by the API server
//!   ([`crate::metrics_auth`]), or plain and open to anyone who can connect with
//!   `--insecure-metrics`.
//!
//! Any other path is 404.

use crate::metrics::Metrics;
use crate::metrics_auth::MetricsAuth;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;

/// Errors of the HTTP servers.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error(
        "binding {addr}: {source} (choose another --metrics-address or --health-probe-address)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The metrics server's TLS certificate could not be made.
    #[error(transparent)]
    Tls(#[from] crate::metrics_auth::CertificateError),
}

/// What one server answers.
#[derive(Clone, Default)]
pub struct Endpoints {
    /// Serve `/metrics` from these.
    pub metrics: Option<Arc<Metrics>>,
    /// Serve `/healthz`, and `/readyz` from this flag (set once the caches are filled).
    pub ready: Option<Arc<AtomicBool>>,
    /// Serve over TLS and let only authorized callers read `/metrics`.
    pub guard: Option<Arc<MetricsAuth>>,
}

/// Binds `addr` and serves `endpoints` until `shutdown` resolves. Returns the bound address
/// (useful with port 0) and the server task.
///
/// # Errors
/// [`ServeError::Bind`] when the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    endpoints: Endpoints,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection on {bound}");
                        continue;
                    }
                },
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                match endpoints.guard.clone() {
                    Some(guard) => match guard.acceptor().accept(stream).await {
                        Ok(tls) => connection(tls, endpoints).await,
                        Err(e) => tracing::debug!(error = %e, "TLS handshake on {bound}"),
                    },
                    None => connection(stream, endpoints).await,
                }
            });
        }
    });
    Ok((bound, task))
}

/// Serves HTTP/1 requests on one connection.
async fn connection<S>(io: S, endpoints: Endpoints)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let endpoints = endpoints.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(&req, &endpoints).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(error = %e, "HTTP connection");
    }
}

async fn respond(
    req: &Request<hyper::body::Incoming>,
    endpoints: &Endpoints,
) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain";
    match (req.uri().path(), &endpoints.metrics, &endpoints.ready) {
        ("/metrics", Some(metrics), _) => {
            if let Some(guard) = &endpoints.guard
                && let Err(denied) = guard.check(req.headers(), "/metrics").await
            {
                return response(denied.status, TEXT, format!("{}\n", denied.message));
            }
            response(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        }
        ("/healthz", _, Some(_)) => response(StatusCode::OK, TEXT, "ok\n".into()),
        ("/readyz", _, Some(ready)) if ready.load(Ordering::Relaxed) => {
            response(StatusCode::OK, TEXT, "ok\n".into())
        }
        ("/readyz", _, Some(_)) => response(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "caches not synced\n".into(),
        ),
        _ => response(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_health_and_metrics_each_where_asked() {
        let ready = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rx = futures::FutureExt::shared(async move {
            let _ = rx.await;
        });
        let (health, health_task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints {
                ready: Some(ready.clone()),
                ..Default::default()
            },
            rx.clone(),
        )
        .await
        .unwrap();
        let (metrics, metrics_task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints {
                metrics: Some(Arc::new(Metrics::new())),
                ..Default::default()
            },
            rx,
        )
        .await
        .unwrap();
        assert!(get(health, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(health, "/readyz").await.starts_with("HTTP/1.1 503"));
        ready.store(true, Ordering::Relaxed);
        assert!(get(health, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(health, "/metrics").await.starts_with("HTTP/1.1 404"));
        assert!(
            get(metrics, "/metrics")
                .await
                .contains("byoh_controller_claim_conflicts_total")
        );
        assert!(get(metrics, "/healthz").await.starts_with("HTTP/1.1 404"));
        let _ = tx.send(());
        health_task.await.unwrap();
        metrics_task.await.unwrap();
    }
}
