//! The tests' one loopback HTTP(S) file server: serves fixed bodies or the files of a directory
//! (streamed from disk) on 127.0.0.1 (test hosts share the test machine's network namespace, so
//! they reach it too) and counts the requests per path, so a test can show that a download
//! happened exactly once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What a path serves: a body held in memory, or a file read from disk on each request.
enum Body {
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// A running server; it stops when the test's runtime ends.
#[derive(Clone, Debug)]
pub struct FileServer {
    base: String,
    hits: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl FileServer {
    /// Serves `files` (URL path → body; the query string is ignored) over HTTP/1.1 on an
    /// ephemeral port of 127.0.0.1; other paths get 404.
    ///
    /// Errors when the port cannot be bound.
    pub async fn start(files: Vec<(String, Vec<u8>)>) -> anyhow::Result<FileServer> {
        Self::serve(bodies(files), None, "127.0.0.1").await
    }

    /// Like [`FileServer::start`], on loopback address `ip` (e.g. `127.0.0.2`, which hosts on
    /// the test network cannot reach: only 127.0.0.1 is forwarded to them).
    ///
    /// Errors when the port cannot be bound.
    pub async fn start_at(ip: &str, files: Vec<(String, Vec<u8>)>) -> anyhow::Result<FileServer> {
        Self::serve(bodies(files), None, ip).await
    }

    /// Serves every regular file of `dir` (flat: `GET /<name>`; names starting with `.` are
    /// not served), streamed from disk, over HTTP/1.1 on an ephemeral port of 127.0.0.1.
    ///
    /// Errors when `dir` cannot be read or the port cannot be bound.
    pub async fn start_dir(dir: &Path) -> anyhow::Result<FileServer> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type()?.is_file() && !name.starts_with('.') {
                files.push((format!("/{name}"), Body::File(entry.path())));
            }
        }
        Self::serve(files, None, "127.0.0.1").await
    }

    /// Like [`FileServer::start`], over HTTPS with a certificate of `ca` for 127.0.0.1 and the
    /// test network's gateway ([`crate::hosts::NETWORK_GATEWAY`]).
    ///
    /// Errors when the port cannot be bound or the certificate cannot be made.
    pub async fn start_tls(
        files: Vec<(String, Vec<u8>)>,
        ca: &TestCa,
    ) -> anyhow::Result<FileServer> {
        Self::start_tls_at("127.0.0.1", files, ca).await
    }

    /// Like [`FileServer::start_tls`], on loopback address `ip`, with a certificate for `ip`
    /// and the test network's gateway.
    ///
    /// Errors when the port cannot be bound or the certificate cannot be made.
    pub async fn start_tls_at(
        ip: &str,
        files: Vec<(String, Vec<u8>)>,
        ca: &TestCa,
    ) -> anyhow::Result<FileServer> {
        let (chain, key) =
            ca.server_certificate(&[ip.to_string(), crate::hosts::NETWORK_GATEWAY.to_string()])?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Self::serve(
            bodies(files),
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            ip,
        )
        .await
    }

    async fn serve(
        files: Vec<(String, Body)>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        ip: &str,
    ) -> anyhow::Result<FileServer> {
        let l = tokio::net::TcpListener::bind((ip, 0)).await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{}", l.local_addr()?);
        let hits: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let counter = hits.clone();
        let files = Arc::new(files);
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                let files = files.clone();
                let counter = counter.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => answer(tcp, &files, &counter).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                answer(stream, &files, &counter).await;
                            }
                        }
                    }
                });
            }
        });
        Ok(FileServer { base, hits })
    }

    /// The base URL as hosts on the test network (booted with `network`) reach it: the
    /// gateway address instead of 127.0.0.1 (`tests/hosts/network` forwards it to loopback).
    pub fn base_on_network(&self) -> String {
        self.base
            .replace("127.0.0.1", &crate::hosts::NETWORK_GATEWAY.to_string())
    }

    /// `http://IP:PORT` (127.0.0.1 unless [`FileServer::start_at`]), without a trailing slash.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// How many requests asked for `path` so far.
    pub fn hits(&self, path: &str) -> usize {
        self.hits
            .lock()
            .map(|h| h.get(path).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// Reads an HTTP/1.1 request head (at most 64 KiB) from `s` and returns its path without the
/// query string; `None` when the connection ends first or the head is too long.
pub async fn request_path<S>(s: &mut S) -> Option<String>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
    let req = String::from_utf8_lossy(&buf);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    Some(path.split('?').next().unwrap_or("/").to_string())
}

fn bodies(files: Vec<(String, Vec<u8>)>) -> Vec<(String, Body)> {
    files
        .into_iter()
        .map(|(path, body)| (path, Body::Bytes(body)))
        .collect()
}

const NOT_FOUND: &[u8] =
    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Answers one HTTP/1.1 request on `s` from `files`, counting it in `counter`.
async fn answer<S>(mut s: S, files: &[(String, Body)], counter: &Mutex<BTreeMap<String, usize>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Some(path) = request_path(&mut s).await else {
        return;
    };
    // As web servers do: `/./` is `/` (apt asks for `Filename: ./x.deb` of a flat repository
    // as `<base>/./x.deb`).
    let path = path.replace("/./", "/");
    if let Ok(mut h) = counter.lock() {
        *h.entry(path.clone()).or_default() += 1;
    }
    let head =
        |len: u64| format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n");
    match files.iter().find(|(p, _)| *p == path).map(|(_, b)| b) {
        Some(Body::Bytes(body)) => {
            let mut r = head(body.len() as u64).into_bytes();
            r.extend_from_slice(body);
            let _ = s.write_all(&r).await;
        }
        Some(Body::File(file)) => match tokio::fs::File::open(file).await {
            Ok(mut f) => {
                let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
                if s.write_all(head(len).as_bytes()).await.is_ok() {
                    let _ = tokio::io::copy(&mut f, &mut s).await;
                }
            }
            Err(_) => {
                let _ = s.write_all(NOT_FOUND).await;
            }
        },
        None => {
            let _ = s.write_all(NOT_FOUND).await;
        }
    }
    let _ = s.shutdown().await;
}

/// A throwaway certificate authority (ECDSA P-256), as a site's private CA: hosts trust it
/// (e.g. `/usr/local/share/ca-certificates`), servers of the test present certificates it
/// issued.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A new CA named `name`.
    ///
    /// Errors when rcgen fails.
    pub fn new(name: &str) -> anyhow::Result<TestCa> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        Ok(TestCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key)?,
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (IP addresses or DNS names) and its key.
    ///
    /// Errors when rcgen fails.
    pub fn server_certificate(
        &self,
        names: &[String],
    ) -> anyhow::Result<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let leaf = rcgen::CertificateParams::new(names.to_vec())?.signed_by(&key, &self.issuer)?;
        Ok((
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        ))
    }
}

/// Lower-case hex sha256 of `data` (with `sha256sum`, as an operator computes it).
///
/// Errors when `sha256sum` cannot run.
pub fn sha256(data: &[u8]) -> anyhow::Result<String> {
    let dir = tempfile_dir()?;
    let p = dir.join("f");
    std::fs::write(&p, data)?;
    let out = std::process::Command::new("sha256sum").arg(&p).output()?;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(out.status.success(), "sha256sum failed");
    Ok(String::from_utf8(out.stdout)?
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "byoh-sha256-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
