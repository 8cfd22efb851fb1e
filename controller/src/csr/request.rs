//! Reads a CSR's `spec.request` the one way that the API server and the signer read it too.
//!
//! kube-apiserver (validation) and kube-controller-manager's signer take the PKCS#10 request
//! from the *first* PEM block that Go's `pem.Decode` accepts, skipping any text it cannot read
//! as a block (`k8s.io/kubernetes/pkg/apis/certificates/helpers.go`, `ParseCSR`). A lenient
//! reader here could check one block while the signer signs another (a malformed first block
//! that only we accept, then a second block with other groups). So [`parse`] accepts only text
//! that leaves no room for two readings:
//!
//! - exactly one PEM block of type `CERTIFICATE REQUEST`, with only ASCII whitespace before and
//!   after it, and byte for byte the canonical RFC 7468 encoding of its DER (64-column base64,
//!   `\n` line ends, no headers) — any other text is refused, so any reader finds this block
//!   and decodes the same bytes;
//! - DER that is exactly one `CertificationRequest`, with no trailing bytes;
//! - an empty attribute set (`[0]` with no content): BYOH requests no extensions and no
//!   challenge password, so any attribute at all is refused rather than interpreted.
//!
//! What is read is reduced to [`Request`], which the rules in `decide.rs` check.

use sha2::Digest as _;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer as _, GeneralName, ParsedExtension};

/// The only PEM label accepted (RFC 7468 §7), as Go's `ParseCSR` requires.
pub const PEM_LABEL: &str = "CERTIFICATE REQUEST";

/// What the PKCS#10 request says, reduced to what the rules look at.
#[derive(Debug, Default)]
pub(crate) struct Request {
    /// Every CN value of the subject, in order.
    pub common_names: Vec<String>,
    /// Every O value of the subject, in order.
    pub organizations: Vec<String>,
    /// Other subject attributes, by OID (OU, C, ...), and values that are not strings.
    pub other_subject: Vec<String>,
    /// SANs and other extensions asked for, described.
    pub extensions: Vec<String>,
    /// Attributes of the request (extension request, challenge password, ...), by OID.
    pub attributes: Vec<String>,
    /// The public key.
    pub key: Key,
    /// SHA-256 of the DER SubjectPublicKeyInfo, lowercase hex (what `openssl pkey -pubout
    /// -outform DER | sha256sum` prints for the key): the key's identity in the enrolment record.
    pub key_sha256: String,
}

/// The request's public key, as far as the rules care.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) enum Key {
    /// ECDSA on P-256.
    EcP256,
    /// ECDSA on P-384.
    EcP384,
    /// ECDSA on another curve (its OID), or without a named curve.
    EcOther(String),
    /// RSA with a modulus of `bits` bits.
    Rsa {
        /// Modulus length in bits.
        bits: usize,
    },
    /// Not read (the default before parsing).
    #[default]
    Unknown,
    /// Another algorithm (its OID) or an unreadable key.
    Other(String),
}

impl Key {
    /// Whether this is an RSA key (which may add the `key encipherment` usage).
    pub fn is_rsa(&self) -> bool {
        matches!(self, Key::Rsa { .. })
    }
}

/// Parses `spec.request` strictly (see the module documentation).
///
/// # Errors
/// A message for the Warning Event saying which rule the text breaks: not a single canonical
/// `CERTIFICATE REQUEST` PEM block, not PKCS#10 DER, trailing data after the DER.
pub(crate) fn parse(text: &[u8]) -> Result<Request, String> {
    let der = canonical_pem_der(text)?;
    let (rest, csr) = X509CertificationRequest::from_der(&der)
        .map_err(|e| format!("spec.request is not a PKCS#10 request: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "spec.request has {} bytes of data after the PKCS#10 request",
            rest.len()
        ));
    }
    read(&csr)
}

/// The DER of `text` if it is exactly one canonical RFC 7468 `CERTIFICATE REQUEST` block
/// (whitespace around it allowed).
fn canonical_pem_der(text: &[u8]) -> Result<Vec<u8>, String> {
    const RULE: &str = "spec.request must be exactly one PEM block \"-----BEGIN CERTIFICATE REQUEST-----\" in canonical RFC 7468 form (64-column base64, LF line ends, no headers, nothing before or after it but whitespace)";
    let trimmed = text.trim_ascii();
    let (label, der) =
        pem_rfc7468::decode_vec(trimmed).map_err(|e| format!("{RULE}; it is not ({e})"))?;
    if label != PEM_LABEL {
        return Err(format!("{RULE}; it is a {label:?} block"));
    }
    let canonical = pem_rfc7468::encode_string(PEM_LABEL, pem_rfc7468::LineEnding::LF, &der)
        .map_err(|e| format!("{RULE}; it cannot be re-encoded ({e})"))?;
    // The decoder skips text before the block and tolerates other wrapping; the comparison
    // refuses both: only the canonical encoding of the DER is left.
    if canonical.as_bytes().trim_ascii_end() != trimmed {
        return Err(format!(
            "{RULE}; it holds other text or another encoding of the block"
        ));
    }
    Ok(der)
}

