//! `write_files` `encoding`: the aliases of cloud-init's `cc_write_files.canonicalize_extraction`
//! (matched after trimming, case-insensitive) and the decoding of each.
//!
//! - `b64`, `base64` → base64;
//! - `gz`, `gzip` → gzip: the content's bytes (normally given as YAML `!!binary`, which YAML
//!   already base64-decodes) are gunzipped;
//! - `gz+base64`, `gzip+base64`, `gz+b64`, `gzip+b64` → base64, then gunzip;
//! - `text/plain`, or no encoding → the content as is.
//!
//! cloud-init logs a warning for any other value and writes the content as plain text; this
//! agent refuses it instead. Gzip streams are fully checked (CRC-32 and length trailer) and
//! bounded by [`super::MAX_FILE_BYTES`].

use base64::Engine as _;
use std::io::Read as _;

/// A canonical `write_files` encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No decoding (`text/plain`, or none given).
    Plain,
    /// Base64 (`b64`, `base64`).
    Base64,
    /// Gzip (`gz`, `gzip`).
    Gzip,
    /// Base64, then gzip (`gz+base64`, `gzip+base64`, `gz+b64`, `gzip+b64`).
    GzipBase64,
}

/// Every accepted spelling (lower case).
pub const ENCODING_ALIASES: &[&str] = &[
    "b64",
    "base64",
    "gz",
    "gzip",
    "gz+base64",
    "gzip+base64",
    "gz+b64",
    "gzip+b64",
    "text/plain",
];

impl Encoding {
    /// Parses an `encoding` value; `None` for an unknown one.
    pub fn parse(value: &str) -> Option<Encoding> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text/plain" => Some(Encoding::Plain),
            "b64" | "base64" => Some(Encoding::Base64),
            "gz" | "gzip" => Some(Encoding::Gzip),
            "gz+base64" | "gzip+base64" | "gz+b64" | "gzip+b64" => Some(Encoding::GzipBase64),
            _ => None,
        }
    }

    /// The canonical name, as shown by `cloud-config validate`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Plain => "text/plain",
            Encoding::Base64 => "base64",
            Encoding::Gzip => "gzip",
            Encoding::GzipBase64 => "gzip+base64",
        }
    }

    /// Decodes `data` (the content's bytes) to at most `limit` bytes; `limit_is` says what the
    /// limit is in the error (e.g. `the limit per file`). Gzip is inflated here only to check
    /// it (CRC-32, length, the limit) and count its bytes, into nothing: [`Decoded`] inflates
    /// it again while the file is written. The error message never holds content.
    pub(crate) fn decode(
        self,
        data: &[u8],
        limit: usize,
        limit_is: &str,
    ) -> Result<Decoded, String> {
        let decoded = match self {
            Encoding::Plain => Decoded::stored(data.to_vec()),
            Encoding::Base64 => Decoded::stored(base64_decode(data)?),
            Encoding::Gzip => Decoded::gzip(data.to_vec(), limit)?,
            Encoding::GzipBase64 => Decoded::gzip(base64_decode(data)?, limit)?,
        };
        if decoded.len > limit {
            return Err(format!(
                "decoded content is larger than {limit} bytes, {limit_is}"
            ));
        }
        Ok(decoded)
    }
}

/// A `write_files` entry's content, checked, streamed when the file is written: what it holds
/// in memory is at most the entry's size in the document (which is at most 1 MiB), never its
/// decoded size — a gzip entry of the 64 MiB limit stays compressed until it is written.
#[derive(Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The bytes as they are written, or for gzip the compressed stream.
    stored: Vec<u8>,
    /// `stored` is a gzip stream, already checked whole.
    gzip: bool,
    /// The decoded size in bytes.
    len: usize,
}

impl std::fmt::Debug for Decoded {
    // Never prints the content.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("len", &self.len)
            .field("gzip", &self.gzip)
            .finish()
    }
}

impl Decoded {
    fn stored(stored: Vec<u8>) -> Decoded {
        Decoded {
            len: stored.len(),
            stored,
            gzip: false,
        }
    }

    fn gzip(stored: Vec<u8>, limit: usize) -> Result<Decoded, String> {
        let len = gunzip_len(&stored, limit)?;
        Ok(Decoded {
            stored,
            gzip: true,
            len,
        })
    }

    /// The decoded size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the decoded content is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The decoded content as a stream (gzip inflated as it is read, 32 KiB of window).
    pub fn reader(&self) -> Box<dyn std::io::Read + Send + '_> {
        if self.gzip {
            Box::new(flate2::read::MultiGzDecoder::new(&self.stored[..]))
        } else {
            Box::new(&self.stored[..])
        }
    }

    /// The decoded content in memory (for small contents and tests).
    ///
    /// # Errors
    /// Never for a checked gzip stream; the I/O error of the decoder otherwise.
    pub fn bytes(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.len);
        self.reader().read_to_end(&mut out)?;
        Ok(out)
    }
}

/// Base64 (standard alphabet) ignoring ASCII whitespace, as YAML `!!binary` and Python's
/// `b64decode` of a multi-line value.
pub(crate) fn base64_decode(data: &[u8]) -> Result<Vec<u8>, String> {
    let compact: Vec<u8> = data
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(&compact)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(&compact))
        .map_err(|e| format!("content is not valid base64 ({e})"))
}

