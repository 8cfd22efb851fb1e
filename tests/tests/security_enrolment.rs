//! Enrolment as one atomic claim on a name, and revocation that sticks (issue 43), on the real
//! API server and signer, with the controller's CSR approver and host access reconciler running
//! in-process as its ServiceAccount (so the generated RBAC is what they have). Each test plays
//! what a holder of the batch's bootstrap token, or a revoked host, does:
//! - five enrolment CSRs for one fresh name filed at once yield one certificate (before the
//!   enrolment record, all five were approved);
//! - one re-enrolment permission, five CSRs at once: one certificate; the value `false` allows
//!   nothing;
//! - an approver that fails after it claimed the permission (here: it may not write the
//!   enrolment record) loses nothing: the claim stays that CSR's, no other CSR takes it, and the
//!   next approver approves that CSR (before the claim, the failure used the permission up);
//! - a revoked host loses its Role at once and may write nothing with the certificate it still
//!   holds (no Lease, no Event, no CSR, no new ByoHost: admission refuses every write of a
//!   revoked name); a ByoHost of its name that reappears without the mark changes nothing, and
//!   a renewal filed before the revocation gets no certificate.
//!
//! The tests on the shared control plane take turns ([`APPROVERS`]): each runs its own
//! approver, and one approver's decisions must not stand in for another's. The failing approver
//! and the revoked host have control planes of their own: no other approver may act on their
//! CSRs.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_controller::admission;
use byoh_controller::csr::{self, CsrOptions};
use byoh_controller::hostaccess::{self, HostAccessOptions};
use byoh_controller::manifests;
use byoh_tests::access::*;
use byoh_tests::agent;
use byoh_tests::control_plane::{self, PrivateControlPlane, TestNamespace};
use byoh_tests::csr::{
    annotate, approved, file, permission_removed, refused_with, signed, valid, warning_for,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use std::time::Duration;

/// Held by each test for its whole run: one CSR approver at a time on the control plane.
static APPROVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `Some(())` when `r` is the API server's refusal by the revoked-host admission policy;
/// `None` when the request went through (the policy had not read the record yet); panics on
/// any other outcome.
fn refused_by_revocation<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Option<()> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(e))
            if e.code == 403 && e.message.contains(admission::REVOKED_POLICY) =>
        {
            Some(())
        }
        Err(e) => panic!("expected a refusal by {}: {e}", admission::REVOKED_POLICY),
    }
}

