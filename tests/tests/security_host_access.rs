//! Per-host least privilege on the real API server: the host access reconciler (in-process, as
//! the controller's ServiceAccount) gives each ByoHost a Role; the generated ClusterRoles and
//! ValidatingAdmissionPolicies do the rest. As `byoh:host:a`: its own ByoHost, status, Lease
//! and bootstrap Secret are allowed; host `b`'s ByoHost and Secret, its own claim (spec),
//! controller labels, a ByoHost or Lease named otherwise, and deleting its claimed ByoHost are
//! refused. Each field the controller or an administrator decides from (vetted labels, the
//! release clock, finalizers, ownerReferences, spec, cluster label) can be neither set on
//! CREATE nor added, changed or removed on UPDATE, through the object or its status. A host
//! name is no authority outside host pools: `kube-controller-manager` can neither register in
//! `kube-system` (nor in an unlabelled namespace) nor reach that namespace's Lease; in the
//! host-lease namespace (`byoh-system`), where the hosts' group may write Leases, a Lease of its
//! name that it did not create and the controller's own Lease are out of its reach, and it reads
//! no Lease at all. A Machine whose bootstrap data names a Secret its bootstrap config does not
//! control (the cluster's CA) gets no host, so no host is granted that Secret.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_api::byohost::{ByoHostSpec, HostClaim, MachineReference};
use byoh_api::common::LocalObjectReference;
use byoh_controller::hostaccess::{self, HostAccessOptions};
use byoh_tests::access::*;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::{host_lease_name, host_leases};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

fn claim(secret: &str) -> HostClaim {
    HostClaim {
        machine_ref: MachineReference {
            name: "m".into(),
            uid: "00000000-0000-0000-0000-000000000001".into(),
        },
        cluster_name: "c".into(),
        bootstrap_secret_ref: LocalObjectReference {
            name: secret.into(),
        },
        provider_id: "byoh://x/y".into(),
        ..Default::default()
    }
}

fn secret(name: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some([("value".to_string(), "#cloud-config\n".to_string())].into()),
        ..Default::default()
    }
}

