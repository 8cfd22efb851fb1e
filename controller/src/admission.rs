//! ValidatingAdmissionPolicies (CEL, `admissionregistration.k8s.io/v1`, no webhook server)
//! generated for the components.
//!
//! - [`HOST_POLICY`]: requests by a host (user name `byoh:host:<name>`) on `byohosts` (and
//!   `byohosts/status`): only the ByoHost named exactly `<name>` (equality, never a substring);
//!   no DELETE while claimed; and nothing the controller or an administrator decides from may be
//!   set on CREATE or added, changed or removed on UPDATE:
//!   - `spec` (claim, clean-up mark, previous Machine): empty on CREATE, unchanged on UPDATE;
//!   - labels with the prefix [`labels::VETTED_PREFIX`] (or a subdomain of it), like the
//!     kubelet's NodeRestriction `node-restriction.kubernetes.io/` labels;
//!   - labels `cluster.x-k8s.io/cluster-name` and `byoh.infrastructure.cluster.x-k8s.io/byomachine-name`;
//!   - annotations in [`labels::BYOH_DOMAIN`] or its subdomains (the controller's release
//!     clock [`labels::RELEASE_REQUESTED_AT`]);
//!   - `metadata.finalizers` (one would make the ByoHost undeletable) and
//!     `metadata.ownerReferences` (a dangling owner makes the garbage collector delete the
//!     ByoHost, claimed or not).
//!
//!   Status writes match the same rules; the API server keeps a custom resource's metadata on
//!   writes to its `status` subresource anyway (tested in `tests/tests/security_host_access.rs`).
//!
//!   Last, the namespace must be a host pool: labelled [`labels::HOST_POOL`]`=true` by an
//!   administrator and not one of [`labels::RESERVED_NAMESPACES`] (`kube-system`, ...).
//! - [`LEASE_POLICY`]: a host may create, change or delete only its own Lease, named
//!   `<pool>.<its name>` ([`byoh_api::names::host_lease_name`]) and labelled
//!   [`labels::HOST`]`=<its name>` (so never the controller's or another component's Lease that
//!   happens to have such a name), and only in the host-lease namespace (labelled
//!   [`labels::HOST_LEASES`]`=true`: the provider's namespace, where a Role grants the hosts'
//!   group its Lease writes).
//! - [`EVENT_POLICY`]: a host may create or change only Events about its own ByoHost
//!   (`regarding`, or `involvedObject` of a core/v1 Event: kind `ByoHost`, its name, the
//!   Event's own namespace), only in a host pool, and change only such Events. The hosts' group
//!   holds Event create/patch in every namespace (RBAC cannot say "about your own object");
//!   without this a host could write an Event about a CSR under the approver's name ("awaits
//!   manual approval") to lure an administrator into approving it, or rewrite the controller's.
//! - [`TEMPLATE_POLICY`]: `spec` of ByoMachineTemplates and ByoClusterTemplates is immutable on
//!   UPDATE (CAPI's rule: make a new template and point to it), except ClusterClass dry-runs:
//!   requests that are dry runs (`request.dryRun`) **and** whose object carries the annotation
//!   `topology.cluster.x-k8s.io/dry-run`, as Cluster API's own template webhooks decide
//!   (`topology.IsDryRunRequest`: both, never the annotation alone, which anyone who may update
//!   a template can add).
//!
//! - [`REVOKED_POLICY`]: a host whose name is revoked may write nothing at all (every resource
//!   and subresource, every operation, `CONNECT` included): its Lease, its ByoHost, Events, a
//!   renewal CSR. The policy's parameters are the enrolment records labelled
//!   [`labels::REVOKED`]`=true` in the provider's namespace ([`crate::csr::enrolment::revoke`]
//!   labels them), one evaluation per revoked name, so the certificate a revoked host still holds
//!   until it expires writes nothing; its reads end with the Role the host-access reconciler takes
//!   back at once. No revoked name: no parameter, nothing refused.
//!
//! Each policy has a binding of the same name with `validationActions: [Deny]`. The policies
//! match host users by name, so the controller's own ServiceAccount (whatever namespace it runs
//! in) and human admins are never restricted by the host rules.