/// Files five valid CSRs for host `host` at once (each with its own key) as `client`, named
/// `byoh-<host>-race<i>-<run>`, and waits until one at least is approved and each of the others
/// is approved or has a Warning; asserts that exactly one was approved (`what` names the race in
/// the failure) and that the signer signed it; returns `(names, the winner)`.
async fn race(
    admin: &kube::Client,
    client: &kube::Client,
    host: &str,
    run: &str,
    what: &str,
) -> (Vec<String>, String) {
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let names: Vec<String> = (0..5)
        .map(|i| format!("byoh-{host}-race{i}-{run}"))
        .collect();
    let forge = valid(host);
    futures::future::join_all(names.iter().map(|name| file(client, name, &forge))).await;
    let winners = eventually(
        &format!("every racing CSR for {host} approved or refused with a Warning"),
        Duration::from_secs(60),
        || async {
            let mut approved_ones = Vec::new();
            for name in &names {
                let csr = csrs.get(name).await.ok()?;
                if approved(&csr) {
                    approved_ones.push(name.clone());
                } else {
                    warning_for(admin, name).await?;
                }
            }
            // At least one: the other tests' approvers on this control plane reconcile the same
            // CSRs, and one of them may put a Warning on the winner (the permission it is about
            // to use is already gone) just before the approver that used it approves.
            (!approved_ones.is_empty()).then_some(approved_ones)
        },
    )
    .await;
    assert_eq!(
        winners.len(),
        1,
        "{what}: {} of 5 concurrent CSRs approved: {winners:?}",
        winners.len()
    );
    signed(admin, &winners[0]).await;
    (names, winners[0].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_name_gets_one_key_however_many_csrs_arrive_at_once() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    let _turn = APPROVERS.lock().await;
    install_components(&admin).await.unwrap();
    let approver = tokio::spawn(csr::run(
        controller_client().await.unwrap(),
        CsrOptions::default(),
    ));
    let token = agent::create_bootstrap_token(&admin, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrapper = token_client(&token).await.unwrap();
    let run = random_lower(6);
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let ns = TestNamespace::create(&admin, "enrolment").await.unwrap();
    let byohosts = Api::<ByoHost>::namespaced(admin.clone(), ns.name());

    // A fresh name (no ByoHost yet), five CSRs for it filed at once: one certificate, and the
    // name recorded as that key's in the provider's namespace.
    let fresh = format!("fresh-{run}");
    let (fresh_racers, winner) = race(&admin, &bootstrapper, &fresh, &run, "one fresh name").await;
    for name in fresh_racers.iter().filter(|n| **n != winner) {
        let note = refused_with(&admin, name).await;
        assert!(
            note.contains("already enrolled with another key"),
            "{name}: {note}"
        );
    }
    let records = Api::<ConfigMap>::namespaced(admin.clone(), manifests::NAMESPACE);
    let record = records
        .get(&csr::enrolment::record_name(&fresh))
        .await
        .unwrap();
    assert_eq!(
        record
            .data
            .unwrap_or_default()
            .get(csr::enrolment::CSR)
            .map(String::as_str),
        Some(winner.as_str())
    );
    // A host cannot remove the record to have the name enrolled again (no ConfigMap rights).
    let denied =
        Api::<ConfigMap>::namespaced(host_client(&fresh).await.unwrap(), manifests::NAMESPACE)
            .delete(
                &csr::enrolment::record_name(&fresh),
                &DeleteParams::default(),
            )
            .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(e)) if e.code == 403),
        "a host deleted its enrolment record: {denied:?}"
    );

    // A registered, offline name: the administrator's permission allows one re-enrolment.
    let offline = format!("offline-{run}");
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&offline, Default::default()),
        )
        .await
        .unwrap();
    // Only the value `true` allows: `false` (an administrator's "no") allows nothing.
    annotate(
        &byohosts,
        &offline,
        byoh_api::labels::ALLOW_RE_ENROLMENT,
        "false",
    )
    .await;
    let said_no = format!("byoh-{offline}-false-{run}");
    file(&bootstrapper, &said_no, &valid(&offline)).await;
    let note = refused_with(&admin, &said_no).await;
    assert!(note.contains("already registered"), "{note}");
    csrs.delete(&said_no, &DeleteParams::default())
        .await
        .unwrap();

    // One permission, five CSRs for the name filed at once (each with its own key, as five
    // holders of the batch's bootstrap token would): one certificate, four Warnings.
    annotate(
        &byohosts,
        &offline,
        byoh_api::labels::ALLOW_RE_ENROLMENT,
        "true",
    )
    .await;
    let (racers, winner) = race(
        &admin,
        &bootstrapper,
        &offline,
        &run,
        "one re-enrolment permission",
    )
    .await;
    // The permission is gone once the winner is approved, so no refused racer can use it when
    // it is looked at again.
    permission_removed(&byohosts, &offline).await;
    for name in racers.iter().filter(|n| **n != winner) {
        let note = refused_with(&admin, name).await;
        assert!(
            note.contains("already registered") || note.contains("used by another CSR first"),
            "{name}: {note}"
        );
    }
    for name in &racers {
        csrs.delete(name, &DeleteParams::default()).await.unwrap();
    }

    approver.abort();
    for name in &fresh_racers {
        let _ = csrs.delete(name, &DeleteParams::default()).await;
    }
    for name in [&fresh, &offline] {
        let _ = records
            .delete(&csr::enrolment::record_name(name), &DeleteParams::default())
            .await;
    }
    ns.cleanup(&admin).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_host_writes_nothing_and_gets_no_certificate_and_no_grant() {
    // A control plane of its own: a renewal is filed while its approver is stopped, and no
    // other test's approver may approve it meanwhile.
    let cp = PrivateControlPlane::start().unwrap();
    let admin = cp.client().await.unwrap();
    install_components(&admin).await.unwrap();
    let pool = TestNamespace::create(&admin, "revoked").await.unwrap();
    let controller = controller_client_on(cp.kubeconfig()).await.unwrap();
    let approver = tokio::spawn(csr::run(controller.clone(), CsrOptions::default()));
    let reconciler = tokio::spawn(hostaccess::run(
        controller,
        HostAccessOptions {
            namespace: Some(pool.name().into()),
            provider_namespace: manifests::NAMESPACE.into(),
        },
    ));
    let run = random_lower(6);
    let name = format!("revoked-{run}");
    let host = host_client_on(cp.kubeconfig(), &name).await.unwrap();
    let pp = PostParams::default();
    let as_host: Api<ByoHost> = Api::namespaced(host.clone(), pool.name());
    let byohosts: Api<ByoHost> = Api::namespaced(admin.clone(), pool.name());
    let roles: Api<Role> = Api::namespaced(admin.clone(), pool.name());
    let role = hostaccess::role_name(&name);
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());

    // Registered, it has its Role and renews.
    eventually("the host registers", Duration::from_secs(30), || async {
        as_host
            .create(&pp, &ByoHost::new(&name, Default::default()))
            .await
            .ok()
    })
    .await;
    eventually("its Role", Duration::from_secs(30), || async {
        roles.get_opt(&role).await.ok().flatten()
    })
    .await;
    let renewal = format!("byoh-{name}-renew-{run}");
    file(&host, &renewal, &valid(&name)).await;
    signed(&admin, &renewal).await;
    // A renewal filed just before the revocation, while no approver runs (it restarts).
    approver.abort();
    let _ = approver.await;
    let after = format!("byoh-{name}-after-{run}");
    file(&host, &after, &valid(&name)).await;

    // Revoked by an administrator: its Role is taken back at once and the revocation is
    // recorded where the host cannot reach.
    annotate(&byohosts, &name, byoh_api::labels::REVOKED, "true").await;
    eventually("the Role taken back", Duration::from_secs(30), || async {
        roles.get_opt(&role).await.ok()?.is_none().then_some(())
    })
    .await;
    let records = Api::<ConfigMap>::namespaced(admin.clone(), manifests::NAMESPACE);
    eventually(
        "the revocation recorded",
        Duration::from_secs(30),
        || async {
            records
                .get_opt(&csr::enrolment::record_name(&name))
                .await
                .ok()
                .flatten()
                .filter(csr::enrolment::is_revoked)
        },
    )
    .await;

    // The revoked host may no longer delete its ByoHost (that came from its Role).
    let refused_delete = as_host.delete(&name, &DeleteParams::default()).await;
    assert!(
        matches!(&refused_delete, Err(kube::Error::Api(e)) if e.code == 403),
        "the revoked host deleted its ByoHost: {refused_delete:?}"
    );
    // Nor write anything its group still may, with the certificate it holds until it expires:
    // admission refuses every write of a revoked name. The first write may come before the API
    // server's policy has read the record; within seconds it has.
    let lease_name = byoh_api::names::host_lease_name(pool.name(), &name);
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": lease_name,
            "labels": { byoh_api::labels::HOST: name },
        },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": 40 },
    }))
    .unwrap();
    let leases = Api::<Lease>::namespaced(host.clone(), manifests::NAMESPACE);
    eventually(
        "the revoked host's Lease write refused by admission",
        Duration::from_secs(30),
        || async {
            let r = leases.create(&pp, &lease).await;
            if r.is_ok() {
                let _ = Api::<Lease>::namespaced(admin.clone(), manifests::NAMESPACE)
                    .delete(&lease_name, &DeleteParams::default())
                    .await;
            }
            refused_by_revocation(r)
        },
    )
    .await;
    let csr_attempt = format!("byoh-{name}-revoked-{run}");
    let (pem, _) = byoh_tests::csr::request(&valid(&name));
    refused_by_revocation(
        byoh_tests::csr::file_text(&host, &csr_attempt, &valid(&name), pem.into_bytes()).await,
    )
    .expect("the revoked host filed a CSR");
    let event: Event = serde_json::from_value(serde_json::json!({
        "metadata": { "generateName": "revoked-" },
        "eventTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now()
        ),
        "reason": "Registered", "action": "Register",
        "reportingController": "byoh-agent", "reportingInstance": name,
        "type": "Normal",
        "regarding": {
            "apiVersion": byoh_api::API_VERSION, "kind": "ByoHost",
            "name": name, "namespace": pool.name(),
        },
    }))
    .unwrap();
    refused_by_revocation(
        Api::<Event>::namespaced(host.clone(), pool.name())
            .create(&pp, &event)
            .await,
    )
    .expect("the revoked host wrote an Event");

    // Once its ByoHost is gone (an administrator cleans up), the host may not create another.
    byohosts
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the ByoHost gone", Duration::from_secs(30), || async {
        byohosts.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    refused_by_revocation(
        as_host
            .create(&pp, &ByoHost::new(&name, Default::default()))
            .await,
    )
    .expect("the revoked host re-created its ByoHost");
    // One that reappears without the mark anyway (an administrator restores an old backup)
    // changes nothing: the record decides.
    let again = byohosts
        .create(&pp, &ByoHost::new(&name, Default::default()))
        .await
        .unwrap();
    assert!(
        !again.annotations().contains_key(byoh_api::labels::REVOKED),
        "{again:?}"
    );

    // The renewal filed before the revocation stays pending once an approver looks at it,
    // with a Warning naming the revocation: no certificate.
    let approver = tokio::spawn(csr::run(
        controller_client_on(cp.kubeconfig()).await.unwrap(),
        CsrOptions::default(),
    ));
    let note = refused_with(&admin, &after).await;
    assert!(note.contains("is revoked"), "{note}");
    let csr = csrs.get(&after).await.unwrap();
    assert!(
        csr.status
            .and_then(|s| s.certificate)
            .is_none_or(|c| c.0.is_empty()),
        "a revoked host got a certificate"
    );
    // Nor does a bootstrap token get the name.
    let token = agent::create_bootstrap_token(&admin, Duration::from_secs(3600))
        .await
        .unwrap();
    let enrol = format!("byoh-{name}-enrol-{run}");
    let bootstrapper = token_client_on(cp.kubeconfig(), &token).await.unwrap();
    file(&bootstrapper, &enrol, &valid(&name)).await;
    let note = refused_with(&admin, &enrol).await;
    assert!(note.contains("revoked"), "{note}");
    // And the re-created ByoHost got no Role: the reconciler saw it (the Warning above came
    // later than its creation) and read the record before any grant.
    assert!(
        roles.get_opt(&role).await.unwrap().is_none(),
        "the re-created ByoHost of a revoked host got its Role back"
    );
    assert!(!approved(&csrs.get(&after).await.unwrap()));

    approver.abort();
    reconciler.abort();
    for csr_name in [&renewal, &after, &enrol] {
        let _ = csrs.delete(csr_name, &DeleteParams::default()).await;
    }
    let _ = records
        .delete(
            &csr::enrolment::record_name(&name),
            &DeleteParams::default(),
        )
        .await;
    pool.cleanup(&admin).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approver_that_fails_after_claiming_the_permission_loses_nothing() {
    if control_plane::client().await.is_none() {
        return;
    }
    // On a control plane of its own: on the shared one, the full approvers other test
    // binaries run at the same time would take the first CSR (CSRs are cluster-wide).
    let cp = PrivateControlPlane::start().unwrap();
    let admin = cp.client().await.unwrap();
    install_components(&admin).await.unwrap();
    let run = random_lower(6);
    // An approver with the controller's ClusterRole and Leases Role but, in the provider's
    // namespace, only the right to read ConfigMaps: it claims the permission, then cannot write
    // the enrolment record (as an API error or a timeout would stop it at that point).
    let user = format!("byoh-test:approver-{run}");
    let subject = Subject {
        kind: "User".into(),
        name: user.clone(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        namespace: None,
    };
    let binding_meta = |namespace: Option<&str>| ObjectMeta {
        name: Some(format!("byoh-test-approver-{run}")),
        namespace: namespace.map(Into::into),
        ..ObjectMeta::default()
    };
    let cluster_bindings = Api::<ClusterRoleBinding>::all(admin.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: binding_meta(None),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: manifests::MANAGER_ROLE.into(),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .unwrap();
    let roles = Api::<Role>::namespaced(admin.clone(), manifests::NAMESPACE);
    let role_bindings = Api::<RoleBinding>::namespaced(admin.clone(), manifests::NAMESPACE);
    let mut read_only = manifests::enrolment_records_role(manifests::NAMESPACE);
    read_only.metadata = binding_meta(Some(manifests::NAMESPACE));
    for rule in read_only.rules.iter_mut().flatten() {
        rule.verbs = vec!["get".into()];
    }
    roles
        .create(&PostParams::default(), &read_only)
        .await
        .unwrap();
    role_bindings
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: binding_meta(Some(manifests::NAMESPACE)),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: read_only.name_any(),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .unwrap();
    let mut leases = binding_meta(Some(manifests::NAMESPACE));
    leases.name = Some(format!("byoh-test-approver-leases-{run}"));
    role_bindings
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: leases,
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: manifests::LEASES_ROLE.into(),
                },
                subjects: Some(vec![subject]),
            },
        )
        .await
        .unwrap();

    let ns = TestNamespace::create(&admin, "claim").await.unwrap();
    let byohosts = Api::<ByoHost>::namespaced(admin.clone(), ns.name());
    let host = format!("reinstalled-{run}");
    byohosts
        .create(
            &PostParams::default(),
            &ByoHost::new(&host, Default::default()),
        )
        .await
        .unwrap();
    annotate(
        &byohosts,
        &host,
        byoh_api::labels::ALLOW_RE_ENROLMENT,
        "true",
    )
    .await;
    let token = agent::create_bootstrap_token(&admin, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrapper = token_client_on(cp.kubeconfig(), &token).await.unwrap();
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let first = format!("byoh-{host}-first-{run}");
    file(&bootstrapper, &first, &valid(&host)).await;
    let uid = csrs.get(&first).await.unwrap().uid().unwrap();

    let failing = tokio::spawn(csr::run(
        impersonating_on(cp.kubeconfig(), &user, &["system:authenticated"])
            .await
            .unwrap(),
        CsrOptions::default(),
    ));
    let claim = csr::identity::claim(&first, &uid);
    eventually(
        "the permission claimed for the first CSR",
        Duration::from_secs(60),
        || async {
            let now = byohosts.get(&host).await.ok()?;
            (now.annotations().get(byoh_api::labels::ALLOW_RE_ENROLMENT) == Some(&claim))
                .then_some(())
        },
    )
    .await;
    // Another holder of the token files a CSR for the name meanwhile: the claim is not its.
    let second = format!("byoh-{host}-second-{run}");
    file(&bootstrapper, &second, &valid(&host)).await;
    let note = refused_with(&admin, &second).await;
    assert!(
        note.contains(&format!("used by another CSR first ({claim})")),
        "{note}"
    );
    // It retries every 10 s and fails each time: the first CSR stays pending.
    tokio::time::sleep(Duration::from_secs(12)).await;
    failing.abort();
    assert!(
        !approved(&csrs.get(&first).await.unwrap()),
        "approved without its record"
    );

    let approver = tokio::spawn(csr::run(
        controller_client_on(cp.kubeconfig()).await.unwrap(),
        CsrOptions::default(),
    ));
    // The first CSR, looked at again by an approver that can write the record: approved, and
    // the permission removed once used.
    signed(&admin, &first).await;
    assert!(
        !approved(&csrs.get(&second).await.unwrap()),
        "two CSRs approved on one permission"
    );
    permission_removed(&byohosts, &host).await;

    approver.abort();
    ns.cleanup(&admin).await.unwrap();
}