/// Host `pool/name`'s Lease as the agent writes it (`<pool>.<name>` in the host-lease namespace,
/// labelled with the host's name).
fn lease(pool: &str, name: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {
            "name": host_lease_name(pool, name),
            "labels": { byoh_api::labels::HOST: name }
        },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": 40 }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_reaches_only_its_own_objects() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "host-access").await.unwrap();
    let reconciler = tokio::spawn(hostaccess::run(
        controller_client().await.unwrap(),
        HostAccessOptions {
            namespace: Some(ns.name().into()),
            provider_namespace: byoh_controller::manifests::NAMESPACE.into(),
        },
    ));
    let pp = PostParams::default();
    let admin_hosts: Api<ByoHost> = Api::namespaced(admin.clone(), ns.name());
    let admin_secrets: Api<Secret> = Api::namespaced(admin.clone(), ns.name());
    for name in ["a-bootstrap", "b-bootstrap"] {
        admin_secrets.create(&pp, &secret(name)).await.unwrap();
    }
    // The host creates its own ByoHost (create is allowed by the ClusterRole; the policy checks
    // the name and an empty spec), then the controller claims both hosts.
    let a = host_client("a").await.unwrap();
    let hosts: Api<ByoHost> = Api::namespaced(a.clone(), ns.name());
    let created = eventually(
        "host a may create its ByoHost",
        Duration::from_secs(30),
        || async {
            hosts
                .create(&pp, &ByoHost::new("a", ByoHostSpec::default()))
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(created.metadata.name.as_deref(), Some("a"));
    admin_hosts
        .create(&pp, &ByoHost::new("b", ByoHostSpec::default()))
        .await
        .unwrap();
    for (host, s) in [("a", "a-bootstrap"), ("b", "b-bootstrap")] {
        admin_hosts
            .patch(
                host,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "claim": claim(s) } })),
            )
            .await
            .unwrap();
    }

    // Allowed once the controller has written a's Role: its own ByoHost (get, and list/watch
    // with the name field selector), status, bootstrap Secret and Lease.
    let secrets: Api<Secret> = Api::namespaced(a.clone(), ns.name());
    eventually(
        "host a may read its bootstrap Secret",
        Duration::from_secs(30),
        || async { secrets.get("a-bootstrap").await.ok() },
    )
    .await;
    hosts.get("a").await.unwrap();
    let own = hosts
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap();
    assert_eq!(own.items.len(), 1);
    hosts
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "status": { "phase": "Bootstrapping", "agentVersion": "test" } }),
            ),
        )
        .await
        .unwrap();
    hosts
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "site": "lab" } } })),
        )
        .await
        .unwrap();
    let leases: Api<Lease> = host_leases(&a);
    let (lease_a, lease_b) = (
        host_lease_name(ns.name(), "a"),
        host_lease_name(ns.name(), "b"),
    );
    leases.create(&pp, &lease(ns.name(), "a")).await.unwrap();
    leases
        .patch(
            &lease_a,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "renewTime": "2030-01-01T00:00:00.000000Z" } })),
        )
        .await
        .unwrap();

    // Refused by RBAC (403): other hosts' objects and Secrets, listing all ByoHosts.
    let forbidden = |what: &str, s: kube::core::Status| {
        assert_eq!(s.code, 403, "{what}: {s:?}");
    };
    forbidden(
        "get b's bootstrap Secret",
        refused("get b-bootstrap", secrets.get("b-bootstrap").await),
    );
    forbidden(
        "patch ByoHost b",
        refused(
            "patch b",
            hosts
                .patch(
                    "b",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
                )
                .await,
        ),
    );
    // RBAC lets every host write ByoHost status; the host policy refuses another's (polled: a
    // policy is enforced a moment after it is created, and this may be the first test of a
    // new control plane).
    let status_refusal = eventually(
        "the host policy to refuse b's status to host a",
        Duration::from_secs(30),
        || async {
            hosts
                .patch_status(
                    "b",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "phase": "x" } })),
                )
                .await
                .err()
        },
    )
    .await;
    forbidden(
        "patch b's status",
        refused::<()>("patch b status", Err(status_refusal)),
    );
    forbidden(
        "list all ByoHosts",
        refused("list", hosts.list(&ListParams::default()).await),
    );
    forbidden(
        "list Secrets",
        refused("list secrets", secrets.list(&ListParams::default()).await),
    );
    // Decommissioning deletes a host's own Lease and ByoHost, never another host's.
    forbidden(
        "delete ByoHost b",
        refused(
            "delete b",
            hosts.delete("b", &DeleteParams::default()).await,
        ),
    );
    // b's Lease (made as b's agent would) is refused to a by the Lease policy.
    let admin_leases = host_leases(&admin);
    admin_leases
        .create(&pp, &lease(ns.name(), "b"))
        .await
        .unwrap();
    let delete_b = eventually(
        "deleting b's Lease refused by the Lease policy",
        Duration::from_secs(30),
        || async {
            match leases.delete(&lease_b, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) => Some(*s),
                Ok(_) => {
                    admin_leases
                        .create(&pp, &lease(ns.name(), "b"))
                        .await
                        .unwrap();
                    None
                }
                Err(e) => panic!("delete lease b: {e}"),
            }
        },
    )
    .await;
    forbidden("delete b's Lease", delete_b);
    for what in ["read", "list"] {
        let s = refused(
            what,
            if what == "read" {
                leases.get(&lease_b).await.map(|_| ())
            } else {
                leases.list(&ListParams::default()).await.map(|_| ())
            },
        );
        forbidden(&format!("{what} b's Lease"), s);
    }
    admin_leases
        .delete(&lease_b, &DeleteParams::default())
        .await
        .unwrap();

    // Refused by the admission policy: its own claim, controller labels, other names,
    // deleting while claimed, another host's Lease.
    // Policies are enforced shortly after they are created: wait for the first denial.
    eventually(
        "the host policy to be enforced",
        Duration::from_secs(30),
        || async {
            match hosts
                .create(&pp, &ByoHost::new("probe", ByoHostSpec::default()))
                .await
            {
                Err(kube::Error::Api(_)) => Some(()),
                Ok(_) => {
                    let _ = admin_hosts.delete("probe", &DeleteParams::default()).await;
                    None
                }
                Err(e) => panic!("create probe: {e}"),
            }
        },
    )
    .await;
    let denied = |what: &str, s: kube::core::Status, text: &str| {
        assert!(s.code == 403 || s.code == 422, "{what}: {s:?}");
        assert!(
            s.message.contains(text),
            "{what}: {:?} lacks {text:?}",
            s.message
        );
    };
    denied(
        "drop its own claim",
        refused(
            "drop claim",
            hosts
                .patch(
                    "a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "claim": null } })),
                )
                .await,
        ),
        "may not change spec",
    );
    denied(
        "set needsCleanup",
        refused(
            "needsCleanup",
            hosts
                .patch(
                    "a",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "spec": { "needsCleanup": { "machineUID": "u", "reason": "r" } } }),
                    ),
                )
                .await,
        ),
        "may not change spec",
    );
    for label in [
        byoh_api::labels::CLUSTER_NAME,
        byoh_api::labels::MACHINE_NAME,
    ] {
        denied(
            label,
            refused(
                label,
                hosts
                    .patch(
                        "a",
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "labels": { label: "x" } } })),
                    )
                    .await,
            ),
            "may not set, change or remove the label",
        );
    }
    denied(
        "create a ByoHost named otherwise",
        refused(
            "create ab",
            hosts
                .create(&pp, &ByoHost::new("ab", ByoHostSpec::default()))
                .await,
        ),
        "named exactly like itself",
    );
    denied(
        "create a ByoHost with a claim",
        refused("create a2", {
            let other_ns = Api::<ByoHost>::namespaced(a.clone(), "default");
            let mut h = ByoHost::new("a", ByoHostSpec::default());
            h.spec.claim = Some(claim("a-bootstrap"));
            other_ns.create(&pp, &h).await
        }),
        "may not set spec",
    );
    denied(
        "delete its claimed ByoHost",
        refused(
            "delete a",
            hosts.delete("a", &DeleteParams::default()).await,
        ),
        "while it is claimed",
    );
    // The Lease policy is a policy of its own, enforced shortly after it was created too.
    let lease_refusal = eventually(
        "the Lease policy to be enforced",
        Duration::from_secs(30),
        || async {
            match leases.create(&pp, &lease(ns.name(), "b")).await {
                Err(kube::Error::Api(s)) => Some(*s),
                Ok(_) => {
                    let _ = admin_leases
                        .delete(&lease_b, &DeleteParams::default())
                        .await;
                    None
                }
                Err(e) => panic!("create lease b: {e}"),
            }
        },
    )
    .await;
    denied(
        "create host b's Lease",
        lease_refusal,
        "only create or change its own Lease",
    );

    // When the claim goes, so does the access to the bootstrap Secret; then the host may
    // delete its (free) ByoHost.
    admin_hosts
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "claim": null } })),
        )
        .await
        .unwrap();
    eventually(
        "host a loses access to the released bootstrap Secret",
        Duration::from_secs(30),
        || async {
            matches!(secrets.get("a-bootstrap").await, Err(kube::Error::Api(s)) if s.code == 403)
                .then_some(())
        },
    )
    .await;
    // As `byoh-agent decommission` does: its own Lease, then its own (free) ByoHost.
    leases
        .delete(&lease_a, &DeleteParams::default())
        .await
        .unwrap();
    hosts.delete("a", &DeleteParams::default()).await.unwrap();

    reconciler.abort();
    ns.cleanup(&admin).await.unwrap();
}

