//! The CSR approver on the real API server, running in-process as the controller's
//! ServiceAccount (so the generated RBAC is what it has), on a control plane of its own (so no
//! other test's approver decides in its place): forged CSRs filed by a bootstrap
//! token, by hosts and by an admin stay pending with a Warning Event naming the broken rule;
//! the agent-shaped CSR is approved and signed, and the certificate authenticates as the host;
//! the host renews with its own certificate. PEM/DER forgeries that the API server and the signer
//! read differently from a lenient parser (a malformed first block hiding a second one, headers,
//! text around the block, other encodings) stay pending; one of them, approved by hand, shows that
//! the signer would have issued the hidden block's `O=kubeadm:cluster-admins`.
//! An administrator's re-enrolment permission allows one enrolment within the approver's
//! window; one left unused past it allows nothing and is removed. Every certificate
//! the signer issues in this suite is compared with what the approver checked.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_controller::csr::{self, CsrOptions};
use byoh_tests::access::*;
use byoh_tests::agent;
use byoh_tests::control_plane::{PrivateControlPlane, TestNamespace};
use byoh_tests::csr::{
    Forge, annotate, approved, file, file_text, permission_removed, refused_with, request, signed,
    valid, warning_for,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::time::Duration;

/// The approver's `--re-enrolment-window` in this test: longer than an approval takes, short
/// enough to wait out.
const RE_ENROLMENT_WINDOW: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn forged_csrs_stay_pending_with_a_warning_and_the_agents_csr_is_approved() {
    manual_approval_leaves_valid_csrs_pending().await;
    // A control plane of its own: no other test's approver may decide for this one.
    let cp = PrivateControlPlane::start().unwrap();
    let admin = cp.client().await.unwrap();
    install_components(&admin).await.unwrap();
    let approver = tokio::spawn(csr::run(
        controller_client_on(cp.kubeconfig()).await.unwrap(),
        CsrOptions {
            re_enrolment_window: RE_ENROLMENT_WINDOW,
            ..CsrOptions::default()
        },
    ));

    let token = agent::create_bootstrap_token(&admin, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrapper = token_client_on(cp.kubeconfig(), &token).await.unwrap();
    let run = random_lower(6);
    let host = format!("sec-{run}");
    let other_host = host_client_on(cp.kubeconfig(), &format!("other-{run}"))
        .await
        .unwrap();
    let v = || valid(&host);

    use rcgen::SanType;
    let forged: Vec<(&str, &Client, Forge, &str)> = vec![
        (
            "wrong-cn",
            &bootstrapper,
            Forge {
                cn: "admin".into(),
                ..v()
            },
            "does not start with",
        ),
        (
            "wrong-o",
            &bootstrapper,
            Forge {
                orgs: vec!["kubeadm:cluster-admins"],
                ..v()
            },
            "subject O",
        ),
        (
            "extra-o",
            &bootstrapper,
            Forge {
                orgs: vec!["byoh:hosts", "kubeadm:cluster-admins"],
                ..v()
            },
            "subject O",
        ),
        (
            "extra-ou",
            &bootstrapper,
            Forge {
                ous: vec!["ops"],
                ..v()
            },
            "OU=",
        ),
        (
            "signer",
            &bootstrapper,
            Forge {
                signer: "example.com/custom",
                ..v()
            },
            "signer",
        ),
        (
            "usages",
            &bootstrapper,
            Forge {
                usages: vec!["digital signature", "client auth", "server auth"],
                ..v()
            },
            "usages",
        ),
        (
            "san-dns",
            &bootstrapper,
            Forge {
                sans: vec![SanType::DnsName("x.example".try_into().unwrap())],
                ..v()
            },
            "DNS SAN",
        ),
        (
            "san-ip",
            &bootstrapper,
            Forge {
                sans: vec![SanType::IpAddress("10.1.2.3".parse().unwrap())],
                ..v()
            },
            "IP SAN",
        ),
        (
            "san-email",
            &bootstrapper,
            Forge {
                sans: vec![SanType::Rfc822Name("a@example.org".try_into().unwrap())],
                ..v()
            },
            "email SAN",
        ),
        (
            "san-uri",
            &bootstrapper,
            Forge {
                sans: vec![SanType::URI("spiffe://x/y".try_into().unwrap())],
                ..v()
            },
            "URI SAN",
        ),
        (
            "not-bootstrapper",
            &admin,
            v(),
            "neither a BYOH bootstrap token",
        ),
        ("other-host", &other_host, v(), "may renew only its own"),
        (
            "too-long",
            &bootstrapper,
            Forge {
                expiration: Some(2 * 365 * 24 * 3600),
                ..v()
            },
            "expirationSeconds is",
        ),
        (
            "too-short",
            &bootstrapper,
            Forge {
                expiration: Some(600),
                ..v()
            },
            "expirationSeconds is",
        ),
        (
            "no-lifetime",
            &bootstrapper,
            Forge {
                expiration: None,
                ..v()
            },
            "expirationSeconds is not set",
        ),
        (
            "weak-rsa",
            &bootstrapper,
            Forge {
                rsa_bits: Some(1024),
                ..v()
            },
            "RSA key of 1024 bits",
        ),
    ];
    assert!(forged.len() >= 12);
    let mut names = Vec::new();
    for (what, client, f, _) in &forged {
        let name = format!("byoh-forged-{what}-{run}");
        file(client, &name, f).await;
        names.push(name);
    }

    // The valid one, filed by the bootstrap token as the agent does.
    let valid_name = format!("byoh-{host}-{run}");
    let (valid_request, key) = file(&bootstrapper, &valid_name, &v()).await;
    let cert = signed(&admin, &valid_name).await;
    assert_signed_as_checked(&cert, &valid_request, &host);
    let as_host = cert_client_on(cp.kubeconfig(), &cert, &key).await.unwrap();
    let (user, groups) = whoami(&as_host).await.unwrap();
    assert_eq!(user, format!("byoh:host:{host}"));
    assert!(groups.iter().any(|g| g == "byoh:hosts"), "{groups:?}");

    let ns = TestNamespace::create(&admin, "csr-identity").await.unwrap();
    let byohosts = Api::<ByoHost>::namespaced(admin.clone(), ns.name());
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());

    // A re-enrolment permission given now and left unused past the window (looked at below).
    let stale = format!("stale-{run}");
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&stale, Default::default()),
        )
        .await
        .unwrap();
    annotate(
        &byohosts,
        &stale,
        byoh_api::labels::ALLOW_RE_ENROLMENT,
        "true",
    )
    .await;
    let stale_since = tokio::time::Instant::now();

    // Renewal needs the host's ByoHost: without one (never registered, or deleted by an
    // administrator, which revokes the identity) it stays pending.
    let orphan = format!("byoh-{host}-orphan-{run}");
    file(&as_host, &orphan, &v()).await;
    let note = refused_with(&admin, &orphan).await;
    assert!(
        note.contains(&format!("no ByoHost named {host} exists")),
        "{note}"
    );
    csrs.delete(&orphan, &DeleteParams::default())
        .await
        .unwrap();

    // With its ByoHost, renewal with the host's own certificate is approved.
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&host, Default::default()),
        )
        .await
        .unwrap();
    let renewal = format!("byoh-{host}-renew-{run}");
    let (renewal_request, _) = file(&as_host, &renewal, &v()).await;
    assert_signed_as_checked(&signed(&admin, &renewal).await, &renewal_request, &host);

    // Revoked by an administrator: renewal stops.
    annotate(&byohosts, &host, byoh_api::labels::REVOKED, "true").await;
    let revoked = format!("byoh-{host}-revoked-{run}");
    file(&as_host, &revoked, &v()).await;
    let note = refused_with(&admin, &revoked).await;
    assert!(note.contains("is revoked"), "{note}");
    names.push(revoked);

    names.extend(pem_forgeries(&admin, &bootstrapper, &run).await);

    // A bootstrap token may not take over a registered host's identity, whether it runs (a
    // current Lease) or is offline (perhaps claimed, its bootstrap data readable by the host).
    let live = format!("live-{run}");
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&live, Default::default()),
        )
        .await
        .unwrap();
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": { "name": byoh_tests::objects::host_lease_name(ns.name(), &live) },
        "spec": {
            "holderIdentity": live,
            "leaseDurationSeconds": 3600,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now()
            ),
        }
    }))
    .unwrap();
    byoh_tests::objects::grant_lease_namespace(&admin).await;
    byoh_tests::objects::host_leases(&admin)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let takeover = format!("byoh-{live}-{run}");
    file(&bootstrapper, &takeover, &valid(&live)).await;
    let note = refused_with(&admin, &takeover).await;
    assert!(
        note.contains("already registered") && note.contains("running"),
        "{note}"
    );
    names.push(takeover);

    let offline = format!("offline-{run}");
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&offline, Default::default()),
        )
        .await
        .unwrap();
    let offline_takeover = format!("byoh-{offline}-{run}");
    file(&bootstrapper, &offline_takeover, &valid(&offline)).await;
    let note = refused_with(&admin, &offline_takeover).await;
    assert!(
        note.contains("already registered") && note.contains("not running"),
        "{note}"
    );
    csrs.delete(&offline_takeover, &DeleteParams::default())
        .await
        .unwrap();

    // An administrator allows one re-enrolment (the machine was reinstalled): approved, and the
    // permission is used up.
    let allowed_enrolment = async |host: &str, csr: &str| {
        annotate(
            &byohosts,
            host,
            byoh_api::labels::ALLOW_RE_ENROLMENT,
            "true",
        )
        .await;
        let (request_pem, _) = file(&bootstrapper, csr, &valid(host)).await;
        assert_signed_as_checked(&signed(&admin, csr).await, &request_pem, host);
        permission_removed(&byohosts, host).await;
    };
    let re_enrolment = format!("byoh-{offline}-again-{run}");
    allowed_enrolment(&offline, &re_enrolment).await;
    let second = format!("byoh-{offline}-twice-{run}");
    file(&bootstrapper, &second, &valid(&offline)).await;
    assert!(
        refused_with(&admin, &second)
            .await
            .contains("already registered")
    );
    names.push(second);

    // A permission older than the approver's window allows nothing and is removed; the
    // administrator's new one (a new time on the annotation) allows one enrolment.
    tokio::time::sleep_until(stale_since + RE_ENROLMENT_WINDOW + Duration::from_secs(1)).await;
    let late = format!("byoh-{stale}-late-{run}");
    file(&bootstrapper, &late, &valid(&stale)).await;
    let note = refused_with(&admin, &late).await;
    assert!(note.contains("has expired"), "{note}");
    permission_removed(&byohosts, &stale).await;
    names.push(late);
    let in_time = format!("byoh-{stale}-in-time-{run}");
    allowed_enrolment(&stale, &in_time).await;

    // Every forged CSR got its Warning naming the broken rule, and none is approved.
    for ((what, _, _, expected), name) in forged.iter().zip(&names) {
        let note = eventually(
            &format!("a Warning Event on CSR {name} ({what})"),
            Duration::from_secs(30),
            || warning_for(&admin, name),
        )
        .await;
        assert!(
            note.contains(expected),
            "{what}: {note:?} lacks {expected:?}"
        );
        assert!(!approved(&csrs.get(name).await.unwrap()), "{what} approved");
    }
    // Signed => identical to what was checked: no CSR the approver refused got a certificate.
    for name in &names {
        let csr = csrs.get(name).await.unwrap();
        let issued = csr.status.and_then(|s| s.certificate).map(|c| c.0);
        assert!(
            issued.is_none_or(|c| c.is_empty()),
            "{name}: refused by the approver but signed"
        );
    }

    approver.abort();
    for name in names
        .iter()
        .chain([&valid_name, &renewal, &re_enrolment, &in_time])
    {
        let _ = csrs.delete(name, &DeleteParams::default()).await;
    }
    ns.cleanup(&admin).await.unwrap();
}

