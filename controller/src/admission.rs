//! ValidatingAdmissionPolicies (CEL) generated for the components.