/// Asserts that `s` is an admission refusal (403 or 422) whose message contains `text`.
fn assert_denied(what: &str, s: &kube::core::Status, text: &str) {
    assert!(s.code == 403 || s.code == 422, "{what}: {s:?}");
    assert!(
        s.message.contains(text),
        "{what}: {:?} lacks {text:?}",
        s.message
    );
}

/// `patch` merged into `base` (RFC 7396 merge patch; `null` removes).
fn merged(mut base: serde_json::Value, patch: &serde_json::Value) -> serde_json::Value {
    match (base.as_object_mut(), patch.as_object()) {
        (Some(b), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    let old = b.remove(k).unwrap_or(serde_json::Value::Null);
                    b.insert(k.clone(), merged(old, v));
                }
            }
            base
        }
        _ => patch.clone(),
    }
}

/// A field of a ByoHost that a host may not write: merge patches that set it to a first and a
/// second value and that remove it, and the words the refusals must contain.
struct Protected {
    host: &'static str,
    set: [serde_json::Value; 2],
    remove: serde_json::Value,
    on_create: &'static str,
    on_update: &'static str,
}

/// What a host's refused writes must leave unchanged.
fn protected_state(h: &ByoHost) -> serde_json::Value {
    json!([
        h.metadata.labels,
        h.metadata.annotations,
        h.metadata.finalizers,
        h.metadata.owner_references,
        h.spec,
        h.metadata.resource_version,
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_cannot_set_change_or_remove_what_the_controller_decides_from() {
    use byoh_api::labels;
    use k8s_openapi::api::core::v1::ConfigMap;
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "host-fields").await.unwrap();
    let reconciler = tokio::spawn(hostaccess::run(
        controller_client().await.unwrap(),
        HostAccessOptions {
            namespace: Some(ns.name().into()),
            provider_namespace: byoh_controller::manifests::NAMESPACE.into(),
        },
    ));
    let pp = PostParams::default();
    let admin_hosts: Api<ByoHost> = Api::namespaced(admin.clone(), ns.name());
    // Real owners, so that the garbage collector leaves the ByoHost alone while an admin's
    // ownerReference is in place.
    let mut owners = Vec::new();
    for name in ["owner-one", "owner-two"] {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns.name())
            .create(&pp, &cm)
            .await
            .unwrap();
        owners.push(json!({ "metadata": { "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": name,
            "uid": cm.metadata.uid.unwrap(),
        }] } }));
    }
    let [owner_one, owner_two]: [serde_json::Value; 2] = owners.try_into().unwrap();
    let vetted = format!("{}pool", labels::VETTED_PREFIX);
    let vetted_sub = format!("rack.{}", vetted);
    let label = |key: &str, v: Option<&str>| json!({ "metadata": { "labels": { key: v } } });
    let annotation =
        |key: &str, v: Option<&str>| json!({ "metadata": { "annotations": { key: v } } });
    let previous = |v: &str| {
        json!({ "spec": { "previousMachineRef": {
            "name": v, "uid": "00000000-0000-0000-0000-000000000002" } } })
    };
    let cases = [
        Protected {
            host: "vetted",
            set: [label(&vetted, Some("prod")), label(&vetted, Some("dev"))],
            remove: label(&vetted, None),
            on_create: "labels with the prefix vetted.byoh.infrastructure.cluster.x-k8s.io/",
            on_update: "labels with the prefix vetted.byoh.infrastructure.cluster.x-k8s.io/",
        },
        Protected {
            host: "vetted-sub",
            set: [label(&vetted_sub, Some("a")), label(&vetted_sub, Some("b"))],
            remove: label(&vetted_sub, None),
            on_create: "labels with the prefix vetted.byoh.infrastructure.cluster.x-k8s.io/",
            on_update: "labels with the prefix vetted.byoh.infrastructure.cluster.x-k8s.io/",
        },
        Protected {
            host: "clock",
            set: [
                annotation(labels::RELEASE_REQUESTED_AT, Some("2030-01-01T00:00:00Z")),
                annotation(labels::RELEASE_REQUESTED_AT, Some("9999-12-31T00:00:00Z")),
            ],
            remove: annotation(labels::RELEASE_REQUESTED_AT, None),
            on_create: "annotations of byoh.infrastructure.cluster.x-k8s.io",
            on_update: "annotations of byoh.infrastructure.cluster.x-k8s.io",
        },
        Protected {
            host: "fin",
            set: [
                json!({ "metadata": { "finalizers": ["example.com/one"] } }),
                json!({ "metadata": { "finalizers": ["example.com/two"] } }),
            ],
            remove: json!({ "metadata": { "finalizers": null } }),
            on_create: "metadata.finalizers",
            on_update: "metadata.finalizers",
        },
        Protected {
            host: "owned",
            set: [owner_one, owner_two],
            remove: json!({ "metadata": { "ownerReferences": null } }),
            on_create: "metadata.ownerReferences",
            on_update: "metadata.ownerReferences",
        },
        Protected {
            host: "prev",
            set: [previous("m1"), previous("m2")],
            remove: json!({ "spec": { "previousMachineRef": null } }),
            on_create: "may not set spec (claim, needsCleanup, previousMachineRef)",
            on_update: "may not change spec",
        },
        Protected {
            host: "cluster",
            set: [
                label(labels::CLUSTER_NAME, Some("c1")),
                label(labels::CLUSTER_NAME, Some("c2")),
            ],
            remove: label(labels::CLUSTER_NAME, None),
            on_create: "the label cluster.x-k8s.io/cluster-name",
            on_update: "the label cluster.x-k8s.io/cluster-name",
        },
    ];
    let ordinary = |name: &str| {
        json!({
            "apiVersion": byoh_api::API_VERSION, "kind": "ByoHost",
            "metadata": { "name": name, "labels": { "site": "lab" } },
            "spec": {},
        })
    };

    // CREATE with the field: refused. Polls: the policy is enforced a moment after it changed.
    for c in &cases {
        let hosts: Api<ByoHost> = Api::namespaced(host_client(c.host).await.unwrap(), ns.name());
        let with: ByoHost = serde_json::from_value(merged(ordinary(c.host), &c.set[0])).unwrap();
        let s = eventually(
            &format!("{}: create with the field refused", c.host),
            Duration::from_secs(30),
            || async {
                match hosts.create(&pp, &with).await {
                    Err(kube::Error::Api(s)) => Some(*s),
                    Ok(_) => {
                        let _ = admin_hosts.delete(c.host, &DeleteParams::default()).await;
                        None
                    }
                    Err(e) => panic!("{}: create: {e}", c.host),
                }
            },
        )
        .await;
        assert_denied(&format!("{}: create", c.host), &s, c.on_create);
    }

    for c in &cases {
        let client = host_client(c.host).await.unwrap();
        let hosts: Api<ByoHost> = Api::namespaced(client, ns.name());
        let patch = |p: &serde_json::Value| {
            let (hosts, p) = (hosts.clone(), p.clone());
            async move {
                hosts
                    .patch(c.host, &PatchParams::default(), &Patch::Merge(p))
                    .await
            }
        };
        // The legitimate path: its ByoHost with ordinary labels, then (once its Role exists)
        // a label change.
        let own: ByoHost = serde_json::from_value(ordinary(c.host)).unwrap();
        hosts.create(&pp, &own).await.unwrap();
        eventually(
            &format!("{}: may change its ordinary labels", c.host),
            Duration::from_secs(30),
            || async { patch(&label("site", Some("lab2"))).await.ok() },
        )
        .await;

        // UPDATE that adds the field: refused, nothing stored.
        let before = protected_state(&admin_hosts.get(c.host).await.unwrap());
        let s = refused("add", patch(&c.set[0]).await);
        assert_denied(&format!("{}: add", c.host), &s, c.on_update);
        let s = refused(
            "add with replace",
            hosts
                .replace(
                    c.host,
                    &pp,
                    &serde_json::from_value(merged(
                        serde_json::to_value(hosts.get(c.host).await.unwrap()).unwrap(),
                        &c.set[0],
                    ))
                    .unwrap(),
                )
                .await,
        );
        assert_denied(&format!("{}: add (replace)", c.host), &s, c.on_update);
        assert_eq!(
            protected_state(&admin_hosts.get(c.host).await.unwrap()),
            before,
            "{}: add",
            c.host
        );

        // An admin (or the controller) sets it; the host may neither change nor remove it.
        admin_hosts
            .patch(c.host, &PatchParams::default(), &Patch::Merge(&c.set[0]))
            .await
            .unwrap();
        let before = protected_state(&admin_hosts.get(c.host).await.unwrap());
        let s = refused("change", patch(&c.set[1]).await);
        assert_denied(&format!("{}: change", c.host), &s, c.on_update);
        let s = refused("remove", patch(&c.remove).await);
        assert_denied(&format!("{}: remove", c.host), &s, c.on_update);
        assert_eq!(
            protected_state(&admin_hosts.get(c.host).await.unwrap()),
            before,
            "{}: change, remove",
            c.host
        );

        // Through the status subresource: the status is written, the field is not.
        for (what, p) in [("change", &c.set[1]), ("remove", &c.remove)] {
            let phase = format!("status-{what}");
            let mut p = p.clone();
            p["status"] = json!({ "phase": phase });
            let r = hosts
                .patch_status(c.host, &PatchParams::default(), &Patch::Merge(p))
                .await;
            let after = admin_hosts.get(c.host).await.unwrap();
            assert!(r.is_ok(), "{}: status {what}: {r:?}", c.host);
            assert_eq!(
                after.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some(phase.as_str())
            );
            let mut state = protected_state(&after);
            let mut want = before.clone();
            // Only the resourceVersion moves (the status changed).
            state[5] = json!(null);
            want[5] = json!(null);
            assert_eq!(state, want, "{}: status {what}", c.host);
        }

        // Still the legitimate path: the agent's server-side apply of its labels.
        hosts
            .patch(
                c.host,
                &PatchParams::apply("byoh-agent").force(),
                &Patch::Apply(json!({
                    "apiVersion": byoh_api::API_VERSION, "kind": "ByoHost",
                    "metadata": { "name": c.host, "labels": {
                        "site": "lab3", labels::HOST_OS: "debian" } },
                })),
            )
            .await
            .unwrap();
    }

    // Finalizers an admin set must go before the namespace can.
    admin_hosts
        .patch(
            "fin",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    reconciler.abort();
    ns.cleanup(&admin).await.unwrap();
}