use crate::csr::enrolment;
use byoh_api::labels;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;

/// Name of the ByoHost policy and its binding.
pub const HOST_POLICY: &str = "byoh-host-restriction";
/// Name of the Lease policy and its binding.
pub const LEASE_POLICY: &str = "byoh-host-lease-restriction";
/// Name of the template immutability policy and its binding.
pub const TEMPLATE_POLICY: &str = "byoh-template-immutability";
/// Name of the Event policy and its binding.
pub const EVENT_POLICY: &str = "byoh-host-event-restriction";
/// Name of the revoked-host policy and its binding.
pub const REVOKED_POLICY: &str = "byoh-revoked-host";

/// CEL: the request's namespace is a host pool: labelled [`labels::HOST_POOL`]`=true` by an
/// administrator and not one of [`labels::RESERVED_NAMESPACES`].
fn in_pool() -> String {
    let reserved = labels::RESERVED_NAMESPACES
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "namespaceObject != null && has(namespaceObject.metadata.labels) && '{key}' in namespaceObject.metadata.labels && namespaceObject.metadata.labels['{key}'] == 'true' && !(namespaceObject.metadata.name in [{reserved}])",
        key = labels::HOST_POOL
    )
}

/// The validation that a host writes only in a host pool (the `kind` of object named).
fn pool_validation(kind: &str) -> Validation {
    validation(
        &format!("request.operation == 'DELETE' || ({})", in_pool()),
        &format!(
            "a host may create or change its {kind} only in a namespace an administrator designated as a host pool (namespace label {}=true; never {})",
            labels::HOST_POOL,
            labels::RESERVED_NAMESPACES.join(", ")
        ),
        "Forbidden",
    )
}

/// CEL: value of label `key` on `obj` (`object` or `oldObject`), `''` when absent or null.
fn label_value(obj: &str, key: &str) -> String {
    format!(
        "({obj} != null && has({obj}.metadata.labels) && '{key}' in {obj}.metadata.labels ? {obj}.metadata.labels['{key}'] : '')"
    )
}

/// CEL: the request comes from a host identity.
const IS_HOST: &str = "request.userInfo.username.startsWith('byoh:host:')";
/// CEL: the host's name (the user name after `byoh:host:`).
const HOST_NAME: &str = "request.userInfo.username.substring(10)";
/// CEL: the name of the object the request is about (`object` is null on DELETE).
const OBJECT_NAME: &str =
    "request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(
            [(
                labels::PROVIDER.to_string(),
                labels::PROVIDER_NAME.to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

fn strings(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

fn rule(group: &str, version: &str, resources: &[&str], ops: &[&str]) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: strings(&[group]),
        api_versions: strings(&[version]),
        resources: strings(resources),
        operations: strings(ops),
        ..Default::default()
    }
}

fn validation(expression: &str, message: &str, reason: &str) -> Validation {
    Validation {
        expression: expression.into(),
        message: Some(message.into()),
        reason: Some(reason.into()),
        message_expression: None,
    }
}

fn policy(
    name: &str,
    rules: Vec<NamedRuleWithOperations>,
    match_conditions: Vec<MatchCondition>,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
) -> ValidatingAdmissionPolicy {
    ValidatingAdmissionPolicy {
        metadata: meta(name),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                ..Default::default()
            }),
            match_conditions: (!match_conditions.is_empty()).then_some(match_conditions),
            variables: (!variables.is_empty()).then_some(variables),
            validations: Some(validations),
            ..Default::default()
        }),
        status: None,
    }
}

fn host_condition() -> Vec<MatchCondition> {
    vec![MatchCondition {
        name: "is-byoh-host".into(),
        expression: IS_HOST.into(),
    }]
}

fn host_variables() -> Vec<Variable> {
    vec![
        Variable {
            name: "hostName".into(),
            expression: HOST_NAME.into(),
        },
        Variable {
            name: "objectName".into(),
            expression: OBJECT_NAME.into(),
        },
    ]
}