fn read(csr: &X509CertificationRequest<'_>) -> Result<Request, String> {
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
        OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
    };
    let info = &csr.certification_request_info;
    let mut request = Request::default();
    for attr in info.subject.iter_attributes() {
        let value = attr.as_str().map(str::to_string);
        let oid = attr.attr_type();
        match value {
            Ok(v) if *oid == OID_X509_COMMON_NAME => request.common_names.push(v),
            Ok(v) if *oid == OID_X509_ORGANIZATION_NAME => request.organizations.push(v),
            Ok(v) => request
                .other_subject
                .push(format!("{}={v:?}", oid_name(oid))),
            Err(_) => request
                .other_subject
                .push(format!("{} (not a string)", oid_name(oid))),
        }
    }
    request
        .attributes
        .extend(info.iter_attributes().map(|a| oid_name(&a.oid)));
    // DER of an empty `[0]` attribute set closes the CertificationRequestInfo; the parser above
    // reads attributes up to the end of the SEQUENCE, Go only within `[0]`'s length, so this
    // makes sure both read "none".
    if request.attributes.is_empty() && !info.raw.ends_with(&[0xa0, 0x00]) {
        request
            .attributes
            .push("attribute set that is not an empty [0]".into());
    }
    if let Some(extensions) = csr.requested_extensions() {
        for ext in extensions {
            match ext {
                ParsedExtension::SubjectAlternativeName(san) => request
                    .extensions
                    .extend(san.general_names.iter().map(describe_general_name)),
                ParsedExtension::KeyUsage(_) => request.extensions.push("key usage".into()),
                ParsedExtension::ExtendedKeyUsage(_) => {
                    request.extensions.push("extended key usage".into())
                }
                ParsedExtension::BasicConstraints(_) => {
                    request.extensions.push("basic constraints".into())
                }
                other => request.extensions.push(format!("{other:?}")),
            }
        }
    }
    let spki = &info.subject_pki;
    request.key_sha256 = sha2::Sha256::digest(spki.raw)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let alg = &spki.algorithm.algorithm;
    request.key = if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| x509_parser::der_parser::oid::Oid::try_from(p.clone()).ok());
        match curve {
            Some(c) if c == OID_EC_P256 => Key::EcP256,
            Some(c) if c == OID_NIST_EC_P384 => Key::EcP384,
            Some(c) => Key::EcOther(c.to_id_string()),
            None => Key::EcOther("without named curve".into()),
        }
    } else if *alg == OID_PKCS1_RSAENCRYPTION {
        match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => Key::Rsa {
                bits: bit_length(rsa.modulus),
            },
            _ => Key::Other("unparsable RSA key".into()),
        }
    } else {
        Key::Other(alg.to_id_string())
    };
    Ok(request)
}

/// Number of bits of an unsigned big-endian integer (leading zero bytes ignored).
fn bit_length(bytes: &[u8]) -> usize {
    let trimmed: &[u8] = match bytes.iter().position(|b| *b != 0) {
        Some(i) => &bytes[i..],
        None => &[],
    };
    match trimmed.first() {
        Some(first) => trimmed.len() * 8 - first.leading_zeros() as usize,
        None => 0,
    }
}

fn describe_general_name(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(d) => format!("DNS SAN {d:?}"),
        GeneralName::IPAddress(ip) => match ip.len() {
            4 => format!(
                "IP SAN {}",
                std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])
            ),
            _ => "IP SAN".to_string(),
        },
        GeneralName::RFC822Name(e) => format!("email SAN {e:?}"),
        GeneralName::URI(u) => format!("URI SAN {u:?}"),
        other => format!("SAN {other:?}"),
    }
}