/// The reconciler writes a host's Role and RoleBinding only when they differ from what the host
/// needs: a restarted reconciler writes nothing, an edited or deleted Role is restored.
#[tokio::test(flavor = "multi_thread")]
async fn host_roles_are_written_only_when_they_differ_and_restored_when_changed() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "host-access-cache")
        .await
        .unwrap();
    let opts = HostAccessOptions {
        namespace: Some(ns.name().into()),
        provider_namespace: byoh_controller::manifests::NAMESPACE.into(),
    };
    let controller = controller_client().await.unwrap();
    let start = || tokio::spawn(hostaccess::run(controller.clone(), opts.clone()));
    let reconciler = start();
    let admin_hosts: Api<ByoHost> = Api::namespaced(admin.clone(), ns.name());
    let roles: Api<Role> = Api::namespaced(admin.clone(), ns.name());
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), ns.name());
    let pp = PostParams::default();
    for name in ["a", "b"] {
        admin_hosts
            .create(&pp, &ByoHost::new(name, ByoHostSpec::default()))
            .await
            .unwrap();
    }
    let version = |api: Api<Role>, name: &'static str| async move {
        api.get_opt(name)
            .await
            .unwrap()
            .and_then(|r| r.metadata.resource_version)
    };
    let a_role = eventually("host a's Role", Duration::from_secs(30), || {
        version(roles.clone(), "byoh-host-a")
    })
    .await;
    let a_binding = eventually("host a's RoleBinding", Duration::from_secs(30), || async {
        bindings
            .get_opt("byoh-host-a")
            .await
            .unwrap()
            .and_then(|r| r.metadata.resource_version)
    })
    .await;

    // A restarted reconciler: host b's claim changes its Role (so the new reconciler is seen
    // at work); host a's objects keep their resourceVersion.
    reconciler.abort();
    let _ = reconciler.await;
    let reconciler = start();
    admin_hosts
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "claim": claim("b-bootstrap") } })),
        )
        .await
        .unwrap();
    eventually(
        "host b's Role grants its bootstrap Secret",
        Duration::from_secs(30),
        || async {
            let r = roles.get("byoh-host-b").await.ok()?;
            r.rules
                .unwrap_or_default()
                .iter()
                .any(|r| r.resources.as_deref() == Some(&["secrets".to_string()][..]))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        version(roles.clone(), "byoh-host-a").await,
        Some(a_role.clone())
    );
    assert_eq!(
        bindings
            .get("byoh-host-a")
            .await
            .unwrap()
            .metadata
            .resource_version,
        Some(a_binding)
    );

    // An admin's edit is reverted; a deleted Role comes back.
    roles
        .patch(
            "byoh-host-a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": [] })),
        )
        .await
        .unwrap();
    eventually(
        "host a's rules restored",
        Duration::from_secs(30),
        || async {
            let r = roles.get("byoh-host-a").await.ok()?;
            (r.rules.unwrap_or_default().len() == 2).then_some(())
        },
    )
    .await;
    roles
        .delete("byoh-host-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "host a's Role recreated",
        Duration::from_secs(30),
        || async {
            let v = version(roles.clone(), "byoh-host-a").await?;
            (v != a_role).then_some(())
        },
    )
    .await;

    reconciler.abort();
    ns.cleanup(&admin).await.unwrap();
}