/// `--manual-csr-approval`: a valid CSR gets a Normal Event telling the admin to approve it,
/// and stays pending. On a control plane of its own: on the shared one, the controllers other
/// tests run at the same time approve every valid CSR (CSRs are cluster-wide).
async fn manual_approval_leaves_valid_csrs_pending() {
    let cp = PrivateControlPlane::start().unwrap();
    let admin = &cp.client().await.unwrap();
    install_components(admin).await.unwrap();
    let approver = tokio::spawn(csr::run(
        controller_client_on(cp.kubeconfig()).await.unwrap(),
        CsrOptions {
            manual: true,
            instance: Some("manual-test".into()),
            ..CsrOptions::default()
        },
    ));
    let token = agent::create_bootstrap_token(admin, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrapper = token_client_on(cp.kubeconfig(), &token).await.unwrap();
    let run = random_lower(6);
    let name = format!("byoh-manual-{run}");
    file(&bootstrapper, &name, &valid(&format!("manual-{run}"))).await;
    let note = eventually(
        "the manual-approval Event",
        Duration::from_secs(30),
        || async {
            let events = Api::<Event>::namespaced(admin.clone(), "default")
                .list(&ListParams::default())
                .await
                .ok()?;
            events.items.into_iter().find_map(|e| {
                (e.regarding.as_ref()?.name.as_deref() == Some(name.as_str())
                    && e.reason.as_deref() == Some(csr::MANUAL_REASON))
                .then(|| e.note.unwrap_or_default())
            })
        },
    )
    .await;
    assert!(note.contains("kubectl certificate approve"), "{note}");
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    assert!(!approved(&csrs.get(&name).await.unwrap()));
    approver.abort();
    csrs.delete(&name, &DeleteParams::default()).await.unwrap();
}

/// The certificate the real signer issued (`cert_pem`) says exactly what the approver checked
/// in `request_pem`: CN `byoh:host:<host>`, O `byoh:hosts` and nothing else in the subject, no
/// SANs, client auth only, and the request's own public key.
fn assert_signed_as_checked(cert_pem: &[u8], request_pem: &str, host: &str) {
    use x509_parser::prelude::*;
    let (_, cert_block) = x509_parser::pem::parse_x509_pem(cert_pem).unwrap();
    let cert = cert_block.parse_x509().unwrap();
    let (_, request_block) = x509_parser::pem::parse_x509_pem(request_pem.as_bytes()).unwrap();
    let (_, request) = X509CertificationRequest::from_der(&request_block.contents).unwrap();

    let subject: Vec<(String, String)> = cert
        .subject()
        .iter_attributes()
        .map(|a| {
            (
                a.attr_type().to_id_string(),
                a.as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut expected = vec![
        ("2.5.4.3".to_string(), format!("byoh:host:{host}")),
        ("2.5.4.10".to_string(), "byoh:hosts".to_string()),
    ];
    let mut got = subject.clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "subject of the issued certificate");
    assert_eq!(
        cert.public_key().raw,
        request.certification_request_info.subject_pki.raw,
        "the issued certificate certifies another key than the request's"
    );
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                panic!("issued certificate has SANs: {:?}", san.general_names)
            }
            ParsedExtension::ExtendedKeyUsage(eku) => {
                assert!(eku.client_auth, "no client auth: {eku:?}");
                assert!(
                    !eku.server_auth
                        && !eku.code_signing
                        && !eku.email_protection
                        && !eku.time_stamping
                        && !eku.ocsp_signing
                        && !eku.any
                        && eku.other.is_empty(),
                    "usages beyond client auth: {eku:?}"
                );
            }
            ParsedExtension::KeyUsage(ku) => {
                assert!(ku.digital_signature(), "{ku:?}");
                assert!(
                    !ku.key_cert_sign() && !ku.crl_sign() && !ku.non_repudiation(),
                    "{ku:?}"
                );
            }
            ParsedExtension::BasicConstraints(bc) => assert!(!bc.ca, "a CA certificate"),
            _ => {}
        }
    }
}

