//! Which machine a ByoHost belongs to, so that a clone of a registered host (same hostname, same
//! `/var/lib/byoh` with the host's key and certificate) does not take over its ByoHost.
//!
//! The agent records a [`HostIdentity`] in `status.identity` at its first registration and, on
//! every start and on every change of the ByoHost, compares it with the facts of the host it runs
//! on ([`decide`], a pure function). A machine that differs refuses to act: it writes nothing,
//! renews no Lease and runs no host work ([`CloneRefused`]).
//!
//! Facts: `/etc/machine-id` (machine-id(5)) and, when readable, the SMBIOS system UUID
//! `/sys/class/dmi/id/product_uuid` (kubeadm checks it for node uniqueness; hypervisors give
//! each VM its own), both read under the agent's filesystem root and published only as keyed
//! hashes; and the SHA-256 fingerprint of the public key of the host's client certificate.

use crate::installer::download::hex;
use byoh_api::byohost::HostIdentity;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Application ID that keys the published hashes, so they cannot be correlated with the hashes
/// other software publishes of the same machine ID (the construction of
/// sd_id128_get_machine_app_specific(3): HMAC-SHA256 keyed with the machine ID over a fixed
/// application ID). Never change it: every recorded identity would stop matching.
pub const APP_ID: &[u8; 16] = b"\x6d\xb3\x5f\x0d\x74\xad\x4e\x6e\x8d\xf3\x10\xe1\x72\xe4\x45\x84";

/// `/etc/machine-id`, relative to the filesystem root.
pub const MACHINE_ID_PATH: &str = "etc/machine-id";
/// The SMBIOS system UUID, relative to the filesystem root (readable by root only).
pub const PRODUCT_UUID_PATH: &str = "sys/class/dmi/id/product_uuid";

/// Errors while reading the identity facts of this host.
#[derive(Debug, thiserror::Error)]
pub enum HostIdError {
    /// `/etc/machine-id` is missing, unreadable or empty.
    #[error(
        "reading the machine ID {}: {message}; every systemd host has one (machine-id(5)); create it with systemd-machine-id-setup and start byoh-agent again",
        path.display()
    )]
    MachineId {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

/// A fact that differs between the recorded identity and this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The machine-id hashes differ.
    MachineId,
    /// The product_uuid hashes differ.
    ProductUuid,
    /// A product_uuid was recorded but this host has none readable.
    ProductUuidMissing,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Difference::MachineId => "its /etc/machine-id differs",
            Difference::ProductUuid => "its SMBIOS product_uuid differs",
            Difference::ProductUuidMissing => {
                "a product_uuid was recorded but this host has none readable"
            }
        })
    }
}

/// What to do with the identity recorded on the ByoHost, given this host's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing recorded yet (first registration, or registered by an agent that recorded
    /// nothing): record this host's identity.
    Record,
    /// Same machine, same key: nothing to change.
    Match,
    /// Same machine, another key or one newly known (a re-enrolled host): update the record.
    KeyChanged,
    /// Another machine: refuse to act on the ByoHost.
    Mismatch(Vec<Difference>),
}

impl Decision {
    /// Whether the agent may act on the ByoHost (everything but [`Decision::Mismatch`]).
    pub fn allows_acting(&self) -> bool {
        !matches!(self, Decision::Mismatch(_))
    }
}

/// Compares the identity recorded on the ByoHost with this host's.
///
/// The machine is the same when the machine-id hashes are equal and the product_uuid hashes are
/// equal where one was recorded (a recorded product_uuid that is not readable here counts as a
/// difference: fail closed). A product_uuid readable here but not recorded is learned, not a
/// difference. The key fingerprint never makes a mismatch.
pub fn decide(recorded: Option<&HostIdentity>, here: &HostIdentity) -> Decision {
    let Some(recorded) = recorded else {
        return Decision::Record;
    };
    let mut differs = Vec::new();
    if recorded.machine_id_hash != here.machine_id_hash {
        differs.push(Difference::MachineId);
    }
    match (&recorded.product_uuid_hash, &here.product_uuid_hash) {
        (Some(r), Some(h)) if r != h => differs.push(Difference::ProductUuid),
        (Some(_), None) => differs.push(Difference::ProductUuidMissing),
        _ => {}
    }
    if !differs.is_empty() {
        Decision::Mismatch(differs)
    } else if recorded != here {
        Decision::KeyChanged
    } else {
        Decision::Match
    }
}

