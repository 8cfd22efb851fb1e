//! Certificate signing requests as the agent files them and as attackers forge them, and what
//! the approver made of them (the security tests of the CSR approver and of enrolment). Helpers
//! for tests: they panic with a message saying what failed.

use crate::eventually;
use byoh_api::ByoHost;
use byoh_controller::csr;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use std::time::Duration;

/// One CSR to file.
#[derive(Clone)]
pub struct Forge {
    /// Subject CN.
    pub cn: String,
    /// Subject O values.
    pub orgs: Vec<&'static str>,
    /// Subject OU values.
    pub ous: Vec<&'static str>,
    /// Subject alternative names asked for.
    pub sans: Vec<rcgen::SanType>,
    /// `spec.signerName`.
    pub signer: &'static str,
    /// `spec.usages`.
    pub usages: Vec<&'static str>,
    /// `spec.expirationSeconds`.
    pub expiration: Option<i32>,
    /// An RSA key of this many bits (through openssl) instead of ECDSA P-256.
    pub rsa_bits: Option<usize>,
}

/// The request the agent files for host `host` (CN `byoh:host:<host>`, O `byoh:hosts`, client
/// auth, one day).
pub fn valid(host: &str) -> Forge {
    Forge {
        cn: format!("byoh:host:{host}"),
        orgs: vec!["byoh:hosts"],
        ous: vec![],
        sans: vec![],
        signer: "kubernetes.io/kube-apiserver-client",
        usages: vec!["digital signature", "client auth"],
        expiration: Some(24 * 3600),
        rsa_bits: None,
    }
}

/// `(CSR PEM, key PEM)`; weak RSA keys through openssl (ring refuses to sign with them).
pub fn request(f: &Forge) -> (String, String) {
    if let Some(bits) = f.rsa_bits {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary directory: {e}"));
        let key = dir.path().join("key.pem");
        let ok = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg(bits.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("openssl genrsa: {e}"));
        assert!(ok.success(), "openssl genrsa");
        let subject = format!("/CN={}/O={}", f.cn, f.orgs.join("/O="));
        let out = std::process::Command::new("openssl")
            .args(["req", "-new", "-subj", &subject, "-key"])
            .arg(&key)
            .output()
            .unwrap_or_else(|e| panic!("openssl req: {e}"));
        return (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            std::fs::read_to_string(&key).unwrap_or_else(|e| panic!("{}: {e}", key.display())),
        );
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap_or_else(|e| panic!("generating a key: {e}"));
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, f.cn.as_str());
    for o in &f.orgs {
        dn.push(rcgen::DnType::OrganizationName, *o);
    }
    for ou in &f.ous {
        dn.push(rcgen::DnType::OrganizationalUnitName, *ou);
    }
    params.distinguished_name = dn;
    params.subject_alt_names = f.sans.clone();
    (
        params
            .serialize_request(&key)
            .and_then(|r| r.pem())
            .unwrap_or_else(|e| panic!("serializing the request: {e}")),
        key.serialize_pem(),
    )
}

/// Files `f` as `client` under the name `name`; returns `(request PEM, key PEM)`.
pub async fn file(client: &Client, name: &str, f: &Forge) -> (String, String) {
    let (pem, key) = request(f);
    file_text(client, name, f, pem.clone().into_bytes())
        .await
        .unwrap_or_else(|e| panic!("creating CSR {name}: {e}"));
    (pem, key)
}

/// Files `request` (any bytes) as `spec.request`, with `f`'s signer, usages and lifetime.
pub async fn file_text(
    client: &Client,
    name: &str,
    f: &Forge,
    request: Vec<u8>,
) -> Result<CertificateSigningRequest, kube::Error> {
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request),
            signer_name: f.signer.into(),
            usages: Some(f.usages.iter().map(|s| s.to_string()).collect()),
            expiration_seconds: f.expiration,
            ..Default::default()
        },
        status: None,
    };
    Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &csr)
        .await
}

/// Whether `csr` carries the `Approved` condition.
pub fn approved(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved"))
}

/// The note of the approver's Warning Event on CSR `csr`, if there is one yet.
pub async fn warning_for(admin: &Client, csr: &str) -> Option<String> {
    let events = Api::<Event>::namespaced(admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .ok()?;
    events.items.into_iter().find_map(|e| {
        (e.regarding.as_ref()?.name.as_deref() == Some(csr)
            && e.reason.as_deref() == Some(csr::NOT_APPROVED_REASON)
            && e.type_.as_deref() == Some("Warning"))
        .then(|| e.note.unwrap_or_default())
    })
}

/// The certificate the signer issued for CSR `name`, once it did (within 60 s); panics if the
/// CSR was denied or failed, or on time-out with its conditions and the approver's Warning (so
/// a failure says whether the approver refused it or the signer did not sign).
pub async fn signed(admin: &Client, name: &str) -> Vec<u8> {
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(certificate) = issued(&csrs, name).await {
                return certificate;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match waited {
        Ok(certificate) => certificate,
        Err(_) => {
            let conditions = csrs
                .get(name)
                .await
                .map(|c| format!("{:?}", c.status.and_then(|s| s.conditions)));
            panic!(
                "timed out after 60s waiting for CSR {name} approved and signed; its conditions: {conditions:?}; the approver's Warning: {:?}",
                warning_for(admin, name).await
            )
        }
    }
}

/// The certificate issued for CSR `name`, if there is one yet; panics if it was denied or
/// failed.
async fn issued(csrs: &Api<CertificateSigningRequest>, name: &str) -> Option<Vec<u8>> {
    let c = csrs.get(name).await.ok()?;
    assert!(
        !c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs
                .iter()
                .any(|c| c.type_ == "Denied" || c.type_ == "Failed")),
        "{name} denied or failed: {:?}",
        c.status
    );
    c.status?.certificate.map(|b| b.0).filter(|b| !b.is_empty())
}

/// The note of the Warning that the approver published on CSR `name`, once it did; asserts the
/// CSR is not approved.
pub async fn refused_with(admin: &Client, name: &str) -> String {
    let note = eventually(
        &format!("a Warning Event on CSR {name}"),
        Duration::from_secs(30),
        || warning_for(admin, name),
    )
    .await;
    let csr = Api::<CertificateSigningRequest>::all(admin.clone())
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("CSR {name}: {e}"));
    assert!(!approved(&csr), "{name} approved: {note}");
    note
}

/// Sets annotation `key` of ByoHost `name` to `value`, as an administrator.
pub async fn annotate(byohosts: &Api<ByoHost>, name: &str, key: &str, value: &str) {
    let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
    byohosts
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating ByoHost {name} with {key}: {e}"));
}

/// Waits (30 s at most) until ByoHost `host` no longer carries the re-enrolment permission
/// (used up, or expired and withdrawn); panics on time-out.
pub async fn permission_removed(byohosts: &Api<ByoHost>, host: &str) {
    eventually(
        "the re-enrolment permission removed",
        Duration::from_secs(30),
        || async {
            let now = byohosts.get(host).await.ok()?;
            (!now
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(byoh_api::labels::ALLOW_RE_ENROLMENT)))
            .then_some(())
        },
    )
    .await;
}