/// The decoded size of gzip stream `data`, inflated into nothing; at most `limit` + 1 bytes
/// are inflated (the caller refuses more than `limit`).
fn gunzip_len(data: &[u8], limit: usize) -> Result<usize, String> {
    if data.len() < 2 || data[..2] != [0x1f, 0x8b] {
        return Err("content is not gzip data (no gzip header)".into());
    }
    let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
    let n = std::io::copy(
        &mut flate2::read::MultiGzDecoder::new(data).take(limit_u64.saturating_add(1)),
        &mut std::io::sink(),
    )
    .map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "the stream is truncated".to_string(),
            _ => e.to_string(),
        };
        format!("content is not a valid gzip stream: {why}")
    })?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    const HELLO_GZ_B64: &str = "H4sIAAAAAAAC/8tIzcnJ5wIAIDA6NgYAAAA=";

    #[test]
    fn every_alias_case_insensitive() {
        for a in ENCODING_ALIASES {
            assert!(Encoding::parse(a).is_some(), "{a}");
            assert!(Encoding::parse(&a.to_uppercase()).is_some(), "{a}");
            assert!(Encoding::parse(&format!(" {a} ")).is_some(), "{a}");
        }
        assert_eq!(Encoding::parse("B64"), Some(Encoding::Base64));
        assert_eq!(Encoding::parse("Gz+B64"), Some(Encoding::GzipBase64));
        assert_eq!(Encoding::parse("gzip"), Some(Encoding::Gzip));
        assert_eq!(Encoding::parse(""), Some(Encoding::Plain));
        for bad in ["base-64", "base32", "gzip+base-64", "plain", "text", "zstd"] {
            assert_eq!(Encoding::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn decodes_to_the_same_bytes() {
        let gz = base64_decode(HELLO_GZ_B64.as_bytes()).unwrap();
        assert_eq!(
            Encoding::GzipBase64
                .decode(HELLO_GZ_B64.as_bytes(), 100, "the limit")
                .unwrap()
                .bytes()
                .unwrap(),
            b"hello\n"
        );
        assert_eq!(
            Encoding::Base64
                .decode(b"aGVs\n bG8K\n", 100, "the limit")
                .unwrap()
                .bytes()
                .unwrap(),
            b"hello\n"
        );
        assert_eq!(
            Encoding::Gzip
                .decode(&gz, 100, "the limit")
                .unwrap()
                .bytes()
                .unwrap(),
            b"hello\n"
        );
        assert_eq!(
            Encoding::Plain
                .decode(b"hello\n", 100, "the limit")
                .unwrap()
                .bytes()
                .unwrap(),
            b"hello\n"
        );
    }

    #[test]
    fn gzip_integrity_is_checked() {
        let mut gz = base64_decode(HELLO_GZ_B64.as_bytes()).unwrap();
        // Truncated (case 01's e.conf): no trailer.
        let e = Encoding::GzipBase64
            .decode(b"H4sIAAAAAAAC/8tIzcnJVyjPL8o=", 100, "the limit")
            .unwrap_err();
        assert!(e.contains("gzip"), "{e}");
        // Wrong CRC.
        let n = gz.len();
        gz[n - 8] ^= 0xff;
        assert!(Encoding::Gzip.decode(&gz, 100, "the limit").is_err());
        // Wrong length.
        let mut gz2 = base64_decode(HELLO_GZ_B64.as_bytes()).unwrap();
        gz2[n - 4] ^= 0x01;
        assert!(Encoding::Gzip.decode(&gz2, 100, "the limit").is_err());
        // Not gzip at all.
        assert!(
            Encoding::Gzip
                .decode(b"hello", 100, "the limit")
                .unwrap_err()
                .contains("no gzip header")
        );
        assert!(Encoding::Base64.decode(b"!!!", 100, "the limit").is_err());
    }

    #[test]
    fn decoded_size_is_bounded() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&vec![0u8; 10_000]).unwrap();
        let gz = enc.finish().unwrap();
        assert!(
            Encoding::Gzip
                .decode(&gz, 1000, "the limit")
                .unwrap_err()
                .contains("larger than 1000")
        );
        assert_eq!(
            Encoding::Gzip
                .decode(&gz, 10_000, "the limit")
                .unwrap()
                .len(),
            10_000
        );
        assert!(Encoding::Plain.decode(&[1; 11], 10, "the limit").is_err());
    }

    #[test]
    fn gzip_content_stays_compressed_until_it_is_read() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        enc.write_all(&data).unwrap();
        let gz = enc.finish().unwrap();
        let d = Encoding::Gzip.decode(&gz, 4_000_000, "the limit").unwrap();
        assert_eq!(d.len(), 4_000_000);
        assert_eq!(d.stored.len(), gz.len(), "held compressed");
        assert!(gz.len() < 100_000);
        let mut streamed = Vec::new();
        d.reader().read_to_end(&mut streamed).unwrap();
        assert!(streamed == data);
    }
}