/// An agent on a machine other than the one that registered the ByoHost refuses to act.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to act as ByoHost {namespace}/{name}: this machine is not the one that registered it ({}), so it is probably a clone of that host (same name, copy of {state_dir}); nothing was written, no Lease renewed and no host work run. Give the clone its own name and identity: stop byoh-agent, remove {state_dir}, set a new [host] name in /etc/byoh/agent.toml, enrol it with a new bootstrap token (/etc/byoh/bootstrap-kubeconfig) and start byoh-agent again (see docs/security.md)",
    differences.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
    state_dir = state_dir.display()
)]
pub struct CloneRefused {
    /// Namespace of the ByoHost.
    pub namespace: String,
    /// Name of the ByoHost.
    pub name: String,
    /// What differs.
    pub differences: Vec<Difference>,
    /// The agent's state directory (`[agent] state_dir`).
    pub state_dir: PathBuf,
}

/// Checks the ByoHost `namespace/name` as read from the API server against this host.
///
/// # Errors
/// [`CloneRefused`] when [`decide`] says [`Decision::Mismatch`].
pub fn check(
    host: &byoh_api::ByoHost,
    here: &HostIdentity,
    state_dir: &Path,
) -> Result<Decision, CloneRefused> {
    let recorded = host.status.as_ref().and_then(|s| s.identity.as_ref());
    match decide(recorded, here) {
        Decision::Mismatch(differences) => Err(CloneRefused {
            namespace: host.metadata.namespace.clone().unwrap_or_default(),
            name: host.metadata.name.clone().unwrap_or_default(),
            differences,
            state_dir: state_dir.to_path_buf(),
        }),
        decision => Ok(decision),
    }
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key` (the `hmac` crate).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use hmac::Mac as _;
    #[allow(clippy::expect_used)] // provably infallible: HMAC takes keys of any length
    let mut mac =
        hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// The published form of a machine fact: HMAC-SHA256 keyed with the fact (trimmed,
/// lower-cased) over [`APP_ID`], in lower-case hex.
pub fn keyed_hash(fact: &str) -> String {
    hex(&hmac_sha256(
        fact.trim().to_ascii_lowercase().as_bytes(),
        APP_ID,
    ))
}

/// SHA-256 of the DER SubjectPublicKeyInfo of the first certificate in `cert_pem`, lower-case
/// hex; `None` if it is not a PEM certificate.
pub fn key_fingerprint(cert_pem: &[u8]) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(hex(&Sha256::digest(cert.public_key().raw)))
}

/// Reads this host's identity under `root` (`/` in production): the machine ID (required), the
/// product_uuid (when readable and not all zeros, as some firmware reports), and the fingerprint
/// of `cert_pem`, the client certificate the agent authenticates with, if any.
///
/// # Errors
/// [`HostIdError::MachineId`] when `<root>/etc/machine-id` cannot be read or is empty.
pub fn gather(root: &Path, cert_pem: Option<&[u8]>) -> Result<HostIdentity, HostIdError> {
    let path = root.join(MACHINE_ID_PATH);
    let machine_id = std::fs::read_to_string(&path).map_err(|e| HostIdError::MachineId {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if machine_id.trim().is_empty() {
        return Err(HostIdError::MachineId {
            path,
            message: "the file is empty".into(),
        });
    }
    let product_uuid = std::fs::read_to_string(root.join(PRODUCT_UUID_PATH))
        .ok()
        .filter(|u| {
            u.trim()
                .chars()
                .any(|c| c.is_ascii_alphanumeric() && c != '0')
        });
    Ok(HostIdentity {
        machine_id_hash: keyed_hash(&machine_id),
        product_uuid_hash: product_uuid.as_deref().map(keyed_hash),
        key_fingerprint: cert_pem.and_then(key_fingerprint),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(machine: &str, uuid: Option<&str>, key: Option<&str>) -> HostIdentity {
        HostIdentity {
            machine_id_hash: machine.into(),
            product_uuid_hash: uuid.map(Into::into),
            key_fingerprint: key.map(Into::into),
        }
    }

    #[test]
    fn decision_table() {
        use Decision::*;
        use Difference::*;
        let here = id("m1", Some("u1"), Some("k1"));
        for (what, recorded, here, want) in [
            ("nothing recorded", None, here.clone(), Record),
            (
                "same machine, same key",
                Some(here.clone()),
                here.clone(),
                Match,
            ),
            (
                "re-enrolled: new key",
                Some(id("m1", Some("u1"), Some("k0"))),
                here.clone(),
                KeyChanged,
            ),
            (
                "key newly known",
                Some(id("m1", Some("u1"), None)),
                here.clone(),
                KeyChanged,
            ),
            (
                "product_uuid newly readable",
                Some(id("m1", None, Some("k1"))),
                here.clone(),
                KeyChanged,
            ),
            (
                "no product_uuid anywhere",
                Some(id("m1", None, Some("k1"))),
                id("m1", None, Some("k1")),
                Match,
            ),
            (
                "clone with a new machine-id, same VM UUID (containers)",
                Some(here.clone()),
                id("m2", Some("u1"), Some("k1")),
                Mismatch(vec![MachineId]),
            ),
            (
                "VM clone keeping the machine-id",
                Some(here.clone()),
                id("m1", Some("u2"), Some("k1")),
                Mismatch(vec![ProductUuid]),
            ),
            (
                "clone differing in both, key too",
                Some(here.clone()),
                id("m2", Some("u2"), Some("k2")),
                Mismatch(vec![MachineId, ProductUuid]),
            ),
            (
                "recorded product_uuid unreadable here",
                Some(here.clone()),
                id("m1", None, Some("k1")),
                Mismatch(vec![ProductUuidMissing]),
            ),
        ] {
            let got = decide(recorded.as_ref(), &here);
            assert_eq!(got, want, "{what}");
            assert_eq!(got.allows_acting(), !matches!(want, Mismatch(_)), "{what}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn gathers_hashes_under_a_root_and_never_the_raw_machine_id() {
        let root = tempfile::tempdir().unwrap();
        assert!(matches!(
            gather(root.path(), None),
            Err(HostIdError::MachineId { .. })
        ));
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join(MACHINE_ID_PATH), "\n").unwrap();
        let err = gather(root.path(), None).unwrap_err().to_string();
        assert!(
            err.contains("machine-id") && err.contains("systemd-machine-id-setup"),
            "{err}"
        );

        let mid = "0123456789abcdef0123456789abcdef";
        std::fs::write(root.path().join(MACHINE_ID_PATH), format!("{mid}\n")).unwrap();
        let a = gather(root.path(), None).unwrap();
        assert_eq!(a.machine_id_hash.len(), 64);
        assert_ne!(a.machine_id_hash, hex(&Sha256::digest(mid)));
        assert!(!a.machine_id_hash.contains(mid));
        assert_eq!(a.product_uuid_hash, None);
        assert_eq!(a.key_fingerprint, None);

        let dmi = root.path().join(PRODUCT_UUID_PATH);
        std::fs::create_dir_all(dmi.parent().unwrap()).unwrap();
        std::fs::write(&dmi, "00000000-0000-0000-0000-000000000000\n").unwrap();
        assert_eq!(gather(root.path(), None).unwrap().product_uuid_hash, None);
        std::fs::write(&dmi, "4C4C4544-0042-3510-8052-B4C04F4B4E32\n").unwrap();
        let b = gather(root.path(), None).unwrap();
        assert_eq!(
            b.product_uuid_hash.as_deref(),
            Some(keyed_hash("4c4c4544-0042-3510-8052-b4c04f4b4e32").as_str())
        );
        assert_eq!(decide(Some(&a), &b), Decision::KeyChanged);

        std::fs::write(
            root.path().join(MACHINE_ID_PATH),
            "fedcba9876543210fedcba9876543210\n",
        )
        .unwrap();
        let clone = gather(root.path(), None).unwrap();
        assert_eq!(
            decide(Some(&b), &clone),
            Decision::Mismatch(vec![Difference::MachineId])
        );
    }

    #[test]
    fn key_fingerprint_is_sha256_of_the_public_key_info() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["byoh:host:w1".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let fp = key_fingerprint(cert.pem().as_bytes()).unwrap();
        let (_, spki) = x509_parser::pem::parse_x509_pem(key.public_key_pem().as_bytes()).unwrap();
        assert_eq!(fp, hex(&Sha256::digest(&spki.contents)));
        assert_eq!(key_fingerprint(b"not a certificate"), None);
    }

    #[test]
    fn refusal_names_the_byohost_and_the_fix() {
        let mut host = byoh_api::ByoHost::new("worker-01", Default::default());
        host.metadata.namespace = Some("pool".into());
        host.status = Some(byoh_api::ByoHostStatus {
            identity: Some(id("m1", Some("u1"), Some("k1"))),
            ..Default::default()
        });
        let here = id("m2", Some("u1"), Some("k1"));
        let err = check(&host, &here, Path::new("/var/lib/byoh"))
            .unwrap_err()
            .to_string();
        for needle in [
            "refusing to act as ByoHost pool/worker-01",
            "/etc/machine-id differs",
            "remove /var/lib/byoh",
            "[host] name",
            "bootstrap token",
        ] {
            assert!(err.contains(needle), "{needle:?} missing in: {err}");
        }
        assert_eq!(
            check(&host, &id("m1", Some("u1"), Some("k9")), Path::new("/x")).unwrap(),
            Decision::KeyChanged
        );
    }
}