/// PEM/DER forgeries of the agent's request, filed by the bootstrap token: texts that Go's
/// `pem.Decode` (the API server's validation and the signer) reads differently from a lenient
/// parser, or that are not the one canonical block. Each is either refused by the API server
/// at create (Go finds no valid request in it) or left pending by the approver. The first one,
/// approved by hand, shows what was at stake: the signer issues the hidden second block. Returns
/// the names of the CSRs created (all refused by the approver; the caller checks their Events
/// and that none got a certificate).
async fn pem_forgeries(admin: &Client, bootstrapper: &Client, run: &str) -> Vec<String> {
    use base64::Engine as _;
    let host = format!("pem-{run}");
    let (good, _) = request(&valid(&host));
    let (evil, _) = request(&Forge {
        orgs: vec!["kubeadm:cluster-admins"],
        ..valid(&host)
    });
    let body = |pem: &str| {
        pem.lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let der = base64::engine::general_purpose::STANDARD
        .decode(body(&good).replace('\n', ""))
        .unwrap();
    let wrap = |der: &[u8], width: usize, eol: &str| {
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
    };
    let mut der_trailing = der.clone();
    der_trailing.extend_from_slice(&[0x05, 0x00]);
    let forgeries: Vec<(&str, String)> = vec![
        (
            "begin-extra-char",
            format!(
                "{}{evil}",
                good.replacen("REQUEST-----", "REQUEST-----x", 1)
            ),
        ),
        (
            "end-other-type",
            format!(
                "{}{evil}",
                good.replace("END CERTIFICATE REQUEST", "END CERTIFICATE")
            ),
        ),
        ("evil-first", format!("{evil}{good}")),
        ("two-blocks", format!("{good}{evil}")),
        ("blank-lines-then-evil", format!("{good}\n\n{evil}")),
        ("text-before", format!("explanatory text\n{good}")),
        ("text-after", format!("{good}trailing text\n")),
        (
            "headers",
            good.replacen(
                "REQUEST-----\n",
                "REQUEST-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\n",
                1,
            ),
        ),
        (
            "cert-block-after",
            format!(
                "{good}-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                body(&evil)
            ),
        ),
        (
            "begin-trailing-spaces",
            good.replacen("REQUEST-----\n", "REQUEST-----  \n", 1),
        ),
        ("wrapped-76", wrap(&der, 76, "\n")),
        ("crlf", wrap(&der, 64, "\r\n")),
        ("der-trailing-bytes", wrap(&der_trailing, 64, "\n")),
        (
            "other-label",
            good.replace("CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST"),
        ),
    ];
    assert!(forgeries.len() >= 10);
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let mut created = Vec::new();
    for (what, text) in &forgeries {
        let name = format!("byoh-pem-{what}-{run}");
        match file_text(
            bootstrapper,
            &name,
            &valid(&host),
            text.clone().into_bytes(),
        )
        .await
        {
            Ok(_) => created.push((*what, name)),
            // Go found no valid request in it: nothing can be signed.
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            Err(e) => panic!("{what}: creating the CSR failed otherwise: {e}"),
        }
    }
    // The ones Go reads as the hidden block, or reads at all, reach the approver.
    for must in [
        "begin-extra-char",
        "end-other-type",
        "two-blocks",
        "headers",
    ] {
        assert!(
            created.iter().any(|(w, _)| *w == must),
            "{must}: the API server refused it, so the test no longer shows the attack"
        );
    }
    for (what, name) in &created {
        let note = eventually(
            &format!("a Warning Event on CSR {name} ({what})"),
            Duration::from_secs(30),
            || warning_for(admin, name),
        )
        .await;
        assert!(note.contains("exactly one PEM block"), "{what}: {note}");
        assert!(!approved(&csrs.get(name).await.unwrap()), "{what} approved");
    }

    // What the approver stood in the way of: approved by hand, the first forgery is signed as
    // its hidden second block, with the cluster-admins group.
    let (_, attack) = &created[0];
    let mut csr = csrs.get(attack).await.unwrap();
    csr.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(
            k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("TestShowsTheAttack".into()),
                ..Default::default()
            },
        );
    csrs.replace_subresource("approval", attack, &PostParams::default(), &csr)
        .await
        .unwrap();
    let cert = signed(admin, attack).await;
    let (_, block) = x509_parser::pem::parse_x509_pem(&cert).unwrap();
    let orgs: Vec<String> = block
        .parse_x509()
        .unwrap()
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        orgs,
        ["kubeadm:cluster-admins"],
        "the signer read another block"
    );
    csrs.delete(attack, &DeleteParams::default()).await.unwrap();
    created.into_iter().skip(1).map(|(_, n)| n).collect()
}
