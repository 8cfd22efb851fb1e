//! The approval rules as a pure function of the CSR (see the parent module's documentation).

use super::request::{self, Key};
use super::{
    BOOTSTRAP_USER_PREFIX, BOOTSTRAPPERS_GROUP, HOST_USER_PREFIX, HOSTS_GROUP, MAX_EXPIRATION_SECS,
    MIN_EXPIRATION_SECS, SIGNER,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use std::collections::BTreeSet;

const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
const USAGE_CLIENT_AUTH: &str = "client auth";
const USAGE_KEY_ENCIPHERMENT: &str = "key encipherment";

/// Who asked for a certificate that is approved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A BYOH bootstrap token (first certificate of a host).
    Bootstrapper {
        /// The token's public id.
        token_id: String,
    },
    /// The host itself, with its current certificate (renewal).
    Host,
}

/// What to do with a CSR; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Approve: a host certificate of the right shape from a legitimate requester.
    Approve {
        /// The host name (`<name>` of CN `byoh:host:<name>`).
        host: String,
        /// Who asked.
        requester: Requester,
        /// SHA-256 of the request's public key (DER SubjectPublicKeyInfo), lowercase hex.
        key_sha256: String,
    },
    /// BYOH-looking but wrong: leave it pending, with a Warning Event.
    Refuse {
        /// Every rule broken, `; `-separated, for the Event.
        reason: String,
    },
    /// Not BYOH's business: leave it alone silently.
    NotOurs,
    /// Already approved or denied: nothing to do.
    AlreadyDecided,
}

fn is_decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Approved" || c.type_ == "Denied") && c.status == "True")
        })
}

