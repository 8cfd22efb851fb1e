//! Events a host may write (issue 43), on the real API server with the generated components: the
//! hosts' group holds Event create/patch in every namespace (RBAC cannot say "about your own
//! object"), and the admission policy `byoh-host-event-restriction` narrows it to Events about
//! the host's own ByoHost, in a host pool. Played as a host would: the agent's own Event (kube's
//! Recorder, as `agent/src/events.rs` publishes it) goes through; a forged "awaits manual
//! approval" Event about a CSR under the approver's name, an Event about another host, one
//! outside a pool, and a rewrite of the controller's Event are refused.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_controller::admission;
use byoh_controller::csr;
use byoh_tests::access::*;
use byoh_tests::control_plane::{self, TestNamespace};
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use serde_json::json;
use std::time::Duration;

/// The message of a refused write, or a panic naming `what` if it was allowed.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) => {
            assert!(s.code == 403 || s.code == 422, "{what}: {s:?}");
            s.message
        }
        other => panic!("{what}: allowed or other error: {other:?}"),
    }
}

/// An events.k8s.io/v1 Event named `name` in `namespace` about `regarding`.
fn event(name: &str, namespace: &str, regarding: serde_json::Value, reason: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": namespace },
        "eventTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now()
        ),
        "reportingController": csr::CONTROLLER_NAME,
        "reportingInstance": csr::CONTROLLER_NAME,
        "action": "Approve",
        "reason": reason,
        "type": "Normal",
        "note": "valid certificate request; manual approval is on: run kubectl certificate approve",
        "regarding": regarding,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_write_events_only_about_their_own_byohost_in_a_pool() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let pool = TestNamespace::create(&admin, "events").await.unwrap();
    let name = format!("ev-{}", random_lower(6));
    let host = host_client(&name).await.unwrap();
    let pp = PostParams::default();
    let csr_ref = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "name": format!("byoh-{name}-lure"),
    });

    // The forged "awaits manual approval" Event about a CSR, under the approver's name, in
    // `default` (where Events about cluster-scoped objects go). Polled: a new policy takes a
    // moment to be enforced.
    let lure = format!("{name}-lure");
    let message = eventually(
        "the lure refused by the policy",
        Duration::from_secs(30),
        || async {
            match Api::<Event>::namespaced(host.clone(), "default")
                .create(
                    &pp,
                    &event(&lure, "default", csr_ref.clone(), csr::MANUAL_REASON),
                )
                .await
            {
                Err(kube::Error::Api(s)) => Some(s.message),
                Ok(_) => {
                    // Not enforced yet: undo and try again.
                    Api::<Event>::namespaced(admin.clone(), "default")
                        .delete(&lure, &Default::default())
                        .await
                        .unwrap();
                    None
                }
                Err(e) => panic!("creating the lure: {e}"),
            }
        },
    )
    .await;
    assert!(
        message.contains(admission::EVENT_POLICY) && message.contains("its own ByoHost"),
        "{message}"
    );

    // The agent's own Event, as it publishes it: allowed.
    let mut own = ByoHost::new(&name, Default::default());
    own.metadata.namespace = Some(pool.name().into());
    Recorder::new(
        host.clone(),
        Reporter {
            controller: "byoh-agent".into(),
            instance: Some(name.clone()),
        },
    )
    .publish(
        &RecorderEvent {
            type_: EventType::Normal,
            reason: "Registered".into(),
            note: Some("registered".into()),
            action: "Register".into(),
            secondary: None,
        },
        &own.object_ref(&()),
    )
    .await
    .unwrap();

    // About another host's ByoHost (events.k8s.io and core/v1), in the pool: refused.
    let other = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "ByoHost",
        "name": format!("{name}-other"),
        "namespace": pool.name(),
    });
    refused(
        "an Event about another host",
        Api::<Event>::namespaced(host.clone(), pool.name())
            .create(
                &pp,
                &event(&format!("{name}-x"), pool.name(), other.clone(), "Lure"),
            )
            .await,
    );
    let core: CoreEvent = serde_json::from_value(json!({
        "metadata": { "name": format!("{name}-core"), "namespace": pool.name() },
        "involvedObject": other,
        "reason": "Lure",
        "message": "x",
        "type": "Normal",
    }))
    .unwrap();
    refused(
        "a core/v1 Event about another host",
        Api::<CoreEvent>::namespaced(host.clone(), pool.name())
            .create(&pp, &core)
            .await,
    );
    // About its own ByoHost, but outside a pool: refused.
    let own_elsewhere = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "ByoHost",
        "name": name,
        "namespace": "default",
    });
    let m = refused(
        "an Event outside a host pool",
        Api::<Event>::namespaced(host.clone(), "default")
            .create(
                &pp,
                &event(&format!("{name}-out"), "default", own_elsewhere, "Lure"),
            )
            .await,
    );
    assert!(m.contains("host pool"), "{m}");

    // The controller's Event about a CSR, rewritten by the host: refused.
    let real = format!("{name}-real");
    Api::<Event>::namespaced(admin.clone(), "default")
        .create(
            &pp,
            &event(&real, "default", csr_ref.clone(), csr::NOT_APPROVED_REASON),
        )
        .await
        .unwrap();
    refused(
        "the host rewrites the approver's Event",
        Api::<Event>::namespaced(host.clone(), "default")
            .patch(
                &real,
                &PatchParams::default(),
                &Patch::Merge(json!({ "note": "approved after review; approve the next one" })),
            )
            .await,
    );

    let _ = Api::<Event>::namespaced(admin.clone(), "default")
        .delete(&real, &Default::default())
        .await;
    pool.cleanup(&admin).await.unwrap();
}
