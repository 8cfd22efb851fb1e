//! The agent's Prometheus metrics on `[agent] metrics_address` (off unless set): `GET /metrics`
//! (OpenMetrics text, crate `prometheus-client`) and `GET /healthz`. Served by a minimal hyper 1
//! HTTP/1 server (hyper is already in the tree through kube).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The agent's metrics (prefix `byoh_agent`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `byoh_agent_lease_renewals_total`: Lease renewals that succeeded.
    pub lease_renewals: Counter,
    /// `byoh_agent_lease_renewal_failures_total`: Lease renewals that failed (API unreachable).
    pub lease_renewal_failures: Counter,
    /// `byoh_agent_host_work_failures_total`: host-work rounds that failed and were retried.
    pub host_work_failures: Counter,
    /// `byoh_agent_certificate_expiry_timestamp_seconds`: when the host certificate expires
    /// (Unix time; 0 when the agent uses a given kubeconfig).
    pub certificate_expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("byoh_agent");
        let m = Metrics {
            lease_renewals: Counter::default(),
            lease_renewal_failures: Counter::default(),
            host_work_failures: Counter::default(),
            certificate_expiry: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "lease_renewals",
            "Lease renewals that succeeded",
            m.lease_renewals.clone(),
        );
        registry.register(
            "lease_renewal_failures",
            "Lease renewals that failed",
            m.lease_renewal_failures.clone(),
        );
        registry.register(
            "host_work_failures",
            "Host-work rounds that failed and were retried",
            m.host_work_failures.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the host client certificate expires (Unix time)",
            m.certificate_expiry.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail (fmt::Write for String is infallible).
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` on a background task; returns the bound
/// address (useful with port 0).
///
/// # Errors
/// The I/O error when the address cannot be bound (fix `[agent] metrics_address`).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let response = respond(req.uri().path(), &metrics);
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn respond(path: &str, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
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

    #[tokio::test]
    async fn serves_metrics_and_health_over_http() {
        let m = Arc::new(Metrics::new());
        m.lease_renewals.inc();
        m.certificate_expiry.set(1_800_000_000);
        let addr = serve("127.0.0.1:0".parse().unwrap(), m.clone())
            .await
            .unwrap();
        let get = |path: &str| {
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(request.as_bytes()).await.unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).await.unwrap();
                let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
                let body = text
                    .split_once("\r\n\r\n")
                    .map(|(_, b)| b.to_string())
                    .unwrap_or_default();
                (status, body)
            }
        };
        let (status, body) = get("/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("byoh_agent_lease_renewals_total 1"), "{body}");
        assert!(
            body.contains("byoh_agent_certificate_expiry_timestamp_seconds 1800000000"),
            "{body}"
        );
        assert!(
            body.contains("byoh_agent_lease_renewal_failures_total 0"),
            "{body}"
        );
        assert_eq!(get("/healthz").await, (200, "ok\n".to_string()));
        assert_eq!(get("/nope").await.0, 404);
    }
}
