//! ECS's errors: `{"__type": "ClusterNotFoundException", "message": "..."}`, 400 but for
//! `ServerException` (500), which boto3 raises as the named exception. Every refusal of the
//! ECS-compatible API becomes one here, from the domain's [`Error`], the HTTP layer's
//! [`ApiError`] or a signature check's [`SigError`].

use crate::cluster::Error;
use crate::error::ApiError;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use mpsfleet_core::sigv4::SigError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EcsError {
    pub status: StatusCode,
    /// ECS's exception name, without a namespace.
    pub code: &'static str,
    pub message: String,
}

impl EcsError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        EcsError { status: StatusCode::BAD_REQUEST, code, message: message.into() }
    }

    pub fn client(message: impl Into<String>) -> Self {
        Self::new("ClientException", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("InvalidParameterException", message)
    }

    pub fn serialization(message: String) -> Self {
        Self::new("SerializationException", message)
    }

    /// ECS's own words, which scripts match on; the name asked for is in the request.
    pub fn cluster_not_found() -> Self {
        Self::new("ClusterNotFoundException", "Cluster not found.")
    }

    pub fn service_not_found(name: &str) -> Self {
        Self::new("ServiceNotFoundException", format!("Service not found: {name}"))
    }

    pub fn unsupported(op: &str) -> Self {
        Self::new(
            "UnsupportedFeatureException",
            format!(
                "{op} is not supported by mpsfleet's ECS-compatible API; docs/ecs-api.md lists the operations \
                 it serves"
            ),
        )
    }

    /// ECS Exec needs AWS Session Manager, which does not exist here: the way in is named.
    pub fn execute_command() -> Self {
        Self::new(
            "UnsupportedFeatureException",
            "ExecuteCommand needs AWS Session Manager, which mpsfleet does not run: use `mpsfleet task exec \
             TASK [-c CONTAINER] [-i] [-t] -- COMMAND` (a task must be started with enableExecuteCommand true)",
        )
    }

    /// A request field mpsfleet does not act on, refused rather than dropped.
    pub fn unsupported_field(field: &str) -> Self {
        Self::new(
            "UnsupportedFeatureException",
            format!("{field} is not supported by mpsfleet's ECS-compatible API (docs/ecs-api.md)"),
        )
    }

    pub fn unknown_operation(target: &str) -> Self {
        Self::new(
            "UnknownOperationException",
            format!("X-Amz-Target {target:?} names no operation of AmazonEC2ContainerServiceV20141113"),
        )
    }

    pub fn missing_token() -> Self {
        Self::new("MissingAuthenticationTokenException", "Missing Authentication Token")
    }

    pub fn unknown_key() -> Self {
        Self::new("UnrecognizedClientException", "The security token included in the request is invalid.")
    }

    pub fn expired_key(why: &str) -> Self {
        Self::new(
            "ExpiredTokenException",
            format!("The security token included in the request is expired: {why}"),
        )
    }

    fn body(&self) -> String {
        serde_json::json!({ "__type": self.code, "message": self.message }).to_string()
    }
}

impl std::fmt::Display for EcsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl IntoResponse for EcsError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, error = %self.message, "ECS call failed");
        }
        (self.status, [(header::CONTENT_TYPE, super::CONTENT_TYPE)], self.body()).into_response()
    }
}

impl From<Error> for EcsError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidTaskDefinition { .. }
            | Error::InvalidParameter { .. }
            | Error::NeverFits { .. } => Self::invalid(message),
            Error::NotFound { kind: "pool", .. } => Self::cluster_not_found(),
            Error::NotFound { kind: "service", id } => Self::service_not_found(&id),
            Error::NotFound { kind: "task definition", .. } => {
                Self::client("Unable to describe task definition.")
            }
            Error::NotFound { .. } => Self::invalid(message),
            Error::AlreadyExists { .. } | Error::GpuTaken { .. } | Error::Conflict(_) => {
                Self::client(message)
            }
            Error::Unauthorized(_) => Self::unknown_key(),
            Error::Forbidden(_) => Self::new("AccessDeniedException", message),
            Error::StoreUnavailable(_)
            | Error::StoreCorrupt(_)
            | Error::Internal(_)
            | Error::Unavailable(_) => {
                EcsError { status: StatusCode::INTERNAL_SERVER_ERROR, code: "ServerException", message }
            }
        }
    }
}

impl From<ApiError> for EcsError {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::Domain(d) => d.into(),
            ApiError::TooManyRequests { .. } => Self::new("ThrottlingException", message),
            ApiError::PayloadTooLarge { .. } | ApiError::BodyTimeout { .. } | ApiError::BadRequest(_) => {
                Self::client(message)
            }
            ApiError::MalformedBody(_) => Self::serialization(message),
            ApiError::MethodNotAllowed => Self::client(message),
        }
    }
}

impl From<SigError> for EcsError {
    fn from(e: SigError) -> Self {
        let message = e.to_string();
        match e {
            SigError::Missing => Self::missing_token(),
            SigError::Incomplete(_) | SigError::Headers(_) | SigError::BadDate(_) => {
                Self::new("IncompleteSignatureException", message)
            }
            SigError::Expired(_) | SigError::Scope(_) | SigError::Mismatch => {
                Self::new("InvalidSignatureException", message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_domain_refusal_has_its_ecs_name() {
        let of = |e: Error| EcsError::from(e).code;
        assert_eq!(of(Error::not_found("pool", "a")), "ClusterNotFoundException");
        assert_eq!(of(Error::not_found("service", "a")), "ServiceNotFoundException");
        assert_eq!(of(Error::invalid("count", "x")), "InvalidParameterException");
        assert_eq!(of(Error::Forbidden("no".into())), "AccessDeniedException");
        assert_eq!(of(Error::Conflict("no".into())), "ClientException");
        let server = EcsError::from(Error::Internal("x".into()));
        assert_eq!((server.status, server.code), (StatusCode::INTERNAL_SERVER_ERROR, "ServerException"));
        assert_eq!(EcsError::from(SigError::Mismatch).code, "InvalidSignatureException");
        let body: serde_json::Value =
            serde_json::from_str(&EcsError::unsupported("CreateTaskSet").body()).unwrap();
        assert_eq!(body["__type"], "UnsupportedFeatureException");
        assert!(body["message"].as_str().unwrap().contains("CreateTaskSet"));
    }
}