/// The review's attack: a bootstrap token enrols the name `kube-controller-manager` and the host
/// registers in `kube-system`, where its per-host Role would grant kube-controller-manager's
/// leader Lease. Hosts register only in host pools, reserved namespaces get no grants (one made
/// before is taken back), and a Lease the host did not create is out of its reach.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_name_is_no_authority_outside_host_pools() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::rbac::v1::Role;
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    const NAME: &str = "kube-controller-manager";
    let pp = PostParams::default();
    let role = hostaccess::role_name(NAME);
    let system_hosts: Api<ByoHost> = Api::namespaced(admin.clone(), "kube-system");
    let system_roles: Api<Role> = Api::namespaced(admin.clone(), "kube-system");
    let _ = system_hosts.delete(NAME, &DeleteParams::default()).await;

    // A Role granted in kube-system before this rule existed (as the controller wrote it).
    let _ = system_roles.delete(&role, &DeleteParams::default()).await;
    let mut old_grant = hostaccess::host_role(&ByoHost::new(NAME, ByoHostSpec::default()));
    old_grant.metadata.namespace = Some("kube-system".into());
    old_grant.metadata.owner_references = None;
    system_roles.create(&pp, &old_grant).await.unwrap();

    let reconciler = tokio::spawn(hostaccess::run(
        controller_client().await.unwrap(),
        HostAccessOptions {
            namespace: None,
            provider_namespace: byoh_controller::manifests::NAMESPACE.into(),
        },
    ));
    let pool = TestNamespace::create(&admin, "pool").await.unwrap();
    let not_pool = format!("t-not-pool-{}", random_lower(6));
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": not_pool } })).unwrap(),
        )
        .await
        .unwrap();
    let host = host_client(NAME).await.unwrap();

    // The host may not register in kube-system, nor in a namespace nobody made a pool.
    for ns in ["kube-system", not_pool.as_str()] {
        let as_host: Api<ByoHost> = Api::namespaced(host.clone(), ns);
        let as_admin: Api<ByoHost> = Api::namespaced(admin.clone(), ns);
        let message = eventually(
            &format!("the host's ByoHost refused in {ns}"),
            Duration::from_secs(30),
            || async {
                match as_host
                    .create(&pp, &ByoHost::new(NAME, ByoHostSpec::default()))
                    .await
                {
                    Err(kube::Error::Api(s)) => Some(s.message),
                    // The policy's new rule is not enforced yet: undo and try again.
                    Ok(_) => {
                        as_admin
                            .delete(NAME, &DeleteParams::default())
                            .await
                            .unwrap();
                        None
                    }
                    Err(e) => panic!("create in {ns}: {e}"),
                }
            },
        )
        .await;
        assert!(message.contains("host pool"), "{ns}: {message}");
    }

    // In a pool it may, and gets its Role; the same ByoHost put into kube-system by an admin
    // gets none, and the Role granted there before is taken back.
    let pool_hosts: Api<ByoHost> = Api::namespaced(host.clone(), pool.name());
    eventually(
        "the host registers in its pool",
        Duration::from_secs(30),
        || async {
            pool_hosts
                .create(&pp, &ByoHost::new(NAME, ByoHostSpec::default()))
                .await
                .ok()
        },
    )
    .await;
    system_hosts
        .create(&pp, &ByoHost::new(NAME, ByoHostSpec::default()))
        .await
        .unwrap();
    let pool_roles: Api<Role> = Api::namespaced(admin.clone(), pool.name());
    eventually(
        "the host's Role in its pool",
        Duration::from_secs(30),
        || async { pool_roles.get(&role).await.ok() },
    )
    .await;
    eventually(
        "the Role granted in kube-system taken back",
        Duration::from_secs(30),
        || async {
            system_roles
                .get_opt(&role)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let system_leases: Api<Lease> = Api::namespaced(host.clone(), "kube-system");
    let status = refused("get kube-system's Lease", system_leases.get(NAME).await);
    assert_eq!(status.code, 403, "{status:?}");
    let status = refused(
        "patch kube-system's Lease",
        system_leases
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "holderIdentity": NAME } })),
            )
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");

    // In the host-lease namespace, a Lease of its name that another component made is out of
    // its reach, as is any other Lease there (the controller's own), and a Lease it creates must
    // say whose it is.
    let own = host_lease_name(pool.name(), NAME);
    let admin_leases = host_leases(&admin);
    let _ = admin_leases.delete(&own, &DeleteParams::default()).await;
    let foreign: Lease = serde_json::from_value(json!({
        "metadata": { "name": own },
        "spec": { "holderIdentity": "someone-else", "leaseDurationSeconds": 15 }
    }))
    .unwrap();
    admin_leases.create(&pp, &foreign).await.unwrap();
    let leases = host_leases(&host);
    let message = eventually(
        "patching a foreign Lease refused",
        Duration::from_secs(30),
        || async {
            match leases
                .patch(
                    &own,
                    &PatchParams::default(),
                    // Even labelling it as its own (adopting it) is refused.
                    &Patch::Merge(json!({
                        "metadata": { "labels": { byoh_api::labels::HOST: NAME } },
                        "spec": { "holderIdentity": NAME }
                    })),
                )
                .await
            {
                // The admission policy's denial (not RBAC's: the host's Role grants the name).
                Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
                    Some(s.message)
                }
                Err(kube::Error::Api(_)) => None,
                other => panic!("patching a foreign Lease: {other:?}"),
            }
        },
    )
    .await;
    assert!(message.contains("only a Lease it created"), "{message}");
    assert_eq!(
        admin_leases
            .get(&own)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("someone-else")
    );
    // The controller's Lease beside the hosts' (a stand-in of the leader Lease, which names no
    // host): neither changed nor deleted by a host.
    let component: Lease = serde_json::from_value(json!({
        "metadata": { "name": "byoh-test-component" },
        "spec": { "holderIdentity": "byoh-controller", "leaseDurationSeconds": 15 }
    }))
    .unwrap();
    let _ = admin_leases
        .delete("byoh-test-component", &DeleteParams::default())
        .await;
    admin_leases.create(&pp, &component).await.unwrap();
    let status = refused(
        "patch the controller's Lease",
        leases
            .patch(
                "byoh-test-component",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "holderIdentity": NAME } })),
            )
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    let status = refused(
        "delete the controller's Lease",
        leases
            .delete("byoh-test-component", &DeleteParams::default())
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    admin_leases
        .delete("byoh-test-component", &DeleteParams::default())
        .await
        .unwrap();
    // Nor may it write its Lease in its pool, where the Leases are other components' business.
    let status = refused(
        "create its Lease in the pool",
        Api::<Lease>::namespaced(host.clone(), pool.name())
            .create(&pp, &lease(pool.name(), NAME))
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    admin_leases
        .delete(&own, &DeleteParams::default())
        .await
        .unwrap();
    let unlabelled: Lease = serde_json::from_value(json!({
        "metadata": { "name": own },
        "spec": { "holderIdentity": NAME, "leaseDurationSeconds": 15 }
    }))
    .unwrap();
    let status = refused(
        "create an unlabelled Lease",
        leases.create(&pp, &unlabelled).await,
    );
    assert!(
        status.message.contains("must carry the label"),
        "{status:?}"
    );
    leases.create(&pp, &lease(pool.name(), NAME)).await.unwrap();
    admin_leases
        .delete(&own, &DeleteParams::default())
        .await
        .unwrap();

    reconciler.abort();
    system_hosts
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    namespaces
        .delete(&not_pool, &DeleteParams::default())
        .await
        .unwrap();
    pool.cleanup(&admin).await.unwrap();
}

/// The attack of issue 43 on the real API server, the whole controller running in-process as
/// its ServiceAccount: a user who may create Machines and ByoMachines but not read Secrets
/// names the cluster's CA Secret as a Machine's bootstrap data, hoping a host they control is
/// granted it. The controller claims no host for that Machine (`BootstrapDataNotOwned`, with
/// a Warning Event), so the host is refused the Secret by the API server; the same user's
/// Machine whose data its bootstrap config controls (as CABPK makes it) is claimed, and the
/// host reads that Secret.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_naming_a_secret_that_is_not_its_bootstrap_data_hands_no_host_that_secret() {
    use byoh_tests::objects::{
        BootstrapData, HostOpts, MachineOpts, Running, controller_event, create_host,
        create_machine, finish, get_host, host_claimed_false, ready_cluster, settings,
    };
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "bootstrap-owned")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let pp = PostParams::default();
    // The cluster's CA Secret, shaped as KCP makes it (KCP also makes its KubeadmControlPlane
    // its controller; no KCP runs here, and the garbage collector would delete a Secret whose
    // owner does not exist).
    let ca: Secret = serde_json::from_value(json!({
        "metadata": {"name": "c1-ca", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"tls.crt": "CERT", "tls.key": "THE CLUSTER'S CA KEY"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), &n)
        .create(&pp, &ca)
        .await
        .unwrap();
    // Mallory may create Machines and ByoMachines in the namespace, and read them; no Secrets.
    let role = Role {
        metadata: kube::api::ObjectMeta {
            name: Some("machine-author".into()),
            ..Default::default()
        },
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec!["cluster.x-k8s.io".into()]),
                resources: Some(vec!["machines".into()]),
                verbs: vec!["create".into(), "get".into(), "list".into()],
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec![byoh_api::GROUP.into()]),
                resources: Some(vec!["byomachines".into()]),
                verbs: vec!["create".into(), "get".into(), "list".into()],
                ..Default::default()
            },
        ]),
    };
    Api::<Role>::namespaced(admin.clone(), &n)
        .create(&pp, &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some("machine-author".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "machine-author".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "mallory".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &n)
        .create(&pp, &binding)
        .await
        .unwrap();
    let mallory = impersonating("mallory", &["system:authenticated"])
        .await
        .unwrap();
    let denied =
        |r: Result<Secret, kube::Error>| matches!(r, Err(kube::Error::Api(ref e)) if e.code == 403);
    assert!(
        denied(
            Api::<Secret>::namespaced(mallory.clone(), &n)
                .get("c1-ca")
                .await
        ),
        "mallory must not read Secrets herself"
    );

    let ctl = Running::start(&controller_client().await.unwrap(), &n, settings());
    ready_cluster(&admin, &n, "c1").await;
    create_host(&admin, &n, "h1", &HostOpts::default()).await;
    // Mallory's Machine names the CA Secret as its bootstrap data.
    let evil = MachineOpts {
        bootstrap_data: BootstrapData::Named("c1-ca".into()),
        ..MachineOpts::ready()
    };
    eventually(
        "mallory may create Machines (RBAC in effect)",
        Duration::from_secs(30),
        || async {
            (Api::<kube::api::DynamicObject>::namespaced_with(
                mallory.clone(),
                &n,
                &kube::api::ApiResource::from_gvk_with_plural(
                    &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
                    "machines",
                ),
            )
            .list(&ListParams::default())
            .await)
                .ok()
        },
    )
    .await;
    create_machine(&mallory, &n, "c1", "evil", &evil).await;
    let message = host_claimed_false(&admin, &n, "evil", "BootstrapDataNotOwned").await;
    assert!(
        message.contains("c1-ca") && message.contains("KubeadmConfig evil"),
        "{message}"
    );
    let note = controller_event(
        &admin,
        &n,
        ("ByoMachine", "evil"),
        ("Warning", "BootstrapDataNotOwned"),
        "c1-ca",
    )
    .await;
    assert_eq!(note, message);
    // No claim, so the host is granted nothing: the API server refuses it the CA.
    assert!(get_host(&admin, &n, "h1").await.spec.claim.is_none());
    let host_secrets: Api<Secret> = Api::namespaced(host_client("h1").await.unwrap(), &n);
    assert!(denied(host_secrets.get("c1-ca").await), "h1 read the CA");

    // Mallory's Machine whose data its bootstrap config controls (made by the bootstrap
    // provider, as CABPK makes it): claimed, and the host reads that Secret, and still not
    // the CA.
    byoh_tests::agent::create_machine_bootstrap_data(
        &admin,
        &n,
        "good",
        "good-bootstrap",
        "#cloud-config\n",
    )
    .await
    .unwrap();
    let good = MachineOpts {
        bootstrap_data: BootstrapData::Named("good-bootstrap".into()),
        ..MachineOpts::ready()
    };
    create_machine(&mallory, &n, "c1", "good", &good).await;
    eventually("good claims h1", Duration::from_secs(30), || async {
        get_host(&admin, &n, "h1")
            .await
            .spec
            .claim
            .filter(|c| c.machine_ref.name == "good")
    })
    .await;
    eventually(
        "h1 may read good's bootstrap data",
        Duration::from_secs(30),
        || async { host_secrets.get("good-bootstrap").await.ok() },
    )
    .await;
    assert!(denied(host_secrets.get("c1-ca").await), "h1 read the CA");
    finish(&admin, ns, vec![ctl]).await;
}
