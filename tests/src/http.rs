//! A loopback HTTP file server for installer tests: serves fixed bodies on 127.0.0.1 (test hosts
//! share the test machine's network namespace, so they reach it too) and counts the requests
//! per path, so a test can show that a download happened exactly once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A running server; it stops when the test's runtime ends.
#[derive(Clone)]
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
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", l.local_addr()?);
        let hits: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let counter = hits.clone();
        let files = Arc::new(files);
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let files = files.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let req = String::from_utf8_lossy(&buf);
                    let path = req.split_whitespace().nth(1).unwrap_or("/");
                    // As web servers do: `/./` is `/` (apt asks for `Filename: ./x.deb`
                    // of a flat repository as `<base>/./x.deb`).
                    let path = path.split('?').next().unwrap_or("/").replace("/./", "/");
                    if let Ok(mut h) = counter.lock() {
                        *h.entry(path.clone()).or_default() += 1;
                    }
                    let resp = match files.iter().find(|(p, _)| *p == path) {
                        Some((_, body)) => {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(body);
                            r
                        }
                        None => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_vec(),
                    };
                    let _ = s.write_all(&resp).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Ok(FileServer { base, hits })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
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
