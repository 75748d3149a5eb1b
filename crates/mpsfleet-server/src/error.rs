//! API errors: one enum, one exhaustive mapping to HTTP status and stable code.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mpsfleet_store::StoreError;
use mpsfleet_types::api::{ErrorBody, FieldError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A task definition refused: the first error's field and message, and every error found
    /// (the first included, at most `MAX_ERRORS`), one per line in the message.
    #[error("{field}: {message}{}", further_lines(errors, *left_out))]
    InvalidTaskDefinition { field: String, message: String, errors: Vec<FieldError>, left_out: usize },
    #[error("{field}: {message}")]
    InvalidParameter { field: String, message: String },
    #[error("request body is not valid JSON: {0}")]
    MalformedBody(String),
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("this path does not take this method")]
    MethodNotAllowed,
    #[error("{kind} {id} already exists")]
    AlreadyExists { kind: &'static str, id: String },
    /// A registration names a GPU another host holds.
    #[error(
        "GPU {uuid} is already registered to host {host} ({hostname}); if that host does not exist, \
         `mpsfleet host forget {host}` frees its GPUs"
    )]
    GpuTaken { uuid: String, host: String, hostname: String },
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Conflict(String),
    #[error("state store unavailable: {0}")]
    StoreUnavailable(String),
    #[error("state store data is damaged: {0}")]
    StoreCorrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// Something the request needs (an agent, say) cannot be reached now.
    #[error("{0}")]
    Unavailable(String),
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
        ApiError::InvalidParameter { field: field.into(), message: message.into() }
    }

    pub fn not_found(kind: &'static str, id: impl ToString) -> Self {
        ApiError::NotFound { kind, id: id.to_string() }
    }

    /// The HTTP status and the stable code clients may match on.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidTaskDefinition { .. } => (StatusCode::BAD_REQUEST, "InvalidTaskDefinition"),
            ApiError::InvalidParameter { .. } => (StatusCode::BAD_REQUEST, "InvalidParameter"),
            ApiError::MalformedBody(_) => (StatusCode::BAD_REQUEST, "MalformedBody"),
            ApiError::NotFound { .. } => (StatusCode::NOT_FOUND, "NotFound"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            ApiError::AlreadyExists { .. } | ApiError::GpuTaken { .. } => {
                (StatusCode::CONFLICT, "AlreadyExists")
            }
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            ApiError::StoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "StoreUnavailable"),
            ApiError::StoreCorrupt(_) => (StatusCode::INTERNAL_SERVER_ERROR, "StoreCorrupt"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Internal"),
            ApiError::Unavailable(_) => (StatusCode::BAD_GATEWAY, "Unavailable"),
            ApiError::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"),
            ApiError::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "BodyTimeout"),
            ApiError::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
        }
    }

    pub fn body(&self) -> ErrorBody {
        let field = match self {
            ApiError::InvalidTaskDefinition { field, .. } | ApiError::InvalidParameter { field, .. } => {
                Some(field.clone())
            }
            _ => None,
        };
        let errors = match self {
            ApiError::InvalidTaskDefinition { errors, .. } => Box::new(errors.clone()),
            _ => Box::default(),
        };
        ErrorBody { code: self.status_and_code().1.to_string(), message: self.to_string(), field, errors }
    }
}

/// The errors after the first, one per line, and how many were left out.
fn further_lines(errors: &[FieldError], left_out: usize) -> String {
    let mut out = String::new();
    for e in errors.iter().skip(1) {
        out.push('\n');
        out.push_str(&e.field);
        out.push_str(": ");
        out.push_str(&e.message);
    }
    if left_out > 0 {
        let s = if left_out == 1 { "" } else { "s" };
        out.push_str(&format!("\nand {left_out} more error{s}"));
    }
    out
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { .. } => ApiError::Conflict(format!("{e}; retry the request")),
            StoreError::Corrupt { .. } => ApiError::StoreCorrupt(e.to_string()),
            _ => ApiError::StoreUnavailable(e.to_string()),
        }
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

    fn fe(field: &str, message: &str) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }

    #[test]
    fn a_task_definition_refused_for_several_errors_lists_them_all() {
        let one = ApiError::InvalidTaskDefinition {
            field: "family".into(),
            message: "is required".into(),
            errors: vec![fe("family", "is required")],
            left_out: 0,
        };
        // One error: the message as it always was.
        assert_eq!(one.body().message, "family: is required");
        assert_eq!(*one.body().errors, [fe("family", "is required")]);
        let json = serde_json::to_value(one.body()).unwrap();
        assert_eq!(json["field"], "family");

        let several = ApiError::InvalidTaskDefinition {
            field: "family".into(),
            message: "is required".into(),
            errors: vec![fe("family", "is required"), fe("x", "unknown field; valid names here: a, b")],
            left_out: 3,
        };
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