/// Fields of `ByoHostSpec` (all the controller's); a host may set none of them on CREATE. A unit
/// test keeps this list equal to the CRD schema.
const SPEC_FIELDS: [&str; 3] = ["claim", "needsCleanup", "previousMachineRef"];

/// Host-policy variables `new<Name>`/`old<Name>`: `metadata.<field>` of `object`/`oldObject`,
/// `empty` when the object is null (CREATE, DELETE) or the field is absent.
fn metadata_variables(name: &str, field: &str, empty: &str) -> [Variable; 2] {
    [("new", "object"), ("old", "oldObject")].map(|(side, obj)| Variable {
        name: format!("{side}{name}"),
        expression: format!(
            "{obj} != null && has({obj}.metadata.{field}) ? {obj}.metadata.{field} : {empty}"
        ),
    })
}

/// CEL predicate on a label or annotation key `k`: its prefix is `domain` or a subdomain of it.
fn in_domain(domain: &str) -> String {
    format!("(k.startsWith('{domain}/') || k.contains('.{domain}/'))")
}

/// CEL: on CREATE and UPDATE, the entries of map variables `new<name>`/`old<name>` whose key
/// satisfies `pred` (on `k`) are the same: none added, changed or removed.
fn entries_unchanged(name: &str, pred: &str) -> String {
    let (new, old) = (
        format!("variables.new{name}"),
        format!("variables.old{name}"),
    );
    format!(
        "request.operation == 'DELETE' || ({new}.all(k, !{pred} || (k in {old} && {old}[k] == {new}[k])) && {old}.all(k, !{pred} || k in {new}))"
    )
}

/// The ByoHost restriction for hosts (see the module documentation).
pub fn host_policy() -> ValidatingAdmissionPolicy {
    let g = byoh_api::GROUP;
    let spec = SPEC_FIELDS.join(", ");
    let no_spec = SPEC_FIELDS
        .iter()
        .map(|f| format!("!has(object.spec.{f})"))
        .collect::<Vec<_>>()
        .join(" && ");
    let mut validations = vec![
        validation(
            "variables.objectName == variables.hostName",
            "a host may only create, change or delete the ByoHost named exactly like itself",
            "Forbidden",
        ),
        validation(
            &format!("request.operation != 'CREATE' || !has(object.spec) || ({no_spec})"),
            &format!(
                "a host may not set spec ({spec}) on the ByoHost it creates; spec is the controller's"
            ),
            "Forbidden",
        ),
        validation(
            "request.operation != 'UPDATE' || (has(object.spec) ? (has(oldObject.spec) && object.spec == oldObject.spec) : !has(oldObject.spec))",
            &format!(
                "a host may not change spec ({spec}) of its ByoHost; spec is the controller's"
            ),
            "Forbidden",
        ),
        validation(
            "request.operation != 'DELETE' || !has(oldObject.spec) || !has(oldObject.spec.claim)",
            "a host may not delete its ByoHost while it is claimed; the ByoMachine must release it first",
            "Forbidden",
        ),
        validation(
            &entries_unchanged("Labels", &in_domain(labels::VETTED_DOMAIN)),
            &format!(
                "a host may not set, change or remove labels with the prefix {}; an administrator marks vetted hosts",
                labels::VETTED_PREFIX
            ),
            "Forbidden",
        ),
        validation(
            &entries_unchanged("Annotations", &in_domain(labels::BYOH_DOMAIN)),
            &format!(
                "a host may not set, change or remove annotations of {} or its subdomains (such as {}); they are the controller's",
                labels::BYOH_DOMAIN,
                labels::RELEASE_REQUESTED_AT
            ),
            "Forbidden",
        ),
        validation(
            "request.operation == 'DELETE' || variables.newFinalizers == variables.oldFinalizers",
            "a host may not set, change or remove metadata.finalizers of its ByoHost; they are the controller's",
            "Forbidden",
        ),
        validation(
            "request.operation == 'DELETE' || variables.newOwnerReferences == variables.oldOwnerReferences",
            "a host may not set, change or remove metadata.ownerReferences of its ByoHost (garbage collection would delete it, claimed or not)",
            "Forbidden",
        ),
    ];
    for key in [labels::CLUSTER_NAME, labels::MACHINE_NAME] {
        validations.push(validation(
            &entries_unchanged("Labels", &format!("(k == '{key}')")),
            &format!(
                "a host may not set, change or remove the label {key}; it is the controller's"
            ),
            "Forbidden",
        ));
    }
    // Last, so that a request breaking another rule too is told that rule first.
    validations.push(pool_validation("ByoHost"));
    let mut variables = host_variables();
    for (name, field, empty) in [
        ("Labels", "labels", "{}"),
        ("Annotations", "annotations", "{}"),
        ("Finalizers", "finalizers", "[]"),
        ("OwnerReferences", "ownerReferences", "[]"),
    ] {
        variables.extend(metadata_variables(name, field, empty));
    }
    policy(
        HOST_POLICY,
        vec![rule(
            g,
            byoh_api::VERSION,
            &["byohosts", "byohosts/status"],
            &["CREATE", "UPDATE", "DELETE"],
        )],
        host_condition(),
        variables,
        validations,
    )
}

