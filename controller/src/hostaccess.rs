//! Per-host least privilege: Role/RoleBinding per ByoHost with resourceNames.