fn oid_name(oid: &x509_parser::der_parser::oid::Oid<'_>) -> String {
    use x509_parser::oid_registry::*;
    let known = [
        (OID_X509_ORGANIZATIONAL_UNIT, "OU"),
        (OID_X509_COUNTRY_NAME, "C"),
        (OID_X509_LOCALITY_NAME, "L"),
        (OID_X509_STATE_OR_PROVINCE_NAME, "ST"),
        (OID_X509_SERIALNUMBER, "serialNumber"),
        (OID_PKCS9_EMAIL_ADDRESS, "emailAddress"),
        (OID_PKCS9_CHALLENGE_PASSWORD, "challengePassword"),
        (OID_PKCS9_EXTENSION_REQUEST, "extensionRequest"),
    ];
    known
        .iter()
        .find(|(k, _)| k == oid)
        .map_or_else(|| oid.to_id_string(), |(_, n)| (*n).to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An agent-shaped request for `cn`/`o` (rcgen, as `byoh-agent` makes it).
    fn pem(cn: &str, o: &str) -> String {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, cn);
        dn.push(rcgen::DnType::OrganizationName, o);
        params.distinguished_name = dn;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn der_of(pem: &str) -> Vec<u8> {
        pem_rfc7468::decode_vec(pem.as_bytes()).unwrap().1
    }

    fn wrap(der: &[u8], width: usize, eol: &str) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(width)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN CERTIFICATE REQUEST-----{eol}{}{eol}-----END CERTIFICATE REQUEST-----{eol}",
            lines.join(eol)
        )
    }

    #[test]
    fn the_canonical_block_is_read_with_whitespace_around_it() {
        let good = pem("byoh:host:a", "byoh:hosts");
        let r = parse(good.as_bytes()).unwrap();
        assert_eq!(r.common_names, ["byoh:host:a"]);
        assert_eq!(r.organizations, ["byoh:hosts"]);
        assert!(r.attributes.is_empty() && r.extensions.is_empty());
        assert_eq!(r.key, Key::EcP256);
        let spaced = format!("\n\n  {}\n\t\n", good.trim_end());
        assert!(parse(spaced.as_bytes()).is_ok());
        // The same DER, re-wrapped by hand at 64 columns, is the canonical form.
        assert!(parse(wrap(&der_of(&good), 64, "\n").as_bytes()).is_ok());
    }

    /// Every text that Go's `pem.Decode` could read differently, or that is not canonical, is
    /// refused before any rule is looked at.
    #[test]
    fn non_canonical_or_ambiguous_texts_are_refused() {
        let good = pem("byoh:host:a", "byoh:hosts");
        let evil = pem("byoh:host:a", "kubeadm:cluster-admins");
        let body = |p: &str| {
            p.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let der = der_of(&good);
        let mut der_trailing = der.clone();
        der_trailing.extend_from_slice(&[0x05, 0x00]);
        let cases: Vec<(&str, String)> = vec![
            (
                "malformed BEGIN line, then the evil block",
                format!(
                    "{}{evil}",
                    good.replacen("REQUEST-----", "REQUEST-----x", 1)
                ),
            ),
            (
                "END line of another type, then the evil block",
                format!(
                    "{}{evil}",
                    good.replace("END CERTIFICATE REQUEST", "END CERTIFICATE")
                ),
            ),
            ("two blocks, good first", format!("{good}{evil}")),
            ("two blocks, evil first", format!("{evil}{good}")),
            ("text before the block", format!("explanatory text\n{good}")),
            ("text after the block", format!("{good}trailing text\n")),
            (
                "PEM headers",
                good.replacen(
                    "REQUEST-----\n",
                    "REQUEST-----\nProc-Type: 4,ENCRYPTED\n\n",
                    1,
                ),
            ),
            (
                "a CERTIFICATE block after it",
                format!(
                    "{good}-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    body(&evil)
                ),
            ),
            (
                "a block of another type",
                good.replace("CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST"),
            ),
            ("76-column base64", wrap(&der, 76, "\n")),
            ("CRLF line ends", wrap(&der, 64, "\r\n")),
            ("DER with trailing bytes", wrap(&der_trailing, 64, "\n")),
            ("NUL byte before", format!("\0{good}")),
            ("space inside the base64", good.replacen("\nMI", "\n MI", 1)),
            ("empty", String::new()),
        ];
        assert!(cases.len() >= 10);
        for (what, text) in cases {
            let err = parse(text.as_bytes()).err();
            assert!(err.is_some(), "{what}: accepted:\n{text}");
        }
    }

    #[test]
    fn bit_lengths() {
        assert_eq!(bit_length(&[0, 0x80, 0]), 16);
        assert_eq!(bit_length(&[0x01, 0]), 9);
        assert_eq!(bit_length(&[]), 0);
    }
}