/// The Lease restriction for hosts (see the module documentation).
pub fn lease_policy() -> ValidatingAdmissionPolicy {
    policy(
        LEASE_POLICY,
        vec![rule(
            "coordination.k8s.io",
            "v1",
            &["leases"],
            &["CREATE", "UPDATE", "DELETE"],
        )],
        host_condition(),
        host_variables(),
        vec![
            validation(
                "variables.objectName.indexOf('.') > 0 && variables.objectName.substring(variables.objectName.indexOf('.') + 1) == variables.hostName",
                "a host may only create or change its own Lease, named <pool namespace>.<host name>",
                "Forbidden",
            ),
            validation(
                &format!(
                    "request.operation == 'DELETE' || {} == variables.hostName",
                    label_value("object", labels::HOST)
                ),
                &format!(
                    "a host's Lease must carry the label {}=<the host's name>",
                    labels::HOST
                ),
                "Forbidden",
            ),
            validation(
                &format!(
                    "request.operation == 'CREATE' || {} == variables.hostName",
                    label_value("oldObject", labels::HOST)
                ),
                &format!(
                    "a host may change or delete only a Lease it created (labelled {}=<its name>), never another component's Lease of the same name",
                    labels::HOST
                ),
                "Forbidden",
            ),
            validation(
                &format!(
                    "namespaceObject != null && {} == 'true'",
                    label_value("namespaceObject", labels::HOST_LEASES)
                ),
                &format!(
                    "a host may write its Lease only in the host-lease namespace (namespace label {}=true, the provider's namespace)",
                    labels::HOST_LEASES
                ),
                "Forbidden",
            ),
        ],
    )
}

/// CEL: field `field` of the object Event `obj` (`object` or
/// `oldObject`) is about: `regarding` (events.k8s.io/v1) or `involvedObject` (core/v1); `''`
/// when absent. Every branch a string, so the expression type-checks.
fn event_about(obj: &str, field: &str) -> String {
    format!(
        "has({obj}.regarding) ? (has({obj}.regarding.{field}) ? {obj}.regarding.{field} : '') : (has({obj}.involvedObject) && has({obj}.involvedObject.{field}) ? {obj}.involvedObject.{field} : '')"
    )
}

/// Variables `<side>Kind`, `<side>Name`, `<side>Namespace` of what Event `obj` is about.
fn event_variables(side: &str, obj: &str) -> [Variable; 3] {
    [
        ("Kind", "kind"),
        ("Name", "name"),
        // Plain `namespace`: the API server's CEL reads this field of a built-in type
        // unescaped (`__namespace__` is "no such key"; tests/tests/security_events.rs).
        ("Namespace", "namespace"),
    ]
    .map(|(name, field)| Variable {
        name: format!("{side}{name}"),
        expression: event_about(obj, field),
    })
}

