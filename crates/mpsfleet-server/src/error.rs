//! API errors: the domain's [`Error`] and the HTTP layer's own, one enum, one exhaustive
//! mapping to HTTP status and stable code.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mpsfleet_store::StoreError;
use mpsfleet_types::api::ErrorBody;

pub use crate::cluster::Error;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// What the domain refused or failed, mapped to HTTP in [`ApiError::status_and_code`].
    #[error(transparent)]
    Domain(#[from] Error),
    #[error("request body is not valid JSON: {0}")]
    MalformedBody(String),
    #[error("this path does not take this method")]
    MethodNotAllowed,
    /// A request body longer than its route takes.
    #[error("request body too large: {route} takes at most {limit} bytes")]
    PayloadTooLarge { route: String, limit: usize },
    /// A request body that did not arrive within the body read timeout.
    #[error("request body not received within {timeout_ms} ms")]
    BodyTimeout { timeout_ms: u64 },
    /// A caller past its rate limit; answered with `Retry-After: {retry_after_s}`.
    #[error(
        "rate limit for {who} exceeded: at most {per_second} requests/s (burst {burst}); retry after {retry_after_s} s"
    )]
    TooManyRequests { who: String, per_second: u32, burst: u32, retry_after_s: u64 },
    /// A request the HTTP layer could not take (a bad header or content type, say).
    #[error("bad request: {0}")]
    BadRequest(String),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::invalid(field, message).into()
    }

    pub fn not_found(kind: &'static str, id: impl ToString) -> Self {
        Error::not_found(kind, id).into()
    }

    /// The domain error this is, if it is one.
    pub fn domain(&self) -> Option<&Error> {
        match self {
            ApiError::Domain(e) => Some(e),
            _ => None,
        }
    }

    /// The HTTP status and the stable code clients may match on: the one place an error
    /// becomes HTTP.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Domain(e) => {
                let status = match e {
                    Error::InvalidTaskDefinition { .. }
                    | Error::InvalidParameter { .. }
                    | Error::NeverFits { .. } => StatusCode::BAD_REQUEST,
                    Error::NotFound { .. } => StatusCode::NOT_FOUND,
                    Error::AlreadyExists { .. } | Error::GpuTaken { .. } | Error::Conflict(_) => {
                        StatusCode::CONFLICT
                    }
                    Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
                    Error::Forbidden(_) => StatusCode::FORBIDDEN,
                    Error::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                    Error::StoreCorrupt(_) | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
                    Error::Unavailable(_) => StatusCode::BAD_GATEWAY,
                };
                (status, e.code())
            }
            ApiError::MalformedBody(_) => (StatusCode::BAD_REQUEST, "MalformedBody"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            ApiError::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"),
            ApiError::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "BodyTimeout"),
            ApiError::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
        }
    }

    pub fn body(&self) -> ErrorBody {
        let (field, errors) = match self.domain() {
            Some(Error::InvalidTaskDefinition { field, errors, .. }) => {
                (Some(field.clone()), Box::new(errors.clone()))
            }
            Some(Error::InvalidParameter { field, .. } | Error::NeverFits { field, .. }) => {
                (Some(field.clone()), Box::default())
            }
            _ => (None, Box::default()),
        };
        ErrorBody { code: self.status_and_code().1.to_string(), message: self.to_string(), field, errors }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        (status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::api::FieldError;

    fn fe(field: &str, message: &str) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }

    #[test]
    fn a_task_definition_refused_for_several_errors_lists_them_all() {
        let one: ApiError = Error::InvalidTaskDefinition {
            field: "family".into(),
            message: "is required".into(),
            errors: vec![fe("family", "is required")],
            left_out: 0,
        }
        .into();
        // One error: the message as it always was.
        assert_eq!(one.body().message, "family: is required");
        assert_eq!(*one.body().errors, [fe("family", "is required")]);
        let json = serde_json::to_value(one.body()).unwrap();
        assert_eq!(json["field"], "family");

        let several: ApiError = Error::InvalidTaskDefinition {
            field: "family".into(),
            message: "is required".into(),
            errors: vec![fe("family", "is required"), fe("x", "unknown field; valid names here: a, b")],
            left_out: 3,
        }
        .into();
        let body = several.body();
        assert_eq!(body.code, "InvalidTaskDefinition");
        assert_eq!(body.field.as_deref(), Some("family"));
        assert_eq!(
            body.message,
            "family: is required\nx: unknown field; valid names here: a, b\nand 3 more errors"
        );
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["errors"][1]["field"], "x");
        assert_eq!(json["errors"].as_array().map(Vec::len), Some(2));
        // Other errors have no list.
        let other = ApiError::invalid("count", "must be 1").body();
        assert!(serde_json::to_value(other).unwrap().get("errors").is_none());
    }
}
