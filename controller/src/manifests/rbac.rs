//! The controller's RBAC in the generated manifests: its ClusterRole (each rule says why), the
//! Roles it needs in the provider's namespace only (enrolment records, Leases), their bindings
//! to its ServiceAccount, and the ClusterRole aggregated into Cluster API's manager.

use super::{AGGREGATE_ROLE, MANAGER_ROLE, NAMESPACE, SERVICE_ACCOUNT, cluster_meta};
use crate::hostaccess;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Our kinds' plural names.
const OUR_RESOURCES: &[&str] = &[
    "bootstrapkubeconfigs",
    "byoclusters",
    "byoclustertemplates",
    "byohosts",
    "byomachines",
    "byomachinetemplates",
    "byoremediations",
    "byoremediationtemplates",
    "k8sinstallerconfigs",
    "k8sinstallerconfigtemplates",
];

fn our(suffix: &str) -> Vec<String> {
    OUR_RESOURCES
        .iter()
        .map(|r| format!("{r}{suffix}"))
        .collect()
}

fn rule_owned(
    groups: &[&str],
    resources: Vec<String>,
    verbs: &[&str],
    names: &[&str],
) -> PolicyRule {
    let mut r = hostaccess::rule(groups, &[], verbs, names);
    r.resources = Some(resources);
    r
}

/// The controller's ClusterRole: exactly what the reconcilers need (each rule says why).
pub fn manager_cluster_role() -> ClusterRole {
    let g = byoh_api::GROUP;
    let rule = hostaccess::rule;
    ClusterRole {
        metadata: cluster_meta(MANAGER_ROLE),
        rules: Some(vec![
            // Our kinds: reconciled (ByoCluster, ByoMachine, BootstrapKubeconfig,
            // K8sInstallerConfig), claimed (ByoHost), cloned (templates).
            rule_owned(
                &[g],
                our(""),
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
                &[],
            ),
            rule_owned(&[g], our("/status"), &["get", "update", "patch"], &[]),
            rule_owned(&[g], our("/finalizers"), &["update"], &[]),
            // CAPI core objects: read (owner Cluster and Machine, bootstrap data name), and
            // delete a Machine whose host asked to be decommissioned (`byoh-agent
            // decommission --force`), as a MachineHealthCheck remediation does.
            rule(
                &["cluster.x-k8s.io"],
                &["clusters"],
                &["get", "list", "watch"],
                &[],
            ),
            rule(
                &["cluster.x-k8s.io"],
                &["machines"],
                &["get", "list", "watch", "delete"],
                &[],
            ),
            // A ByoRemediation whose steps did not help hands its Machine to the Machine's
            // owner: the Machine's `OwnerRemediated` condition False (remediation.rs).
            rule(&["cluster.x-k8s.io"], &["machines/status"], &["patch"], &[]),
            // Secrets, write-only except `get`: bootstrap token Secrets in kube-system and
            // bootstrap kubeconfig Secrets (create/patch by server-side apply, delete with the
            // BootstrapKubeconfig). `get` is held only because RBAC lets the controller grant a
            // host `get` on its bootstrap data Secret only if it holds that permission itself
            // (escalation prevention); no list/watch, so it cannot enumerate Secrets.
            rule(
                &[""],
                &["secrets"],
                &["get", "create", "update", "patch", "delete"],
                &[],
            ),
            // Events about our objects and the CSRs it refuses.
            rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "patch"],
                &[],
            ),
            // CSR approval of host certificates (see csr.rs), for this one signer only.
            rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["get", "list", "watch"],
                &[],
            ),
            rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/approval"],
                &["update"],
                &[],
            ),
            rule(
                &["certificates.k8s.io"],
                &["signers"],
                &["approve"],
                &[crate::csr::SIGNER],
            ),
            // Per-host Roles and RoleBindings (hostaccess.rs). No `escalate`/`bind`: the
            // controller holds every permission it grants (above and below), which RBAC
            // requires, instead of the power to grant anything.
            rule(
                &["rbac.authorization.k8s.io"],
                &["roles", "rolebindings"],
                // delete: a ByoHost in a reserved namespace loses any grant it had.
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
                &[],
            ),
            // Who may read /metrics: the caller's token and its access to `get /metrics`,
            // reviewed by the API server (metrics_auth.rs).
            rule(
                &["authentication.k8s.io"],
                &["tokenreviews"],
                &["create"],
                &[],
            ),
            rule(
                &["authorization.k8s.io"],
                &["subjectaccessreviews"],
                &["create"],
                &[],
            ),
        ]),
        aggregation_rule: None,
    }
}