/// CEL: the Event `obj` (variables `<side>…`) is about the host's own ByoHost in the Event's
/// namespace.
fn about_own_byohost(side: &str, obj: &str) -> String {
    format!(
        "variables.{side}Kind == 'ByoHost' && variables.{side}Name == variables.hostName && variables.{side}Namespace == {obj}.metadata.namespace"
    )
}

/// The Event restriction for hosts (see the module documentation).
pub fn event_policy() -> ValidatingAdmissionPolicy {
    let ops = ["CREATE", "UPDATE"];
    let mut variables = vec![Variable {
        name: "hostName".into(),
        expression: HOST_NAME.into(),
    }];
    variables.extend(event_variables("new", "object"));
    // Evaluated only on UPDATE (variables are lazy; CREATE has no oldObject).
    variables.extend(event_variables("old", "oldObject"));
    policy(
        EVENT_POLICY,
        vec![
            rule("", "v1", &["events"], &ops),
            rule("events.k8s.io", "v1", &["events"], &ops),
        ],
        host_condition(),
        variables,
        vec![
            validation(
                &about_own_byohost("new", "object"),
                "a host may write only Events about its own ByoHost (kind ByoHost, its name, the Event's namespace)",
                "Forbidden",
            ),
            validation(
                &format!(
                    "request.operation == 'CREATE' || ({})",
                    about_own_byohost("old", "oldObject")
                ),
                "a host may change only Events about its own ByoHost",
                "Forbidden",
            ),
            pool_validation("Events"),
        ],
    )
}

/// The template immutability policy (see the module documentation).
pub fn template_policy() -> ValidatingAdmissionPolicy {
    let g = byoh_api::GROUP;
    policy(
        TEMPLATE_POLICY,
        vec![rule(
            g,
            byoh_api::VERSION,
            &["byomachinetemplates", "byoclustertemplates"],
            &["UPDATE"],
        )],
        vec![],
        vec![],
        vec![validation(
            &format!(
                "object.spec == oldObject.spec || (has(request.dryRun) && request.dryRun == true && has(object.metadata.annotations) && '{}' in object.metadata.annotations)",
                labels::TOPOLOGY_DRY_RUN
            ),
            "spec of a ByoMachineTemplate or ByoClusterTemplate is immutable; create a new template and point to it",
            "Invalid",
        )],
    )
}

/// The revoked-host policy (see the module documentation). Its parameters are ConfigMaps; its
/// binding ([`binding`]) selects the revoked enrolment records.
pub fn revoked_policy() -> ValidatingAdmissionPolicy {
    let mut p = policy(
        REVOKED_POLICY,
        // `*/*`: every resource and every subresource (the API server allows nothing beside it).
        vec![rule("*", "*", &["*/*"], &["*"])],
        host_condition(),
        vec![Variable {
            name: "hostName".into(),
            expression: HOST_NAME.into(),
        }],
        vec![validation(
            &format!(
                "params.metadata.name != '{}' + variables.hostName",
                enrolment::RECORD_PREFIX
            ),
            &format!(
                "this host is revoked (its enrolment record {}<host name> in namespace {} says revoked=true): it may write nothing; an administrator deletes that record to bring the name back",
                enrolment::RECORD_PREFIX,
                labels::DEFAULT_HOST_LEASE_NAMESPACE
            ),
            "Forbidden",
        )],
    );
    if let Some(spec) = p.spec.as_mut() {
        spec.param_kind = Some(ParamKind {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
        });
    }
    p
}

/// The binding (same name, `validationActions: [Deny]`, all matched resources) of `policy`. A
/// policy with parameters ([`revoked_policy`]) gets the revoked enrolment records of the
/// provider's namespace ([`labels::DEFAULT_HOST_LEASE_NAMESPACE`]) as parameters, and none is
/// no refusal (`parameterNotFoundAction: Allow`).
pub fn binding(policy: &ValidatingAdmissionPolicy) -> ValidatingAdmissionPolicyBinding {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let has_params = policy.spec.as_ref().is_some_and(|s| s.param_kind.is_some());
    ValidatingAdmissionPolicyBinding {
        metadata: meta(&name),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(name),
            validation_actions: strings(&["Deny"]),
            param_ref: has_params.then(|| ParamRef {
                namespace: Some(labels::DEFAULT_HOST_LEASE_NAMESPACE.into()),
                selector: Some(LabelSelector {
                    match_labels: Some([(labels::REVOKED.to_string(), "true".to_string())].into()),
                    ..Default::default()
                }),
                parameter_not_found_action: Some("Allow".into()),
                name: None,
            }),
            ..Default::default()
        }),
    }
}

