//! [`FieldError`]: what is wrong with one field of the configuration or of an API request body,
//! named by its dotted path. Each section checks its own fields; whoever holds the section puts
//! its name in front ([`FieldError::within`]), so `url` becomes `workers[2].url`.

use bch_core::policy::PolicyError;

/// One field's problem: `field: message`, e.g. `workers[2].url: "ftp://x" is not http`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Dotted path of the field, e.g. `policy.max_load_skew`, `workers[2].url`,
    /// `server.control_allowed_hosts[0]`; relative to whoever reports it.
    pub field: String,
    /// What is wrong, for the operator.
    pub message: String,
}

impl FieldError {
    /// `field` (its path within the section that checks it) is wrong because of `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same problem, its field seen from the section `parent` holding it: `url` within
    /// `workers[2]` is `workers[2].url`.
    pub fn within(mut self, parent: &str) -> Self {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

impl From<PolicyError> for FieldError {
    /// The policy field the error names (`max_load_skew`, `virtual_nodes`, …), as in `[policy]`.
    fn from(error: PolicyError) -> Self {
        FieldError::new(error.field(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_prefixes_the_dotted_path() {
        let error = FieldError::new("url", "bad").within("workers[2]");
        assert_eq!(error.to_string(), "workers[2].url: bad");
        let listed = FieldError::new("control_allowed_hosts[0]", "x").within("server");
        assert_eq!(listed.field, "server.control_allowed_hosts[0]");
        let policy = FieldError::from(PolicyError::InvalidVirtualNodes(0)).within("policy");
        assert_eq!(policy.field, "policy.virtual_nodes");
    }
}