/// ClusterRole aggregated into CAPI's manager (`cluster.x-k8s.io/aggregate-to-manager: "true"`):
/// CAPI's controllers clone our templates and read and delete our objects.
pub fn aggregate_cluster_role() -> ClusterRole {
    let mut meta = cluster_meta(AGGREGATE_ROLE);
    meta.labels.get_or_insert_default().insert(
        "cluster.x-k8s.io/aggregate-to-manager".into(),
        "true".into(),
    );
    ClusterRole {
        metadata: meta,
        rules: Some(vec![rule_owned(
            &[byoh_api::GROUP],
            our(""),
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            &[],
        )]),
        aggregation_rule: None,
    }
}

/// ClusterRoleBinding of [`manager_cluster_role`] to the controller's ServiceAccount.
pub fn manager_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: cluster_meta(MANAGER_ROLE),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: MANAGER_ROLE.into(),
        },
        subjects: Some(vec![controller_subject()]),
    }
}

/// Name of the Role (and its RoleBinding) that lets the controller keep the enrolment records
/// (`crate::csr::enrolment`) in the provider's namespace.
pub const ENROLMENT_RECORDS_ROLE: &str = "byoh-enrolment-records";

/// A Role of the controller's in the provider's namespace `namespace`, named `name`, with
/// `rules`: rights that are none of its business in other namespaces.
fn provider_role(namespace: &str, name: &str, rules: Vec<PolicyRule>) -> Role {
    Role {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            ..cluster_meta(name)
        },
        rules: Some(rules),
    }
}

/// The RoleBinding of [`provider_role`] `name` to the controller's ServiceAccount.
fn provider_role_binding(namespace: &str, name: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            ..cluster_meta(name)
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![controller_subject()]),
    }
}

/// The controller's Role in the provider's namespace `namespace`: ConfigMaps get, create and
/// update, for the enrolment records (`crate::csr::enrolment`). A Role, not a rule of the
/// ClusterRole: ConfigMaps of other namespaces are none of the controller's business. No host
/// or bootstrap token holds any ConfigMap right there, so they cannot touch the records.
pub fn enrolment_records_role(namespace: &str) -> Role {
    provider_role(
        namespace,
        ENROLMENT_RECORDS_ROLE,
        vec![hostaccess::rule(
            &[""],
            &["configmaps"],
            &["get", "create", "update"],
            &[],
        )],
    )
}

/// RoleBinding of [`enrolment_records_role`] to the controller's ServiceAccount.
pub fn enrolment_records_role_binding(namespace: &str) -> RoleBinding {
    provider_role_binding(namespace, ENROLMENT_RECORDS_ROLE)
}

/// Name of the Role (and its RoleBinding) that lets the controller use the Leases of the
/// provider's namespace.
pub const LEASES_ROLE: &str = "byoh-manager-leases";

/// The controller's Leases, in the provider's namespace `namespace` only: its leader Lease
/// (get, create, update, patch) and the hosts' Leases (get, list, watch: their liveness; the
/// hosts' own rights come from [`hostaccess::host_leases_role`], so no delete). A Role, not a
/// rule of the ClusterRole (issue 43: the controller's privileges cut to what it uses): with
/// Leases in every namespace it could take any component's leader Lease, kube-scheduler's or
/// kube-controller-manager's in `kube-system`. A `--leader-election-namespace` or
/// `--host-lease-namespace` elsewhere needs the same Role there.
pub fn leases_role(namespace: &str) -> Role {
    provider_role(
        namespace,
        LEASES_ROLE,
        vec![hostaccess::rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update", "patch"],
            &[],
        )],
    )
}

/// RoleBinding of [`leases_role`] to the controller's ServiceAccount.
pub fn leases_role_binding(namespace: &str) -> RoleBinding {
    provider_role_binding(namespace, LEASES_ROLE)
}

fn controller_subject() -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: SERVICE_ACCOUNT.into(),
        namespace: Some(NAMESPACE.into()),
        api_group: None,
    }
}