/// Decides what to do with `csr`; pure (no I/O). See the module documentation for the rules.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    if is_decided(csr) {
        return Decision::AlreadyDecided;
    }
    let spec = &csr.spec;
    let username = spec.username.as_deref().unwrap_or_default();
    let groups = spec.groups.as_deref().unwrap_or_default();
    let in_group = |g: &str| groups.iter().any(|x| x == g);
    let byoh_requester = in_group(BOOTSTRAPPERS_GROUP)
        || in_group(HOSTS_GROUP)
        || username.starts_with(HOST_USER_PREFIX);
    let request = request::parse(&spec.request.0);
    let byoh_subject = request.as_ref().is_ok_and(|r| {
        r.common_names
            .iter()
            .any(|cn| cn.starts_with(HOST_USER_PREFIX))
            || r.organizations.iter().any(|o| o == HOSTS_GROUP)
    });
    if !byoh_requester && !byoh_subject {
        return Decision::NotOurs;
    }

    let mut problems = Vec::new();
    if spec.signer_name != SIGNER {
        problems.push(format!(
            "signer is {:?}; only {SIGNER} is approved",
            spec.signer_name
        ));
    }
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            problems.push(e);
            return Decision::Refuse {
                reason: problems.join("; "),
            };
        }
    };

    // Subject: exactly CN byoh:host:<name> and O byoh:hosts.
    let mut host = None;
    match request.common_names.as_slice() {
        [cn] => match cn.strip_prefix(HOST_USER_PREFIX) {
            Some(name) => match byoh_api::names::check_host_name(name) {
                Ok(()) => host = Some(name.to_string()),
                Err(m) => problems.push(format!("CN: {m}")),
            },
            None => problems.push(format!(
                "subject CN {cn:?} does not start with {HOST_USER_PREFIX:?}"
            )),
        },
        [] => problems.push("subject has no CN".into()),
        many => problems.push(format!(
            "subject has {} CNs {many:?}; exactly one is allowed",
            many.len()
        )),
    }
    if request.organizations != [HOSTS_GROUP] {
        problems.push(format!(
            "subject O is {:?}; it must be exactly [{HOSTS_GROUP:?}]",
            request.organizations
        ));
    }
    if !request.other_subject.is_empty() {
        problems.push(format!(
            "subject has attributes other than CN and O: {}",
            request.other_subject.join(", ")
        ));
    }
    if !request.extensions.is_empty() {
        problems.push(format!(
            "request asks for extensions (no SANs or other extensions are allowed): {}",
            request.extensions.join(", ")
        ));
    }
    if !request.attributes.is_empty() {
        problems.push(format!(
            "request carries attributes (BYOH requests none): {}",
            request.attributes.join(", ")
        ));
    }

    // Key.
    match &request.key {
        Key::EcP256 | Key::EcP384 => {}
        Key::Rsa { bits } if *bits >= 2048 => {}
        Key::Rsa { bits } => problems.push(format!(
            "RSA key of {bits} bits is too weak; at least 2048 bits"
        )),
        Key::EcOther(curve) => problems.push(format!(
            "EC key on curve {curve}; only P-256 and P-384 are approved"
        )),
        Key::Other(what) => problems.push(format!(
            "key algorithm {what}; only ECDSA P-256/P-384 and RSA >= 2048 bits are approved"
        )),
        Key::Unknown => problems.push("key type unknown".into()),
    }

    // Usages.
    let usages: BTreeSet<&str> = spec
        .usages
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .collect();
    let mut allowed: BTreeSet<&str> = [USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH].into();
    let required = allowed.clone();
    if request.key.is_rsa() {
        allowed.insert(USAGE_KEY_ENCIPHERMENT);
    }
    if !required.is_subset(&usages) || !usages.is_subset(&allowed) {
        problems.push(format!(
            "usages are {usages:?}; they must be exactly {required:?}{}",
            if request.key.is_rsa() {
                " (plus \"key encipherment\" for RSA keys)"
            } else {
                ""
            }
        ));
    }

    // Lifetime.
    match spec.expiration_seconds {
        None => problems.push(format!(
            "spec.expirationSeconds is not set; BYOH approves only certificates with an explicit lifetime of {MIN_EXPIRATION_SECS}..={MAX_EXPIRATION_SECS} s (byoh-agent always sets it)"
        )),
        Some(s) if !(MIN_EXPIRATION_SECS..=MAX_EXPIRATION_SECS).contains(&s) => {
            problems.push(format!(
                "spec.expirationSeconds is {s}; it must be within {MIN_EXPIRATION_SECS}..={MAX_EXPIRATION_SECS} (1 hour to 1 year)"
            ))
        }
        Some(_) => {}
    }

    // Requester.
    let requester = if let Some(id) = username.strip_prefix(BOOTSTRAP_USER_PREFIX) {
        if !in_group(BOOTSTRAPPERS_GROUP) {
            problems.push(format!(
                "requested by bootstrap token {username:?}, which is not in group {BOOTSTRAPPERS_GROUP:?} (create the token through a BootstrapKubeconfig)"
            ));
            None
        } else if id.len() != 6
            || !id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            problems.push(format!(
                "requester {username:?} is not a bootstrap token identity"
            ));
            None
        } else {
            Some(Requester::Bootstrapper {
                token_id: id.to_string(),
            })
        }
    } else if let Some(requesting_host) = username.strip_prefix(HOST_USER_PREFIX) {
        if !in_group(HOSTS_GROUP) {
            problems.push(format!(
                "requester {username:?} is not in group {HOSTS_GROUP:?}"
            ));
            None
        } else if host.as_deref().is_some_and(|h| h != requesting_host) {
            problems.push(format!(
                "requested by host {requesting_host:?} for host {:?}; a host may renew only its own certificate",
                host.as_deref().unwrap_or_default()
            ));
            None
        } else {
            Some(Requester::Host)
        }
    } else {
        problems.push(format!(
            "requester {username:?} (groups {groups:?}) is neither a BYOH bootstrap token (group {BOOTSTRAPPERS_GROUP:?}) nor the host itself ({HOST_USER_PREFIX}<name> in group {HOSTS_GROUP:?})"
        ));
        None
    };

    match (problems.is_empty(), host, requester) {
        (true, Some(host), Some(requester)) => Decision::Approve {
            host,
            requester,
            key_sha256: request.key_sha256,
        },
        _ => Decision::Refuse {
            reason: problems.join("; "),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::csr::MAX_EXPIRATION_SECS;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    #[derive(Clone)]
    struct Forge {
        subject: Vec<(rcgen::DnType, &'static str)>,
        sans: Vec<rcgen::SanType>,
        key: &'static rcgen::SignatureAlgorithm,
        rsa_bits: Option<usize>,
        signer: &'static str,
        usages: Vec<&'static str>,
        expiration: Option<i32>,
        username: &'static str,
        groups: Vec<&'static str>,
    }

    fn valid_bootstrap() -> Forge {
        Forge {
            subject: vec![
                (rcgen::DnType::CommonName, "byoh:host:a"),
                (rcgen::DnType::OrganizationName, "byoh:hosts"),
            ],
            sans: vec![],
            key: &rcgen::PKCS_ECDSA_P256_SHA256,
            rsa_bits: None,
            signer: SIGNER,
            usages: vec!["digital signature", "client auth"],
            expiration: Some(86400),
            username: "system:bootstrap:abc123",
            groups: vec![
                "system:bootstrappers",
                "system:bootstrappers:byoh",
                "system:authenticated",
            ],
        }
    }

    fn renewal() -> Forge {
        Forge {
            username: "byoh:host:a",
            groups: vec!["byoh:hosts", "system:authenticated"],
            ..valid_bootstrap()
        }
    }

    fn rsa_key_pem(bits: usize) -> String {
        // rcgen cannot generate RSA keys; these come from openssl, made once for the tests.
        let out = std::process::Command::new("openssl")
            .args(["genrsa", &bits.to_string()])
            .stderr(std::process::Stdio::null())
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    /// A CSR made by `openssl req` (ring refuses to sign with RSA keys under 2048 bits).
    fn openssl_csr(bits: usize, subject: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, rsa_key_pem(bits)).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-new", "-subj", subject, "-key"])
            .arg(&key)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    fn build(f: &Forge) -> CertificateSigningRequest {
        let key = match f.rsa_bits {
            Some(bits) if bits < 2048 => {
                let pem = openssl_csr(bits, "/CN=byoh:host:a/O=byoh:hosts");
                let mut csr = build(&Forge {
                    rsa_bits: None,
                    ..f.clone()
                });
                csr.spec.request = ByteString(pem.into_bytes());
                return csr;
            }
            Some(bits) => {
                let pem = rsa_key_pem(bits);
                rcgen::KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).unwrap()
            }
            None => rcgen::KeyPair::generate_for(f.key).unwrap(),
        };
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        for (t, v) in &f.subject {
            dn.push(t.clone(), *v);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = f.sans.clone();
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: f.signer.into(),
                usages: Some(f.usages.iter().map(|s| s.to_string()).collect()),
                expiration_seconds: f.expiration,
                username: Some(f.username.into()),
                groups: Some(f.groups.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn refused(f: &Forge) -> String {
        match decide(&build(f)) {
            Decision::Refuse { reason } => reason,
            other => panic!("expected Refuse, got {other:?}"),
        }
    }

    #[test]
    fn the_agents_csr_is_approved_from_a_bootstrap_token_and_on_renewal() {
        let approved = |f: &Forge| match decide(&build(f)) {
            Decision::Approve {
                host,
                requester,
                key_sha256,
            } => (host, requester, key_sha256),
            other => panic!("expected Approve, got {other:?}"),
        };
        let (host, requester, key) = approved(&valid_bootstrap());
        assert_eq!(host, "a");
        assert_eq!(
            requester,
            Requester::Bootstrapper {
                token_id: "abc123".into()
            }
        );
        assert!(
            key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
            "{key}"
        );
        assert_eq!(approved(&renewal()).1, Requester::Host);
        let p384 = Forge {
            key: &rcgen::PKCS_ECDSA_P384_SHA384,
            ..valid_bootstrap()
        };
        assert!(matches!(decide(&build(&p384)), Decision::Approve { .. }));
    }

    #[test]
    fn rsa_keys_need_2048_bits_and_may_add_key_encipherment() {
        let rsa = Forge {
            rsa_bits: Some(2048),
            usages: vec!["digital signature", "key encipherment", "client auth"],
            ..valid_bootstrap()
        };
        assert!(
            matches!(decide(&build(&rsa)), Decision::Approve { .. }),
            "{:?}",
            decide(&build(&rsa))
        );
        let weak = Forge {
            rsa_bits: Some(1024),
            ..valid_bootstrap()
        };
        assert!(refused(&weak).contains("RSA key of 1024 bits"));
        let ec_with_encipherment = Forge {
            usages: vec!["digital signature", "key encipherment", "client auth"],
            ..valid_bootstrap()
        };
        assert!(refused(&ec_with_encipherment).contains("usages"));
    }

    #[test]
    fn forged_requests_are_refused_with_the_reason() {
        use rcgen::{DnType, SanType};
        let v = valid_bootstrap;
        let cases: Vec<(&str, Forge, &str)> = vec![
            (
                "wrong CN",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "admin"),
                        (DnType::OrganizationName, "byoh:hosts"),
                    ],
                    ..v()
                },
                "does not start with",
            ),
            (
                "CN with an invalid host name",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:Bad_Name"),
                        (DnType::OrganizationName, "byoh:hosts"),
                    ],
                    ..v()
                },
                "RFC 1123",
            ),
            (
                "wrong O",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "system:masters"),
                    ],
                    ..v()
                },
                "subject O",
            ),
            (
                "extra O",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "byoh:hosts"),
                        (DnType::OrganizationName, "system:masters"),
                    ],
                    ..v()
                },
                "subject O",
            ),
            (
                "extra OU",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "byoh:hosts"),
                        (DnType::OrganizationalUnitName, "ops"),
                    ],
                    ..v()
                },
                "OU=",
            ),
            (
                "wrong signer",
                Forge {
                    signer: "kubernetes.io/kubelet-serving",
                    ..v()
                },
                "signer",
            ),
            (
                "server auth usage",
                Forge {
                    usages: vec!["digital signature", "client auth", "server auth"],
                    ..v()
                },
                "usages",
            ),
            (
                "missing client auth",
                Forge {
                    usages: vec!["digital signature"],
                    ..v()
                },
                "usages",
            ),
            (
                "DNS SAN",
                Forge {
                    sans: vec![SanType::DnsName("a.example".try_into().unwrap())],
                    ..v()
                },
                "DNS SAN",
            ),
            (
                "IP SAN",
                Forge {
                    sans: vec![SanType::IpAddress("10.0.0.1".parse().unwrap())],
                    ..v()
                },
                "IP SAN 10.0.0.1",
            ),
            (
                "email SAN",
                Forge {
                    sans: vec![SanType::Rfc822Name("a@example.org".try_into().unwrap())],
                    ..v()
                },
                "email SAN",
            ),
            (
                "URI SAN",
                Forge {
                    sans: vec![SanType::URI("spiffe://x/y".try_into().unwrap())],
                    ..v()
                },
                "URI SAN",
            ),
            (
                "requester not a bootstrapper",
                Forge {
                    username: "alice",
                    groups: vec!["system:authenticated"],
                    ..v()
                },
                "neither a BYOH bootstrap token",
            ),
            (
                "bootstrap token of another group",
                Forge {
                    groups: vec!["system:bootstrappers", "system:bootstrappers:kubeadm"],
                    ..v()
                },
                "not in group",
            ),
            (
                "another host renewing",
                Forge {
                    username: "byoh:host:b",
                    groups: vec!["byoh:hosts"],
                    ..v()
                },
                "may renew only its own",
            ),
            (
                "lifetime too long",
                Forge {
                    expiration: Some(MAX_EXPIRATION_SECS + 1),
                    ..v()
                },
                "expirationSeconds is",
            ),
            (
                "lifetime too short",
                Forge {
                    expiration: Some(600),
                    ..v()
                },
                "expirationSeconds is",
            ),
            (
                "lifetime missing",
                Forge {
                    expiration: None,
                    ..v()
                },
                "expirationSeconds is not set",
            ),
        ];
        assert!(cases.len() >= 12);
        for (what, forge, expected) in cases {
            let reason = refused(&forge);
            assert!(
                reason.contains(expected),
                "{what}: reason {reason:?} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn unrelated_and_decided_csrs_are_left_alone() {
        let kubelet = Forge {
            subject: vec![
                (rcgen::DnType::CommonName, "system:node:n1"),
                (rcgen::DnType::OrganizationName, "system:nodes"),
            ],
            username: "system:node:n1",
            groups: vec!["system:nodes"],
            ..valid_bootstrap()
        };
        assert_eq!(decide(&build(&kubelet)), Decision::NotOurs);
        let mut approved = build(&valid_bootstrap());
        approved.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(decide(&approved), Decision::AlreadyDecided);
    }

    #[test]
    fn garbage_requests_from_byoh_requesters_are_refused() {
        let mut csr = build(&valid_bootstrap());
        csr.spec.request = ByteString(b"not pem".to_vec());
        assert!(matches!(decide(&csr), Decision::Refuse { .. }));
    }

    /// The CSR the attacker filed: a good block with a malformed BEGIN line, then a
    /// block asking for `O=kubeadm:cluster-admins`; the signer would sign the second.
    #[test]
    fn a_second_block_behind_a_malformed_first_one_is_refused() {
        let good = build(&valid_bootstrap());
        let evil = build(&Forge {
            subject: vec![
                (rcgen::DnType::CommonName, "byoh:host:a"),
                (rcgen::DnType::OrganizationName, "kubeadm:cluster-admins"),
            ],
            ..valid_bootstrap()
        });
        let mut forged = good.clone();
        let first = String::from_utf8(good.spec.request.0.clone()).unwrap();
        let second = String::from_utf8(evil.spec.request.0.clone()).unwrap();
        forged.spec.request = ByteString(
            format!(
                "{}{second}",
                first.replacen("REQUEST-----", "REQUEST-----x", 1)
            )
            .into_bytes(),
        );
        let reason = match decide(&forged) {
            Decision::Refuse { reason } => reason,
            other => panic!("expected Refuse, got {other:?}"),
        };
        assert!(reason.contains("exactly one PEM block"), "{reason}");
    }

    #[test]
    fn host_names_longer_than_a_label_value_and_any_extension_are_refused() {
        let cn = format!("byoh:host:{}.{}", "a".repeat(40), "b".repeat(40));
        let long = Forge {
            subject: vec![
                (rcgen::DnType::CommonName, Box::leak(cn.into_boxed_str())),
                (rcgen::DnType::OrganizationName, "byoh:hosts"),
            ],
            ..valid_bootstrap()
        };
        assert!(refused(&long).contains("at most 63"), "{}", refused(&long));

        // An extension BYOH never asks for (not a SAN): refused, not ignored.
        let mut csr = build(&valid_bootstrap());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, "byoh:host:a");
        dn.push(rcgen::DnType::OrganizationName, "byoh:hosts");
        params.distinguished_name = dn;
        params.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 99999, 1],
            vec![0x05, 0x00],
        )];
        csr.spec.request = ByteString(
            params
                .serialize_request(&key)
                .unwrap()
                .pem()
                .unwrap()
                .into_bytes(),
        );
        match decide(&csr) {
            Decision::Refuse { reason } => assert!(reason.contains("extensions"), "{reason}"),
            other => panic!("expected Refuse, got {other:?}"),
        }
    }
}