/// Every policy, in a stable order.
pub fn policies() -> Vec<ValidatingAdmissionPolicy> {
    vec![
        host_policy(),
        lease_policy(),
        event_policy(),
        template_policy(),
        revoked_policy(),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn host_rules_use_equality_and_match_only_hosts() {
        let p = host_policy();
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.match_conditions.unwrap()[0].expression,
            "request.userInfo.username.startsWith('byoh:host:')"
        );
        assert_eq!("byoh:host:".len(), 10);
        let exprs: Vec<String> = spec
            .validations
            .unwrap()
            .into_iter()
            .map(|v| v.expression)
            .collect();
        assert!(
            exprs
                .iter()
                .any(|e| e == "variables.objectName == variables.hostName")
        );
        // Names are compared for equality, never as substrings (label keys may be).
        let spec = host_policy().spec.unwrap();
        let names: Vec<&str> = spec
            .variables
            .iter()
            .flatten()
            .map(|v| v.expression.as_str())
            .chain(exprs.iter().map(String::as_str))
            .filter(|e| e.contains("Name") || e.contains("name"))
            .collect();
        assert!(names.len() >= 3, "{names:?}");
        assert!(!names.iter().any(|e| e.contains("contains(")), "{names:?}");
        assert!(exprs.iter().any(|e| e.contains(labels::MACHINE_NAME)));
        for f in SPEC_FIELDS {
            assert!(
                exprs
                    .iter()
                    .any(|e| e.contains(&format!("!has(object.spec.{f})"))),
                "{f}"
            );
        }
        assert!(
            exprs
                .iter()
                .any(|e| e.contains(&format!("'{}/'", labels::VETTED_DOMAIN)))
        );
        assert!(
            exprs
                .iter()
                .any(|e| e.contains(&format!("'{}/'", labels::BYOH_DOMAIN)))
        );
    }

    /// A new spec field must be added to [`SPEC_FIELDS`], or hosts could set it on CREATE.
    #[test]
    fn spec_fields_are_the_byohost_schema() {
        let crd = byoh_api::crds::all()
            .into_iter()
            .find(|c| c.spec.names.kind == "ByoHost")
            .unwrap();
        let schema = crd.spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap();
        let spec = &schema.properties.unwrap()["spec"];
        let mut have: Vec<String> = spec.properties.clone().unwrap().into_keys().collect();
        have.sort();
        let mut want: Vec<String> = SPEC_FIELDS.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(have, want);
    }

    #[test]
    fn only_the_revoked_policy_takes_parameters_the_revoked_records() {
        for p in policies() {
            let name = p.metadata.name.clone().unwrap();
            let takes = p.spec.as_ref().unwrap().param_kind.is_some();
            let param_ref = binding(&p).spec.unwrap().param_ref;
            assert_eq!(takes, name == REVOKED_POLICY, "{name}");
            assert_eq!(param_ref.is_some(), takes, "{name}");
        }
        let param_ref = binding(&revoked_policy()).spec.unwrap().param_ref.unwrap();
        assert_eq!(
            param_ref.parameter_not_found_action.as_deref(),
            Some("Allow")
        );
        assert_eq!(
            param_ref.selector.unwrap().match_labels.unwrap()[labels::REVOKED],
            "true"
        );
    }

    #[test]
    fn every_policy_has_a_deny_binding() {
        for p in policies() {
            let b = binding(&p);
            assert_eq!(b.metadata.name, p.metadata.name);
            assert_eq!(
                b.spec.unwrap().validation_actions.unwrap(),
                vec!["Deny".to_string()]
            );
        }
    }
}
